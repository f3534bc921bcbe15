#!/usr/bin/env python3
"""A Hugging Face Llama folder with random weights in the shape of a qkv decoder recipe, for benchmarks.

No checkpoint can be downloaded here, so the models that `qkv bench generate --model DIR` times against
transformers and llama.cpp are made locally: LlamaForCausalLM with the recipe's width, depth, heads, MLP width,
vocabulary and context (configs/lm-20m.json, configs/lm-100m.json), its weights drawn by transformers'
own initializer from a fixed seed, saved as transformers saves it (config.json, model.safetensors), with a
SentencePiece BPE tokenizer of the recipe's vocabulary size trained on a generated text (tokenizer.model, which
llama.cpp's convert_hf_to_gguf.py reads). Speed does not depend on the weights' values.

Usage: make_bench_llama.py --recipe configs/lm-20m.json --out DIR [--seed 0] [--dtype bfloat16]
Needs torch, transformers, safetensors and sentencepiece.
"""
import argparse
import json
import os
import random
import tempfile

import sentencepiece as spm
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def training_text(path, lines=20000, seed=0):
    """Lines of pseudo-words over a small alphabet: enough distinct pairs for thousands of BPE merges."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + list("aeiou")
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(lines):
            words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(4, 14))]
            f.write(" ".join(words) + ".\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", required=True, help="a qkv decoder config (configs/lm-20m.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the dtype the weights are saved in (pretrained checkpoints ship in bfloat16)")
    args = ap.parse_args()
    recipe = json.load(open(args.recipe))
    vocab = recipe["tokenizer"]["vocab_size"]
    heads = recipe["nhead"]
    config = LlamaConfig(vocab_size=vocab, hidden_size=recipe["d_model"], intermediate_size=recipe["dim_feedforward"],
                         num_hidden_layers=recipe["num_layers"], num_attention_heads=heads,
                         num_key_value_heads=recipe.get("num_kv_heads") or heads,
                         max_position_embeddings=recipe["context"], rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=recipe.get("tie_output", True), bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).eval().to(getattr(torch, args.dtype))
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        training_text(text, seed=args.seed)
        spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(args.out, "tokenizer"), vocab_size=vocab,
                                       model_type="bpe", pad_id=0, bos_id=1, eos_id=2, unk_id=3,
                                       hard_vocab_limit=False, num_threads=1, minloglevel=2)
    os.remove(os.path.join(args.out, "tokenizer.vocab"))
    print(json.dumps({"out": args.out, "params": sum(p.numel() for p in model.parameters()), "vocab": vocab}))


if __name__ == "__main__":
    main()
