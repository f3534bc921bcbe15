#!/usr/bin/env python3
"""The peer of `qkv bench vit --model DIR`: transformers' image classifier of the same folder on the same pixels.

Loads DIR with AutoModelForImageClassification in float32 (a ViTForImageClassification or DeiT folder), reads the
pixels qkv wrote (--pixels, a safetensors file with one tensor "pixels" [B, C, H, W], already normalized), runs the
whole batch once to warm up, then --calls times under torch.inference_mode() on --threads PyTorch threads.
Prints one JSON object: {"transformers": version, "torch": version, "attention": the attention implementation,
"threads": n, "images_per_s": the best call's, "first": the logits of the first --first images} or {"error": "why"}.

Usage: bench_vit_hf_peer.py --model DIR --pixels FILE --threads N [--calls 5] [--first 4]
"""
import argparse
import json
import os
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--pixels", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--first", type=int, default=4)
    a = p.parse_args()
    try:
        import torch
        import transformers
        from safetensors.torch import load_file
    except ImportError as e:
        print(json.dumps({"error": f"torch, transformers and safetensors are needed ({e})"}))
        return 0
    try:
        with open(os.path.join(a.model, "config.json"), encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError) as e:
        print(json.dumps({"error": f"{a.model} has no readable config.json ({e})"}))
        return 0
    if not model_type:
        print(json.dumps({"error": f"{a.model} is not a Hugging Face folder (its config.json names no model_type)"}))
        return 0
    torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForImageClassification.from_pretrained(a.model, torch_dtype=torch.float32).eval()
    pixels = load_file(a.pixels)["pixels"]
    with torch.inference_mode():
        first = model(pixel_values=pixels).logits[:a.first]
        best = float("inf")
        for _ in range(max(1, a.calls)):
            t0 = time.perf_counter()
            model(pixel_values=pixels)
            best = min(best, time.perf_counter() - t0)
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                      "attention": getattr(model.config, "_attn_implementation", None) or "eager",
                      "threads": torch.get_num_threads(), "images_per_s": pixels.shape[0] / best,
                      "first": first.tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
