#!/usr/bin/env python3
"""A conversation through `qkv serve`, turn after turn, with and without
`cache_prompt`: each turn's prompt is the last turn's prompt, its completion
and some new text, so with the cache a turn prefills only the new part. Prints
each turn's latency both ways and the tokens the cache kept (a benchmark, not
a test).

usage: bench_prompt_cache.py [--qkv build/release/qkv] --model DIR [--turns 5] [--words 30] [--max-tokens 32]
       (DIR: a decoder folder, e.g. scripts/make_bench_llama.py --recipe configs/lm-20m.json --out DIR)
"""
import argparse
import os
import random
import time

from bench_serve import complete, serve  # scripts/bench_serve.py


def conversation(host, port, model, turns, words, max_tokens, cache, seed=0):
    """Each turn's seconds and cached prompt tokens, and the texts generated."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"]
    prompt, out = "", []
    for _ in range(turns):
        prompt += " ".join("".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(words))
        t0 = time.perf_counter()
        r = complete(host, port, {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                  "ignore_eos": True, "cache_prompt": cache})
        seconds = time.perf_counter() - t0
        text = r["choices"][0]["text"]
        out.append((seconds, r["usage"]["prompt_tokens"], r["usage"]["prompt_tokens_details"]["cached_tokens"], text))
        prompt += text + "\n"
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--qkv", default="build/release/qkv")
    p.add_argument("--model", required=True)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--words", type=int, default=30, help="new words a turn")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="conversations each way, alternating")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    server, host, port = serve(a.qkv, a.model, 1, a.threads)
    name = os.path.basename(a.model.rstrip("/"))
    try:
        runs = {False: [], True: []}
        # A new conversation each round, first with the cache (the slot then holds nothing of it), then without.
        for r in range(a.rounds):
            for cache in (True, False):
                runs[cache].append(conversation(host, port, name, a.turns, a.words, a.max_tokens, cache, seed=r))
    finally:
        server.terminate()
        server.wait()
    best = {cache: [min(r[t][0] for r in rs) for t in range(a.turns)] for cache, rs in runs.items()}  # per turn
    same = all(x[3] == y[3] for r0, r1 in zip(runs[False], runs[True]) for x, y in zip(r0, r1))
    print(f"{name}: {a.turns} turns of {a.words} new words and {a.max_tokens} greedy tokens, 1 slot, "
          f"{a.threads} threads; best of {a.rounds} conversations each way "
          "(the first's token counts)")
    print(f"{'turn':>4} {'prompt tokens':>13} {'cached':>7} {'without ms':>11} {'with ms':>8} {'speedup':>8}")
    for t in range(a.turns):
        _, prompt_tokens, cached, _ = runs[True][0][t]
        print(f"{t + 1:4d} {prompt_tokens:13d} {cached:7d} {best[False][t] * 1e3:11.1f} {best[True][t] * 1e3:8.1f} "
              f"{best[False][t] / best[True][t]:7.2f}x")
    print(f"all turns: {sum(best[False]) * 1e3:.0f} ms without, {sum(best[True]) * 1e3:.0f} ms with "
          f"({sum(best[False]) / sum(best[True]):.2f}x); same texts both ways: {same}")


if __name__ == "__main__":
    main()
