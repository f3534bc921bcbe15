#!/usr/bin/env python3
"""Log-likelihood scoring, as lm-evaluation-harness runs it, through `qkv serve`
(its `local-completions` model: batches of token-id prompts with echo) and
through lm-eval's own transformers backend (`hf`: padded batches, one forward
each), on the same folder, the same requests, the same threads, one after the
other. Prints requests/s and tokens/s of each, their ratio, and the largest
difference between the two sets of log-likelihoods.

usage: bench_lm_eval.py QKV HF_FOLDER [--requests 64] [--batch 8] [--words 60] [--threads 2]
       (a folder from scripts/make_bench_llama.py, e.g. --recipe configs/lm-20m.json)
needs: pip install "lm-eval[api]" torch transformers sentencepiece   (not part of make test)
"""
import argparse
import random
import time

import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from lm_eval.models.openai_completions import LocalCompletionsAPI

from bench_serve import serve  # scripts/bench_serve.py: qkv serve on a free port


def requests(n, words, seed=0):
    """n (context, continuation) pairs of pseudo-words, contexts of about `words` words."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"]
    word = lambda: "".join(rng.choice(syllables) for _ in range(rng.randint(1, 3)))  # noqa: E731
    return [(" ".join(word() for _ in range(words + rng.randint(-10, 10))), " " + " ".join(word() for _ in range(3)))
            for _ in range(n)]


def timed(lm, pairs):
    instances = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    t0 = time.perf_counter()
    out = lm.loglikelihood(instances, disable_tqdm=True)
    return out, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("qkv")
    p.add_argument("folder")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--words", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    pairs = requests(a.requests, a.words)
    torch.set_num_threads(a.threads)

    hf = HFLM(pretrained=a.folder, batch_size=a.batch, device="cpu", dtype="float32")
    tokens = sum(len(hf.tok_encode(c + x)) for c, x in pairs)
    timed(hf, pairs[: a.batch])  # warm-up
    theirs, hf_seconds = timed(hf, pairs)

    server, host, port = serve(a.qkv, a.folder, a.batch, a.threads)
    try:
        runs = {}
        # The tokenizer lm-eval finds on the server (/tokenize, a request per text), and the folder's own, local
        # as the hf backend's is.
        for backend in ("remote", "huggingface"):
            lm = LocalCompletionsAPI(base_url=f"http://{host}:{port}/v1/completions",
                                     model=a.folder.rstrip("/").split("/")[-1], tokenizer_backend=backend,
                                     tokenizer=a.folder if backend == "huggingface" else None, batch_size=a.batch,
                                     max_length=512)
            timed(lm, pairs[: a.batch])
            runs[backend] = timed(lm, pairs)
    finally:
        server.terminate()
        server.wait()

    print(f"{a.requests} loglikelihood requests, {tokens} tokens, batches of {a.batch}, {a.threads} threads")
    print(f"{'lm-eval hf (torch ' + torch.__version__ + ')':52} {a.requests / hf_seconds:7.1f} requests/s "
          f"{tokens / hf_seconds:8.0f} tokens/s")
    for backend, (ours, seconds) in runs.items():
        worst = max(abs(x[0] - y[0]) for x, y in zip(ours, theirs))
        print(f"{'lm-eval local-completions, ' + backend + ' tokenizer -> qkv':52} {a.requests / seconds:7.1f} "
              f"requests/s {tokens / seconds:8.0f} tokens/s ({hf_seconds / seconds:.2f}x; largest difference "
              f"{worst:.1e})")


if __name__ == "__main__":
    main()
