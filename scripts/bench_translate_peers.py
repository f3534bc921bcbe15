#!/usr/bin/env python3
"""The peers of `qkv bench decode --model DIR` for a Hugging Face MarianMTModel folder: CTranslate2 on the
folder converted by its own Transformers converter, and transformers itself.

Each peer translates the lines of SOURCES (tokenized first, outside the timing, by the folder's
MarianTokenizer, as qkv tokenizes before it times) in batches of BATCH sentences, greedy and with beam 4, up
to MAX_LEN target tokens, after a warm-up batch, and counts the target tokens it made (</s> not counted).
Prints one JSON object:
{"peer": ..., "version": ..., "threads": n, "rows": [{"mode": "greedy"|"beam 4", "seconds": s,
  "target_tokens": n, "first": [ids of the first sentence]}]}
or {"error": "why"} when the peer cannot run (not installed, conversion failed).

  --peer ctranslate2 --type T    T: float32 or int8 (CTranslate2's compute types); the converted model is
                                 kept in DIR/ctranslate2-T
  --peer transformers            MarianMTModel.generate in float32 (do_sample off, num_beams 1 or 4)

Usage: bench_translate_peers.py --model DIR --sources FILE --peer P [--type T] --batch 32 --max-len 32
                                --threads N
"""
import argparse
import json
import os
import sys
import time


def batches(items, n):
    return [items[i:i + n] for i in range(0, len(items), n)]


def run_ctranslate2(args, tok, sources):
    try:
        import ctranslate2
    except ImportError as e:
        return {"error": f"ctranslate2 is not installed ({e})"}
    out = os.path.join(args.model, "ctranslate2-" + args.type)
    if not os.path.exists(os.path.join(out, "model.bin")):
        try:
            from ctranslate2.converters import TransformersConverter
            TransformersConverter(args.model).convert(out, quantization=None if args.type == "float32" else args.type,
                                                      force=True)
        except Exception as e:  # the converter's own errors: an unsupported config, a missing package
            return {"error": f"conversion failed: {e}"}
    translator = ctranslate2.Translator(out, device="cpu", compute_type=args.type, inter_threads=1,
                                        intra_threads=args.threads)
    tokens = [tok.convert_ids_to_tokens(tok(s)["input_ids"]) for s in sources]
    eos = tok.eos_token
    rows = []
    for beam in (1, 4):
        translator.translate_batch(tokens[:args.batch], beam_size=beam, max_decoding_length=args.max_len)  # warm up
        t0 = time.perf_counter()
        results = translator.translate_batch(tokens, max_batch_size=args.batch, beam_size=beam,
                                             max_decoding_length=args.max_len)
        seconds = time.perf_counter() - t0
        made = [[t for t in r.hypotheses[0] if t != eos] for r in results]
        rows.append({"mode": "greedy" if beam == 1 else f"beam {beam}", "seconds": seconds,
                     "target_tokens": sum(len(m) for m in made), "first": tok.convert_tokens_to_ids(made[0])})
    return {"peer": "ctranslate2 " + args.type, "version": ctranslate2.__version__, "threads": args.threads,
            "rows": rows}


def run_transformers(args, tok, sources):
    import torch
    import transformers
    torch.set_num_threads(args.threads)
    model = transformers.MarianMTModel.from_pretrained(args.model, dtype=torch.float32).eval()
    encoded = [tok(b, return_tensors="pt", padding=True) for b in batches(sources, args.batch)]
    special = {tok.eos_token_id, tok.pad_token_id}
    rows = []
    with torch.inference_mode():
        for beam in (1, 4):
            settings = dict(do_sample=False, num_beams=beam, max_new_tokens=args.max_len)
            model.generate(**encoded[0], **settings)  # warm up
            t0 = time.perf_counter()
            outs = [model.generate(**e, **settings) for e in encoded]
            seconds = time.perf_counter() - t0
            made = [[t for t in row.tolist() if t not in special] for o in outs for row in o]
            rows.append({"mode": "greedy" if beam == 1 else f"beam {beam}", "seconds": seconds,
                         "target_tokens": sum(len(m) for m in made), "first": made[0]})
    return {"peer": "transformers", "version": transformers.__version__, "threads": torch.get_num_threads(),
            "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sources", required=True, help="one source sentence per line")
    ap.add_argument("--peer", required=True, choices=["ctranslate2", "transformers"])
    ap.add_argument("--type", default="float32", choices=["float32", "int8"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    try:
        from transformers import MarianTokenizer
        tok = MarianTokenizer.from_pretrained(args.model)
    except Exception as e:
        print(json.dumps({"error": f"cannot load the folder's MarianTokenizer: {e}"}))
        return 0
    with open(args.sources, encoding="utf-8") as f:
        sources = f.read().split("\n")
    if sources and sources[-1] == "":
        sources.pop()
    result = run_ctranslate2(args, tok, sources) if args.peer == "ctranslate2" else run_transformers(args, tok, sources)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
