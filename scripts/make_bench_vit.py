#!/usr/bin/env python3
"""A Hugging Face ViTForImageClassification folder with random weights, for `qkv bench vit --model DIR` against
transformers (scripts/bench_vit_hf_peer.py).

No checkpoint can be downloaded here, so the model is made locally (seeded) in the shape of Google's
vit-base-patch16-224 (224 x 224 RGB pictures in 16 x 16 patches: 196 patches and the class token, d_model 768,
12 heads of 64, 12 layers, MLP 3072, 1,000 classes; 86.6 M parameters, 346 MB in float32), or of its smaller
siblings with --size. Speed does not depend on the weights' values. The folder gets config.json, model.safetensors
and the processor's preprocessor_config.json (ImageNet's 0.5 mean and std, as the original's).

Usage: make_bench_vit.py --out DIR [--size base|small|tiny] [--seed 0]
Needs torch, transformers and safetensors.
"""
import argparse
import json
import os

import torch
from transformers import ViTConfig, ViTForImageClassification

SIZES = {  # hidden size, heads, layers (MLP 4x): ViT-B/16, and DeiT's small and tiny shapes
    "base": (768, 12, 12),
    "small": (384, 6, 12),
    "tiny": (192, 3, 12),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--size", choices=sorted(SIZES), default="base")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    d, heads, layers = SIZES[a.size]
    torch.manual_seed(a.seed)
    config = ViTConfig(hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers, intermediate_size=4 * d,
                       image_size=224, patch_size=16, num_channels=3, num_labels=1000)
    model = ViTForImageClassification(config).eval()
    model.save_pretrained(a.out, safe_serialization=True)
    processor = {"do_resize": True, "size": {"height": 224, "width": 224}, "resample": 2, "do_rescale": True,
                 "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
                 "image_std": [0.5, 0.5, 0.5], "image_processor_type": "ViTImageProcessor"}
    with open(os.path.join(a.out, "preprocessor_config.json"), "w", encoding="utf-8") as f:
        json.dump(processor, f, indent=2)
    print(f"{a.out}: ViT-{a.size}/16 at 224, {sum(t.numel() for t in model.parameters()):,} parameters")


if __name__ == "__main__":
    main()
