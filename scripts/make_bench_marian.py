#!/usr/bin/env python3
"""A Hugging Face MarianMTModel folder with random weights, for `qkv bench decode --model DIR` against
CTranslate2 and transformers (scripts/bench_translate_peers.py).

No checkpoint can be downloaded here, so the model is made locally in the shape of qkv's reference
translation Transformer (d_model 256, 4 heads, 3 + 3 layers, MLP 1024, vocabulary 8000; the shape `qkv bench
train` uses), laid out as the Helsinki-NLP opus-mt folders are: swish, scale_embedding, one shared vocab.json
for source.spm and target.spm (one SentencePiece Unigram model trained on a generated text of pseudo-words),
</s> 0, <pad> last and the decoder's start. Speed does not depend on the weights' values. DIR/sources.txt
gets the sentences to translate: 500 lines of the same kind of text, from another seed.

Usage: make_bench_marian.py --out DIR [--sentences 500] [--seed 0]
Needs torch, transformers, safetensors and sentencepiece.
"""
import argparse
import json
import os
import random
import shutil
import tempfile

import sentencepiece as spm
import torch
from transformers import MarianConfig, MarianMTModel

VOCAB = 8000


def pseudo_text(lines, seed):
    """Lines of pseudo-words over a small alphabet: enough distinct pieces for thousands of Unigram entries."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + list("aeiou")
    return [" ".join("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
                     for _ in range(rng.randint(4, 14))) + "." for _ in range(lines)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sentences", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        with open(text, "w", encoding="utf-8") as f:
            f.write("\n".join(pseudo_text(40000, args.seed)) + "\n")
        # SentencePiece's own <unk>, <s>, </s> plus the pieces: VOCAB - 3 + 3 with <pad> and Marian's </s>, <unk>.
        spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(tmp, "spm"), vocab_size=VOCAB,
                                       model_type="unigram", num_threads=1, minloglevel=2)
        shutil.copyfile(os.path.join(tmp, "spm.model"), os.path.join(args.out, "source.spm"))
        shutil.copyfile(os.path.join(tmp, "spm.model"), os.path.join(args.out, "target.spm"))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.out, "source.spm"))
    pieces = ["</s>", "<unk>"] + [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                                  if not sp.is_control(i) and not sp.is_unknown(i)] + ["<pad>"]
    with open(os.path.join(args.out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({p: i for i, p in enumerate(pieces)}, f, ensure_ascii=False)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "MarianTokenizer", "eos_token": "</s>", "unk_token": "<unk>",
                   "pad_token": "<pad>", "model_max_length": 512, "separate_vocabs": False}, f)
    V, pad = len(pieces), len(pieces) - 1
    config = MarianConfig(vocab_size=V, decoder_vocab_size=V, max_position_embeddings=512, d_model=256,
                          encoder_layers=3, decoder_layers=3, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
                          encoder_attention_heads=4, decoder_attention_heads=4, activation_function="swish",
                          scale_embedding=True, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
                          forced_eos_token_id=0, share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    torch.manual_seed(args.seed)
    model = MarianMTModel(config).eval()
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.num_beams = 1
    model.save_pretrained(args.out)
    with open(os.path.join(args.out, "sources.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(pseudo_text(args.sentences, args.seed + 1)) + "\n")
    print(json.dumps({"out": args.out, "params": sum(p.numel() for p in model.parameters()), "vocab": V}))


if __name__ == "__main__":
    main()
