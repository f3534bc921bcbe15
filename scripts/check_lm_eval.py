#!/usr/bin/env python3
"""lm-evaluation-harness's own `local-completions` client against `qkv serve`:
its log-likelihoods (batches of token-id prompts with echo and logprobs, the
tokens from qkv's /tokenize) against transformers' on the same folder, then
one greedy generate_until.

usage: check_lm_eval.py QKV HF_FOLDER    (a decoder folder with tokenizer.json,
                                           e.g. tests/fixtures/hf/llama)
needs: pip install "lm-eval[api]" torch transformers   (not part of make test)

Exits non-zero when a log-likelihood differs by more than 1e-3 or the
greedy flags disagree. No task data is needed: the requests are built here.
"""
import sys

import torch
from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalCompletionsAPI
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from bench_serve import serve  # scripts/bench_serve.py: qkv serve on a free port

PAIRS = [("我是中国人", " -> 私は"), ("the cat", " sat on the mat"), ("Transformer", "s attend"), ("a", "b"),
         ("hello", " world"), ("私は", "中国人です"), ("1 2 3", " 4")]


def main(qkv, folder):
    server, host, port = serve(qkv, folder, parallel=4, threads=1)
    try:
        lm = LocalCompletionsAPI(base_url=f"http://{host}:{port}/v1/completions", model=folder.rstrip("/").split("/")[-1],
                                 tokenizer_backend="auto", batch_size=3, max_length=64)
        print("lm-eval tokenizer backend:", lm.tokenizer_backend)  # "remote": qkv's /tokenizer_info and /tokenize
        got = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)],
                               disable_tqdm=True)

        tok = PreTrainedTokenizerFast(tokenizer_file=folder + "/tokenizer.json")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        worst, failed = 0.0, False
        print(f"{'context':14} {'continuation':18} {'qkv via lm-eval':>16} greedy {'transformers':>13} greedy")
        for (context, continuation), (ll, greedy) in zip(PAIRS, got):
            # lm-eval's split (_encode_pair): the whole text encoded, cut after the context's tokens.
            c = tok(context, add_special_tokens=False).input_ids
            n = tok(context + continuation, add_special_tokens=False).input_ids[len(c):]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([c + n])).logits[0].double(), -1)
            want = sum(logp[len(c) - 1 + j, t].item() for j, t in enumerate(n))
            want_greedy = all(logp[len(c) - 1 + j].argmax().item() == t for j, t in enumerate(n))
            worst = max(worst, abs(ll - want))
            failed |= greedy != want_greedy
            print(f"{context!r:14} {continuation!r:18} {ll:16.5f} {greedy!s:6} {want:13.5f} {want_greedy}")
        print(f"largest difference: {worst:.2e}")
        text = lm.generate_until([Instance("generate_until", {}, ("我是中国人", {"until": ["\n"], "max_gen_toks": 8}),
                                           0)], disable_tqdm=True)
        print("generate_until:", text)
        if worst > 1e-3 or failed:
            sys.exit("lm-eval's numbers through qkv serve differ from transformers'")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
