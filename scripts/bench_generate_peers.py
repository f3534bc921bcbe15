#!/usr/bin/env python3
"""The peers of `qkv bench generate --model DIR`: transformers, or llama.cpp on a GGUF of the same folder.

Both time what qkv's bench times, on the same prompt: prefill of PROMPT_LEN token ids (4 + i * 7919 mod
(vocab - 4)), then NEW_TOKENS greedy tokens one at a time with the KV cache (the argmax over ids 2 and up, as
qkv does), after a short warm-up. Prints one JSON object:
{"peer": ..., "version": ..., "threads": n, "prefill_tokens_per_s": x, "decode_tokens_per_s": x, "tokens": [...]}
or {"error": "why"} when the peer cannot run (not installed, no converter).

  --peer transformers            AutoModelForCausalLM in float32 with its own KV cache
  --peer llama.cpp --type T      llama-cpp-python on DIR converted to GGUF (T: f32, bf16, f16 or q8_0) by
                                 llama.cpp's convert_hf_to_gguf.py, found at $QKV_CONVERT_HF_TO_GGUF (it ships in
                                 the llama-cpp-python source package, vendor/llama.cpp); the GGUF is kept in DIR;
                                 with QKV_LLAMA_NO_EXTRA_BUFTS=1 set, llama.cpp's extra (repacked) buffers are off

Usage: bench_generate_peers.py --model DIR --peer transformers|llama.cpp [--type f32] --prompt-len N
                               --new-tokens N --threads N
"""
import argparse
import json
import os
import subprocess
import sys
import time


def prompt_ids(vocab, n):
    return [4 + (i * 7919) % (vocab - 4) for i in range(n)]


def run_transformers(args):
    import torch
    import transformers
    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    prompt = torch.tensor([prompt_ids(vocab, args.prompt_len)])
    with torch.inference_mode():
        model(prompt[:, :8], use_cache=True)  # warm up
        t0 = time.perf_counter()
        out = model(prompt, use_cache=True, logits_to_keep=1)  # the last position's, as generate() keeps
        prefill = time.perf_counter() - t0
        cache, logits, tokens = out.cache, out.logits[0, -1], []
        t0 = time.perf_counter()
        for _ in range(args.new_tokens):
            tokens.append(int(logits[2:].argmax()) + 2)
            out = model(torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True)
            cache, logits = out.cache, out.logits[0, -1]
        decode = time.perf_counter() - t0
    return {"peer": "transformers", "version": transformers.__version__, "threads": torch.get_num_threads(),
            "prefill_tokens_per_s": args.prompt_len / prefill, "decode_tokens_per_s": args.new_tokens / decode,
            "tokens": tokens}


def run_llama_cpp(args):
    try:
        import llama_cpp
        import numpy as np
    except ImportError as e:
        return {"error": f"llama-cpp-python is not installed ({e})"}
    gguf = os.path.join(args.model, f"model-{args.type}.gguf")
    if not os.path.exists(gguf):
        convert = os.environ.get("QKV_CONVERT_HF_TO_GGUF", "")
        if not os.path.isfile(convert):
            return {"error": "set QKV_CONVERT_HF_TO_GGUF to llama.cpp's convert_hf_to_gguf.py"}
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(convert), "gguf-py"))
        done = subprocess.run([sys.executable, convert, args.model, "--outtype", args.type, "--outfile", gguf],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": "convert_hf_to_gguf.py failed: " + done.stderr.strip().splitlines()[-1]}
    if os.environ.get("QKV_LLAMA_NO_EXTRA_BUFTS"):
        # llama.cpp's extra CPU buffer types (weights repacked for AMX and other kernels) off: its Q8_0 on
        # AMX died in them on the Intel Xeon here (docs/benchmarks.md); llama-cpp-python has no argument for it.
        defaults = llama_cpp.llama_cpp.llama_model_default_params

        def without_extra_bufts():
            p = defaults()
            p.use_extra_bufts = False
            return p

        llama_cpp.llama_cpp.llama_model_default_params = without_extra_bufts
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=args.prompt_len + args.new_tokens + 8, n_batch=args.prompt_len,
                          n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    prompt = prompt_ids(llm.n_vocab(), args.prompt_len)
    llm.eval(prompt[:8])  # warm up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - t0
    tokens = []
    t0 = time.perf_counter()
    vocab = llm.n_vocab()
    for _ in range(args.new_tokens):
        # The last position's logits, read in place (Llama keeps no copy unless logits_all).
        logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(vocab,))
        tokens.append(int(np.argmax(logits[2:])) + 2)
        llm.eval([tokens[-1]])
    decode = time.perf_counter() - t0
    return {"peer": "llama.cpp", "type": args.type, "version": llama_cpp.__version__, "threads": args.threads,
            "gguf_bytes": os.path.getsize(gguf), "prefill_tokens_per_s": args.prompt_len / prefill,
            "decode_tokens_per_s": args.new_tokens / decode, "tokens": tokens}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--peer", required=True, choices=["transformers", "llama.cpp"])
    ap.add_argument("--type", default="f32", choices=["f32", "bf16", "f16", "q8_0"])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    try:
        result = run_transformers(args) if args.peer == "transformers" else run_llama_cpp(args)
    except ImportError as e:
        result = {"error": str(e)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
