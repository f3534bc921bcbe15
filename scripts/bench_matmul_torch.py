#!/usr/bin/env python3
"""torch.matmul on the shapes of `qkv bench ops`, for its peer column.

Each shape is "batch,m,n,k,linear": batch x [m,k] @ [k,n], or with linear=1
x [m,k] @ W^T with W [n,k] as nn.Linear does (F.linear). Timing as qkv's:
best of 5 rounds, each of enough calls to last --seconds. Prints one JSON
object: {"torch": version, "threads": n, "blas": "...", "rows": [{"shape", "gflops"}]}

--dtype bfloat16 runs the same products on bfloat16 tensors (oneDNN, on AMX
tiles where the CPU has them).

Usage: bench_matmul_torch.py --threads 2 [--seconds 0.2] [--dtype bfloat16] --shapes 1,256,256,256,0 ...
"""
import argparse
import json
import time


def best_seconds(f, seconds):
    f()
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        if time.perf_counter() - t0 >= seconds / 4 or calls >= 1 << 20:
            break
        calls *= 2
    best = 1e30
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=0.2)
    p.add_argument("--shapes", nargs="+", required=True)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for s in args.shapes:
            batch, m, n, k, lin = (int(v) for v in s.split(","))
            a = torch.randn(batch, m, k, generator=g).to(dtype)
            if lin:
                w = torch.randn(n, k, generator=g).to(dtype)
                a2 = a.reshape(batch * m, k)
                f = lambda: F.linear(a2, w)
            else:
                b = torch.randn(batch, k, n, generator=g).to(dtype)
                f = lambda: torch.matmul(a, b)
            t = best_seconds(f, args.seconds)
            rows.append({"shape": s, "gflops": 2.0 * batch * m * n * k / t / 1e9})
    blas = "mkl" if torch.backends.mkl.is_available() else "other"
    print(json.dumps({"torch": torch.__version__, "dtype": args.dtype, "threads": torch.get_num_threads(), "blas": blas, "rows": rows}))


if __name__ == "__main__":
    main()
