#!/usr/bin/env python3
"""Step time and scaling efficiency of data-parallel training of lm-100m,
predicted from a measured compute rate and a ring all-reduce cost model
(docs/distributed.md). No dependencies; every input is a flag.

  ring all-reduce of G bytes over N ranks at B bytes/s, latency a per message:
    T_ar = 2 (N - 1) / N * G / B  +  buckets * 2 (N - 1) * a
  the buckets start during backward (about 2/3 of the compute), so the
  exposed part is what backward cannot hide, and at least the last bucket:
    exposed = max(T_ar - 2/3 T_compute, T_ar / buckets)
  efficiency = T_compute / (T_compute + exposed)
"""
import argparse
import math


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parameters", type=float, default=97.3e6, help="lm-100m (docs/benchmarks.md)")
    p.add_argument("--tokens-per-s", type=float, required=True,
                   help="measured training tokens/s of one rank (one machine) for this model")
    p.add_argument("--per-rank-tokens", type=int, default=16 * 1024, help="weak scaling: the config's batch per rank")
    p.add_argument("--global-tokens", type=int, default=512 * 1024,
                   help="strong scaling: a fixed global batch (0.5M tokens, GPT-3 Small's)")
    p.add_argument("--bucket-mb", type=float, default=4.0, help="GradientReducer's bucket (src/train)")
    p.add_argument("--latency-us", type=float, default=20.0, help="per message, TCP on Ethernet")
    p.add_argument("--speedup", type=float, default=1.0, help="a rank this many times faster than measured")
    a = p.parse_args()
    grad_bytes = 4 * a.parameters
    buckets = math.ceil(grad_bytes / (a.bucket_mb * 2**20))
    rate = a.tokens_per_s * a.speedup
    print(f"gradients {grad_bytes / 1e6:.0f} MB in {buckets} buckets of {a.bucket_mb:g} MiB; "
          f"a rank trains {rate:,.0f} tokens/s; latency {a.latency_us:g} us per message")
    print("| scaling | link | ranks | tokens per rank | compute s | all-reduce s | exposed s | step s | efficiency |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in ("weak", "strong"):
        for gbit in (25, 100):
            bandwidth = gbit * 1e9 / 8
            for n in (8, 64, 512):
                tokens = a.per_rank_tokens if mode == "weak" else a.global_tokens / n
                compute = tokens / rate
                allreduce = 2 * (n - 1) / n * grad_bytes / bandwidth + buckets * 2 * (n - 1) * a.latency_us * 1e-6
                exposed = max(allreduce - 2 / 3 * compute, allreduce / buckets)
                step = compute + exposed
                print(f"| {mode} | {gbit} Gbit/s | {n} | {tokens:,.0f} | {compute:.3g} | {allreduce:.3g} | "
                      f"{exposed:.3g} | {step:.3g} | {compute / step:.0%} |")


if __name__ == "__main__":
    main()
