#!/usr/bin/env python3
"""Writes tiny random-weight Hugging Face model folders and what transformers
computes with them (tests/fixtures/hf/), for qkv's parity tests.

Each folder is what `save_pretrained` writes (config.json, model.safetensors,
generation_config.json), from a fixed seed; next to it, NAME.expected.safetensors
holds the input ids, transformers' logits for them (float32) and 16 greedy
tokens continuing them (argmax at each step, as qkv's greedy decoding does).

  llama  LlamaForCausalLM: GQA (4 heads, 2 key/value heads), rope_theta 500000,
         untied head, float32 on disk
  qwen2  Qwen2ForCausalLM: q/k/v bias without o bias, tied embeddings, an
         explicit head_dim, bfloat16 on disk (the logits are of the bfloat16
         weights, computed in float32)

Usage: python3 scripts/make_hf_fixtures.py [--out tests/fixtures/hf]
Needs: torch, transformers, safetensors (pip install torch transformers safetensors).
"""
import argparse
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.2,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)


def build(name):
    torch.manual_seed(0)
    if name == "llama":
        config = LlamaConfig(**COMMON, rope_theta=500000.0, tie_word_embeddings=False)
        return LlamaForCausalLM(config), torch.float32
    config = Qwen2Config(**COMMON, head_dim=12, rope_theta=1000000.0, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config), torch.bfloat16


def make(name, out_dir):
    model, dtype = build(name)
    folder = os.path.join(out_dir, name)
    model.to(dtype).save_pretrained(folder)
    # The reference is the folder as transformers loads it in float32 (the
    # bfloat16 weights widened exactly). Not the model above moved back to
    # float32: its rotary inv_freq buffer went through bfloat16 as well.
    model = type(model).from_pretrained(folder, dtype=torch.float32)
    model.eval()
    ids = torch.tensor([[1, 17, 5, 63, 40, 8, 95, 22, 3, 51, 11, 70]])
    with torch.no_grad():
        logits = model(ids).logits
        seq = ids.clone()
        for _ in range(16):
            nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    save_file({"ids": ids, "logits": logits.contiguous(), "greedy": seq[:, ids.size(1):].contiguous()},
              os.path.join(out_dir, name + ".expected.safetensors"))
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, {dtype} on disk")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in ("llama", "qwen2"):
        make(name, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
