#!/usr/bin/env python3
"""PyTorch's nn.Transformer on the shapes of `qkv bench train`, for the side-by-side figure.

The reference translation model: d_model 256, 4 heads, 3 encoder + 3 decoder
layers, dim_feedforward 1024, vocabulary 8000 (one embedding shared by source,
target and the output projection), dropout 0.1, Post-Norm (nn.Transformer's
default), label smoothing 0.1, AdamW; batches of 64 sentences of 32 source +
32 target tokens of random ids. --precision bf16 runs the forward and the
loss under torch.autocast("cpu", dtype=torch.bfloat16) (mixed precision). Prints one JSON object:
{"torch": version, "threads": n, "steps": n, "seconds_per_step": x, "tokens_per_s": x, "target_tokens_per_s": x}

Usage: bench_train_torch.py [--threads 2] [--steps 5] [--precision f32|bf16]
"""
import argparse
import contextlib
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Translator(nn.Module):
    def __init__(self, vocab, d, heads, layers, ff, dropout):
        super().__init__()
        self.d = d
        self.embed = nn.Embedding(vocab, d)
        self.transformer = nn.Transformer(d, heads, layers, layers, ff, dropout, batch_first=True)
        pe = torch.zeros(512, d)
        pos = torch.arange(512)[:, None]
        div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe)

    def forward(self, src, tgt_in, src_pad, tgt_mask):
        s = self.embed(src) * math.sqrt(self.d) + self.pe[: src.shape[1]]
        t = self.embed(tgt_in) * math.sqrt(self.d) + self.pe[: tgt_in.shape[1]]
        h = self.transformer(s, t, tgt_mask=tgt_mask, src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad)
        return h @ self.embed.weight.t()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                    help="bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    mixed = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" else contextlib.nullcontext
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    B, S, T, V = 64, 32, 32, 8000
    model = Translator(V, 256, 4, 3, 1024, 0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    src = torch.randint(4, V, (B, S))
    tgt = torch.randint(4, V, (B, T + 1))
    src_pad = torch.zeros(B, S, dtype=torch.bool)
    mask = nn.Transformer.generate_square_subsequent_mask(T)

    def step():
        opt.zero_grad()
        with mixed():
            logits = model(src, tgt[:, :-1], src_pad, mask)
            loss = F.cross_entropy(logits.reshape(-1, V), tgt[:, 1:].reshape(-1), label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    model.train()
    step()
    step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    per_step = (time.perf_counter() - t0) / a.steps
    print(json.dumps({"torch": torch.__version__, "threads": a.threads, "steps": a.steps, "precision": a.precision,
                      "seconds_per_step": per_step, "tokens_per_s": B * (S + T) / per_step,
                      "target_tokens_per_s": B * T / per_step}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
