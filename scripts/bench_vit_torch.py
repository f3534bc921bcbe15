#!/usr/bin/env python3
"""The Vision Transformer of `qkv bench vit` in PyTorch, for the side-by-side figure.

The model of configs/vit-fashion-mnist.json, its sizes given by `qkv bench vit`
as flags (defaults: 28x28 grayscale images cut into 7x7 patches, the patch
embedding a Conv2d of stride 7; learned positions; d_model 128, 4 heads,
4 Pre-Norm nn.TransformerEncoderLayer blocks with GELU and dim_feedforward
384; final LayerNorm, mean pooling, 10 classes). Training: cross-entropy with label smoothing 0.1, AdamW, batches
of 128 random images; inference: batches of 256 in eval mode without
gradients. --precision bf16 runs both forwards (and the loss) under
torch.autocast("cpu", dtype=torch.bfloat16). Prints one JSON object:
{"torch": version, "threads": n, "parameters": n, "train_images_per_s": x, "infer_images_per_s": x}

Usage: bench_vit_torch.py [--threads 2] [--steps 10] [--image 28] [--patch 7]
         [--channels 1] [--d-model 128] [--heads 4] [--layers 4] [--ff 384] [--classes 10]
         [--precision f32|bf16]
"""
import argparse
import contextlib
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class ViT(nn.Module):
    def __init__(self, image=28, patch=7, channels=1, d=128, heads=4, layers=4, ff=384, classes=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(channels, d, patch, stride=patch)
        self.pos_embed = nn.Parameter(0.02 * torch.randn((image // patch) ** 2, d))
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                                               batch_first=True, norm_first=True)
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        z = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        for b in self.blocks:
            z = b(z)
        return self.head(self.norm(z).mean(1))


def best_seconds(f, calls):
    f()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                    help="bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--image", type=int, default=28)
    ap.add_argument("--patch", type=int, default=7)
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ff", type=int, default=384)
    ap.add_argument("--classes", type=int, default=10)
    args = ap.parse_args()
    mixed = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16" else contextlib.nullcontext
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ViT(args.image, args.patch, args.channels, args.d_model, args.heads, args.layers, args.ff, args.classes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    shape = (args.channels, args.image, args.image)
    x, y = torch.randn(128, *shape), torch.randint(0, args.classes, (128,))

    def train_step():
        opt.zero_grad(set_to_none=True)
        with mixed():
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    model.train()
    train_s = best_seconds(train_step, args.steps)
    model.eval()
    xi = torch.randn(256, *shape)

    def infer():
        with torch.no_grad(), mixed():
            model(xi)

    infer_s = best_seconds(infer, args.steps)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "train_images_per_s": 128 / train_s, "infer_images_per_s": 256 / infer_s}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
