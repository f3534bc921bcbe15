#!/usr/bin/env python3
"""PyTorch's attention on the shapes of `qkv bench attention`, for the side-by-side table.

For each N: q, k, v [1, H, N, Dh] float32; forward time, forward + backward
time (best of several runs), and peak extra memory (the process's peak RSS
growth, measured in a fresh subprocess per N); with --autocast, under
torch.autocast("cpu", dtype=torch.bfloat16) (q, k, v stay float32 leaves, as
in a mixed-precision training step). Prints one JSON object:
{"torch": "<version>", "impl": "...", "rows": [{"n", "fwd_ms", "fwd_bwd_ms", "peak_extra_bytes"}]}

Usage: bench_attention_torch.py --n 256 512 ... [--heads 8] [--head-dim 64] [--threads 2] [--causal] [--autocast]
"""
import argparse
import json
import resource
import subprocess
import sys
import time


def rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def one(n, heads, head_dim, threads, causal, seconds, autocast=False):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    def attend(q, k, v):
        if autocast:  # mixed precision as a training step runs it: bf16 products, float32 leaves
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return attend_f32(q, k, v)
        return attend_f32(q, k, v)

    def attend_f32(q, k, v):
        if sdpa is not None:
            return sdpa(q, k, v, is_causal=causal)
        s = q @ k.transpose(-1, -2) / head_dim ** 0.5  # the core of nn.MultiheadAttention
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return s.softmax(-1) @ v

    g = torch.Generator().manual_seed(0)
    q, k, v = [torch.randn(1, heads, n, head_dim, generator=g).requires_grad_(True) for _ in range(3)]
    r = torch.randn(1, heads, n, head_dim, generator=g)
    base = rss_bytes()

    def fwd():
        with torch.no_grad():
            attend(q, k, v)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        (attend(q, k, v) * r).sum().backward()

    def best(f):
        f()
        calls, t = 1, 0.0
        while True:
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            t = time.perf_counter() - t0
            if t >= seconds / 4 or calls >= 1024:
                break
            calls *= 2
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            times.append((time.perf_counter() - t0) / calls)
        return min(times)

    fwd_s = best(fwd)
    fwd_bwd_s = best(fwd_bwd)
    return {"n": n, "fwd_ms": fwd_s * 1e3, "fwd_bwd_ms": fwd_bwd_s * 1e3,
            "peak_extra_bytes": max(0, rss_bytes() - base),
            "impl": "scaled_dot_product_attention" if sdpa is not None else "matmul-softmax-matmul"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", required=True)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--autocast", action="store_true", help="under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.n[0], a.heads, a.head_dim, a.threads, a.causal, a.seconds, a.autocast)))
        return 0
    import torch
    rows = []
    for n in a.n:
        cmd = [sys.executable, __file__, "--one", "--n", str(n), "--heads", str(a.heads), "--head-dim",
               str(a.head_dim), "--threads", str(a.threads), "--seconds", str(a.seconds)] + (["--causal"] if a.causal else []) + \
              (["--autocast"] if a.autocast else [])
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    print(json.dumps({"torch": torch.__version__, "impl": rows[0]["impl"] if rows else "", "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
