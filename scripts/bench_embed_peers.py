#!/usr/bin/env python3
"""The peer of `qkv bench embed --model DIR`: sentence-transformers' encode() on the same folder and sentences.

Reads the sentences (one per line of --sentences), encodes them all once to warm up, then --rounds times, each in
batches of --batch (encode() sorts them by length first, as qkv does), on --threads PyTorch threads in float32.
Prints one JSON object: {"peer": "sentence-transformers", "version": ..., "torch": ..., "threads": n,
"sentences_per_s": best round, "first": the vectors of the first --first sentences} or {"error": "why"}.

Usage: bench_embed_peers.py --model DIR --sentences FILE --threads N [--batch 32] [--rounds 3] [--first 8]
"""
import argparse
import json
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--sentences", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--first", type=int, default=8)
    a = p.parse_args()
    try:
        import torch
        import sentence_transformers
    except ImportError as e:
        print(json.dumps({"error": f"sentence-transformers is not installed ({e})"}))
        return 0
    torch.set_num_threads(a.threads)
    with open(a.sentences, encoding="utf-8") as f:
        sentences = f.read().split("\n")[:-1]
    model = sentence_transformers.SentenceTransformer(a.model, device="cpu")
    first = model.encode(sentences, batch_size=a.batch)[:a.first]
    best = float("inf")
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        model.encode(sentences, batch_size=a.batch)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"peer": "sentence-transformers", "version": sentence_transformers.__version__,
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "sentences_per_s": len(sentences) / best, "first": first.tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
