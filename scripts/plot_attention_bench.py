#!/usr/bin/env python3
"""Log-log picture of `qkv bench attention --json`: time and peak memory vs N.

Usage: build/release/qkv bench attention --json > attention.json
       python3 scripts/plot_attention_bench.py attention.json docs/images/attention_scaling.png
Needs matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    d = json.load(open(src))
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    styles = {"flash": ("C0", "o"), "naive": ("C3", "s"), "torch": ("C2", "^")}
    for impl, (color, marker) in styles.items():
        rows = sorted((r for r in d["rows"] if r["impl"] == impl), key=lambda r: r["n"])
        if not rows:
            continue
        n = [r["n"] for r in rows]
        label = {"flash": "qkv flash", "naive": "qkv naive", "torch": f"PyTorch {d.get('torch') or ''}"}[impl]
        ax_t.loglog(n, [r["fwd_bwd_ms"] for r in rows], marker=marker, color=color, label=label, base=2)
        ax_m.loglog(n, [r["peak_extra_bytes"] / 2**20 for r in rows], marker=marker, color=color, label=label, base=2)
    ax_t.set(xlabel="sequence length N", ylabel="forward + backward (ms)", title="time: O(N^2) for all")
    ax_m.set(xlabel="sequence length N", ylabel="peak extra memory (MiB)",
             title="memory: flash O(N), naive O(N^2)")
    for ax in (ax_t, ax_m):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"attention, batch 1, H = {d['heads']}, Dh = {d['head_dim']}, {d['threads']} threads"
                 + (", causal" if d.get("causal") else ""))
    fig.tight_layout()
    fig.savefig(dst, dpi=90)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
