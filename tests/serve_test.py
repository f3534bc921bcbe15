#!/usr/bin/env python3
"""qkv serve, driven as its users would: the openai client for completions and
streaming, plain HTTP for the rest, every bad input followed by a good request,
queueing, a client that leaves mid-stream, SIGTERM while a stream is open, and
a bounded load test (200 requests from 16 clients) that checks for errors and
memory growth, and the attention explorer page in headless Chromium.

usage: serve_test.py QKV FIXTURES_DIR
"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import openai

QKV = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "build/release/qkv"
FIXTURES = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else "tests/fixtures"
TMP = tempfile.mkdtemp(prefix="qkv-serve-test-")
# Under AddressSanitizer everything is several times slower, and freed memory
# is held in its quarantine (RSS grows by design; LeakSanitizer checks leaks
# instead, when the server exits: its exit status must be 0).
SANITIZED = "asan" in QKV
SLOW = 5 if SANITIZED else 1


def run(*args, timeout=300):
    r = subprocess.run([QKV, *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"qkv {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def train_decoder(name, config, steps):
    """A decoder trained on a short text (once per name and test run)."""
    out = os.path.join(TMP, name)
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return out
    text = os.path.join(TMP, "lm.txt")
    if not os.path.exists(text):
        with open(text, "w") as f:
            f.write("the cat sat on the mat.\n\nthe dog ran in the park.\n\n" * 60)
    with open(out + ".json", "w") as f:
        json.dump({"arch": "decoder", **config, "train": {"steps": steps, "batch_size": 4, "eval_every": steps}}, f)
    run("train", "--config", out + ".json", "--train", text, "--out", out, "--threads", "1")
    return out


class Server:
    """qkv serve on a free loopback port, its stderr kept in a file."""

    def __init__(self, model, *flags):
        self.log = open(os.path.join(TMP, f"serve-{time.monotonic_ns()}.log"), "w+")
        self.proc = subprocess.Popen([QKV, "serve", "--model", model, "--port", "0", "--threads", "1", *flags],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        for line in self.proc.stdout:
            m = re.match(r"listening on http://([\d.]+):(\d+)", line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                break
        else:
            self.log.seek(0)
            raise RuntimeError("qkv serve did not start: " + self.log.read())
        self.base = f"http://{self.host}:{self.port}"
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=60 * SLOW)

    def request(self, method, path, body=None, raw=None, timeout=60):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout * SLOW)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        payload = r.read()
        c.close()
        try:
            return r.status, json.loads(payload)
        except ValueError:
            return r.status, payload.decode()

    def complete(self, **body):
        return self.request("POST", "/v1/completions", body)

    def metric(self, name):
        _, text = self.request("GET", "/metrics")
        m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60 * SLOW)
        self.proc.stdout.close()
        self.log.close()
        return rc


def cli_generate(model, prompt, *flags):
    """What `qkv generate` prints after the prompt (it echoes the prompt, then a newline at the end)."""
    out = run("generate", "--model", model, "--prompt", prompt, "--threads", "1", *flags)
    assert out.startswith(prompt) and out.endswith("\n"), out
    return out[len(prompt):-1]


def small_decoder():
    return train_decoder("small", {"d_model": 32, "nhead": 4, "num_layers": 1, "dim_feedforward": 64,
                                   "context": 64}, 60)


class Completions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = small_decoder()
        cls.s = Server(cls.model, "--parallel", "4", "--queue", "16", "--max-body", "4096")

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def assert_serving(self):
        """After a refused request the next good one still succeeds."""
        r = self.s.client.completions.create(model="small", prompt="the", max_tokens=3, temperature=0)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_health_and_models(self):
        status, h = self.s.request("GET", "/health")
        self.assertEqual((status, h["status"], h["slots"]), (200, "ok", 4))
        models = self.s.client.models.list()
        self.assertEqual([m.id for m in models.data], ["small"])

    def test_greedy_completion_is_what_generate_prints(self):
        for prompt in ["the cat", "the dog ran", "x"]:
            r = self.s.client.completions.create(model="small", prompt=prompt, max_tokens=20, temperature=0)
            self.assertEqual(r.choices[0].text, cli_generate(self.model, prompt, "--max-new-tokens", "20",
                                                             "--temperature", "0"))
            self.assertEqual(r.usage.prompt_tokens, 1 + len(prompt.encode()))  # <bos> and the bytes
            self.assertEqual(r.usage.completion_tokens + r.usage.prompt_tokens, r.usage.total_tokens)

    def test_cache_prompt_prefills_only_what_a_slot_does_not_hold(self):
        """cache_prompt: a prompt that begins as an earlier one takes that request's slot and prefills only the
        rest; usage.prompt_tokens_details.cached_tokens counts what it kept, and the completion and its logprobs are
        those without it (within 1e-4). Without it nothing is kept; not a boolean is a 400."""
        first = "qkv prefix cache test"
        status, a = self.s.complete(prompt=first, max_tokens=6, temperature=0, ignore_eos=True, cache_prompt=True)
        self.assertEqual(status, 200, a)
        before = self.s.metric("qkv_prompt_tokens_cached_total")
        ask = dict(prompt=first + " again", max_tokens=5, temperature=0, ignore_eos=True, logprobs=2)
        status, cached = self.s.complete(cache_prompt=True, **ask)
        self.assertEqual(status, 200, cached)
        # <bos>, the bytes of the first prompt, and of the 5 completion tokens the slot holds (the 6th drawn was
        # never fed) those that " again" begins with
        held, made, more = 1 + len(first.encode()), a["choices"][0]["text"], b" again"
        extra = 0
        while extra < min(5, len(made.encode()), len(more)) and made.encode()[extra] == more[extra]:
            extra += 1
        if "\ufffd" not in made:  # (else a replaced byte hides what the slot holds)
            self.assertEqual(cached["usage"]["prompt_tokens_details"], {"cached_tokens": held + extra})
        held = cached["usage"]["prompt_tokens_details"]["cached_tokens"]
        self.assertTrue(1 + len(first.encode()) <= held <= 1 + len(first.encode()) + 5, held)
        self.assertEqual(self.s.metric("qkv_prompt_tokens_cached_total"), before + held)
        status, whole = self.s.complete(**ask)
        self.assertEqual(whole["usage"]["prompt_tokens_details"], {"cached_tokens": 0})
        self.assertEqual(cached["choices"][0]["text"], whole["choices"][0]["text"])
        for got, want in zip(cached["choices"][0]["logprobs"]["token_logprobs"],
                             whole["choices"][0]["logprobs"]["token_logprobs"]):
            self.assertAlmostEqual(got, want, delta=1e-4)
        status, answer = self.s.complete(prompt="a", max_tokens=1, cache_prompt="yes")
        self.assertEqual((status, answer["error"]["param"]), (400, "cache_prompt"), answer)
        self.assert_serving()

    def test_logprobs_score_what_was_generated(self):
        """logprobs: one entry per completion token, its text, value and likeliest alternatives; echo with
        max_tokens 0 scores a prompt, and scoring prompt + completion gives the completion's own numbers
        (the KV-cached steps against one pass over the text); a stream's chunks carry the same tokens."""
        status, r = self.s.complete(prompt="the", max_tokens=8, temperature=0, logprobs=3)
        self.assertEqual(status, 200, r)
        choice, n = r["choices"][0], r["usage"]["completion_tokens"]
        lp = choice["logprobs"]
        self.assertEqual([len(lp[k]) for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")], [n] * 4)
        self.assertEqual("".join(lp["tokens"]), choice["text"])  # bytes of ASCII text: one character each
        self.assertEqual(lp["text_offset"], list(range(n)))
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            self.assertEqual(len(top), 3)
            self.assertLess(value, 0)
            self.assertLessEqual(value, max(top.values()) + 1e-6)  # greedy among the tokens it may draw
            if token in top:
                self.assertAlmostEqual(top[token], value, places=5)
        status, scored = self.s.complete(prompt="the" + choice["text"], max_tokens=0, echo=True, logprobs=0)
        self.assertEqual(status, 200, scored)
        sc = scored["choices"][0]
        self.assertEqual((sc["text"], scored["usage"]["completion_tokens"]), ("the" + choice["text"], 0))
        slp = sc["logprobs"]
        self.assertEqual(len(slp["tokens"]), scored["usage"]["prompt_tokens"])  # <bos> and the bytes
        self.assertEqual((slp["tokens"][0], slp["token_logprobs"][0], slp["top_logprobs"][0]), ("", None, None))
        self.assertEqual(slp["tokens"][-n:], lp["tokens"])
        for a, b in zip(slp["token_logprobs"][-n:], lp["token_logprobs"]):
            self.assertAlmostEqual(a, b, delta=1e-4)
        self.assertEqual(slp["top_logprobs"][1:], [{}] * (len(slp["tokens"]) - 1))
        chunks = list(self.s.client.completions.create(model="small", prompt="the", max_tokens=8, temperature=0,
                                                       logprobs=3, stream=True))
        streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
        self.assertEqual(streamed, lp["tokens"])
        for body, param in [({"logprobs": 21}, "logprobs"), ({"logprobs": "3"}, "logprobs"), ({"echo": 1}, "echo")]:
            status, answer = self.s.complete(prompt="a", max_tokens=1, **body)
            self.assertEqual((status, answer["error"]["param"]), (400, param), answer)
        self.assert_serving()

    def test_a_list_of_prompts_gives_a_choice_each(self):
        """prompt as a list of texts, a list of token ids, or a list of lists of them (lm-eval's scoring requests):
        one choice per prompt, in order, each what its prompt alone gives; token ids are the prompt as given (this
        byte model's <bos> is 1 and byte b is 4 + b); usage adds them up. Streamed, each event names its choice,
        echo sends each prompt first, and the texts, tokens and offsets gathered per choice are the whole answer's."""
        prompts = ["the cat", "x", "the dog ran"]
        ids = [[1] + [4 + b for b in p.encode()] for p in prompts]
        ask = dict(max_tokens=10, temperature=0, logprobs=2, echo=True)
        alone = [self.s.complete(prompt=p, **ask)[1] for p in prompts]
        for a in alone:
            self.assertEqual(a["usage"]["completion_tokens"], len(a["choices"][0]["logprobs"]["tokens"]) -
                             a["usage"]["prompt_tokens"])
        for prompt in (prompts, ids, [prompts[0], ids[1], prompts[2]]):
            status, r = self.s.complete(prompt=prompt, **ask)
            self.assertEqual(status, 200, r)
            self.assertEqual([c["index"] for c in r["choices"]], [0, 1, 2])
            for c, a in zip(r["choices"], alone):
                want = a["choices"][0]
                self.assertEqual((c["text"], c["finish_reason"]), (want["text"], want["finish_reason"]))
                self.assertEqual(c["logprobs"]["tokens"], want["logprobs"]["tokens"])
                self.assertEqual(c["logprobs"]["text_offset"], want["logprobs"]["text_offset"])
                for got, expected in zip(c["logprobs"]["token_logprobs"], want["logprobs"]["token_logprobs"]):
                    self.assertEqual(got is None, expected is None)
                    if got is not None:
                        self.assertAlmostEqual(got, expected, delta=1e-4)
            for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
                self.assertEqual(r["usage"][key], sum(a["usage"][key] for a in alone), key)
        # One list of ids is one prompt; it may lack <bos>.
        status, r = self.s.complete(prompt=ids[0], max_tokens=10, temperature=0)
        self.assertEqual((status, r["choices"][0]["text"]), (200, alone[0]["choices"][0]["text"][len(prompts[0]):]))
        status, r = self.s.complete(prompt=ids[0][1:], max_tokens=3, temperature=0, echo=True)
        self.assertEqual((status, r["usage"]["prompt_tokens"]), (200, len(prompts[0])), r)
        self.assertTrue(r["choices"][0]["text"].startswith(prompts[0]), r)

        chunks = list(self.s.client.completions.create(model="small", prompt=prompts, stream=True, **ask))
        texts, tokens, offsets, finishes = [""] * 3, [[], [], []], [[], [], []], [[], [], []]
        for c in chunks:
            (choice,) = c.choices
            texts[choice.index] += choice.text
            finishes[choice.index].append(choice.finish_reason)
            if choice.logprobs:
                tokens[choice.index] += choice.logprobs.tokens
                offsets[choice.index] += choice.logprobs.text_offset
        for i, a in enumerate(alone):
            want = a["choices"][0]
            self.assertEqual(texts[i], want["text"])
            self.assertEqual((tokens[i], offsets[i]), (want["logprobs"]["tokens"], want["logprobs"]["text_offset"]))
            self.assertEqual(finishes[i][-1], want["finish_reason"])
            self.assertEqual(finishes[i][:-1], [None] * (len(finishes[i]) - 1))
        self.assertEqual([c.usage is not None for c in chunks], [False] * (len(chunks) - 1) + [True])
        self.assertEqual(chunks[-1].usage.prompt_tokens, sum(a["usage"]["prompt_tokens"] for a in alone))
        # echo streamed without logprobs: the prompt, then the completion
        streamed = "".join(c.choices[0].text for c in self.s.client.completions.create(
            model="small", prompt="the dog", max_tokens=6, temperature=0, echo=True, stream=True))
        self.assertEqual(streamed, "the dog" + self.s.complete(prompt="the dog", max_tokens=6,
                                                               temperature=0)[1]["choices"][0]["text"])
        self.assert_serving()

    def test_n_choices_per_prompt(self):
        """n: choice j of a prompt samples from seed + j, so it is what that prompt alone gives with that seed;
        choice i * n + j is prompt i's j-th; each prompt's tokens count once in usage. Streamed, each choice's
        pieces join to its text."""
        ask = dict(max_tokens=12, temperature=1.0, ignore_eos=True)
        prompts = ["the", "a cat"]
        alone = [[self.s.complete(prompt=p, seed=40 + j, **ask)[1] for j in range(3)] for p in prompts]
        status, r = self.s.complete(prompt=prompts, n=3, seed=40, **ask)
        self.assertEqual(status, 200, r)
        self.assertEqual([c["index"] for c in r["choices"]], list(range(6)))
        for i in range(2):
            for j in range(3):
                self.assertEqual(r["choices"][i * 3 + j]["text"], alone[i][j]["choices"][0]["text"], (i, j))
        self.assertGreater(len({c["text"] for c in r["choices"][:3]}), 1)  # three seeds, not one
        self.assertEqual(r["usage"]["prompt_tokens"], sum(a[0]["usage"]["prompt_tokens"] for a in alone))
        self.assertEqual(r["usage"]["completion_tokens"], 6 * 12)
        texts = [""] * 3
        chunks = list(self.s.client.completions.create(model="small", prompt="the", n=3, seed=40, stream=True,
                                                       max_tokens=12, temperature=1.0,
                                                       extra_body={"ignore_eos": True}))
        for c in chunks:
            texts[c.choices[0].index] += c.choices[0].text
        self.assertEqual(texts, [a["choices"][0]["text"] for a in alone[0]])
        self.assertEqual(chunks[-1].usage.prompt_tokens, alone[0][0]["usage"]["prompt_tokens"])
        self.assert_serving()

    def test_tokenize_and_detokenize(self):
        """vLLM's tokenizer endpoints (lm-evaluation-harness's remote tokenizer): /tokenize gives the ids a
        completion's prompt has, /detokenize their text, /tokenizer_info the context and no special token by a
        text that would not encode to it (this byte model spells <eos> in bytes)."""
        status, r = self.s.request("POST", "/tokenize", {"prompt": "the cat"})
        self.assertEqual((status, r["tokens"], r["count"]), (200, [1] + [4 + b for b in b"the cat"], 8), r)
        self.assertEqual((r["max_model_len"], r["token_strs"]), (64, None))
        status, plain = self.s.request("POST", "/tokenize", {"prompt": "猫", "add_special_tokens": False,
                                                             "return_token_strs": True})
        self.assertEqual((status, plain["tokens"]), (200, [4 + b for b in "猫".encode()]), plain)
        self.assertEqual(plain["token_strs"], ["\\xE7", "\\x8C", "\\xAB"])
        status, d = self.s.request("POST", "/detokenize", {"tokens": r["tokens"]})
        self.assertEqual((status, d), (200, {"prompt": "the cat"}))
        self.assertEqual(self.s.complete(prompt=r["tokens"], max_tokens=8, temperature=0)[1]["choices"][0]["text"],
                         self.s.complete(prompt="the cat", max_tokens=8, temperature=0)[1]["choices"][0]["text"])
        status, info = self.s.request("GET", "/tokenizer_info")
        self.assertEqual(status, 200, info)
        self.assertEqual((info["eos_token"], info["bos_token"], info["model_max_length"], info["vocab_size"],
                          info["chat_template"]), (None, None, 64, 260, None))
        for path, body, param in [("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {}, "prompt"),
                                  ("/tokenize", {"prompt": "a", "messages": []}, "messages"),
                                  ("/tokenize", {"prompt": "a", "add_special_tokens": "no"}, "add_special_tokens"),
                                  ("/detokenize", {"tokens": "a"}, "tokens"), ("/detokenize", {"tokens": [260]}, "tokens"),
                                  ("/detokenize", {"tokens": [1, None]}, "tokens"), ("/detokenize", {}, "tokens")]:
            status, answer = self.s.request("POST", path, body)
            self.assertEqual((status, answer["error"]["param"]), (400, param), (path, body, answer))
        self.assert_serving()

    def test_sampling_with_a_seed_is_what_generate_prints(self):
        r = self.s.client.completions.create(model="small", prompt="the", max_tokens=25, temperature=0.9,
                                             top_p=0.9, seed=7, extra_body={"top_k": 5})
        self.assertEqual(r.choices[0].text, cli_generate(self.model, "the", "--max-new-tokens", "25", "--temperature",
                                                         "0.9", "--top-p", "0.9", "--top-k", "5", "--seed", "7"))
        # min_p and typical_p (llama-server's fields): the same draw as qkv generate --min-p --typical-p
        r = self.s.client.completions.create(model="small", prompt="the", max_tokens=25, temperature=1.2, seed=5,
                                             extra_body={"min_p": 0.2})
        self.assertEqual(r.choices[0].text, cli_generate(self.model, "the", "--max-new-tokens", "25", "--temperature",
                                                         "1.2", "--min-p", "0.2", "--seed", "5"))
        r = self.s.client.completions.create(model="small", prompt="the", max_tokens=25, temperature=1.2, seed=6,
                                             extra_body={"typical_p": 0.5})
        self.assertEqual(r.choices[0].text, cli_generate(self.model, "the", "--max-new-tokens", "25", "--temperature",
                                                         "1.2", "--typical-p", "0.5", "--seed", "6"))

    def test_penalties_and_logit_bias(self):
        """presence_penalty and frequency_penalty give what qkv generate --presence-penalty --frequency-penalty
        prints; logit_bias -100 on a byte keeps it out of the text, +100 makes it the whole text."""
        for temperature in (0, 0.9):
            r = self.s.client.completions.create(model="small", prompt="the", max_tokens=24, temperature=temperature,
                                                 seed=9, presence_penalty=0.6, frequency_penalty=1.2)
            self.assertEqual(r.choices[0].text, cli_generate(
                self.model, "the", "--max-new-tokens", "24", "--temperature", str(temperature), "--seed", "9",
                "--presence-penalty", "0.6", "--frequency-penalty", "1.2"))
            if temperature == 0:
                greedy = self.s.complete(prompt="the", max_tokens=24, temperature=0)[1]["choices"][0]["text"]
                self.assertNotEqual(r.choices[0].text, greedy)  # the penalties change what comes out
        plain = self.s.complete(prompt="the", max_tokens=24, temperature=0, ignore_eos=True)[1]["choices"][0]["text"]
        self.assertIn(" ", plain)
        status, r = self.s.complete(prompt="the", max_tokens=24, temperature=0, ignore_eos=True,
                                    logit_bias={str(4 + ord(" ")): -100})
        self.assertEqual(status, 200, r)
        self.assertNotIn(" ", r["choices"][0]["text"])
        status, r = self.s.complete(prompt="the", max_tokens=5, temperature=0.9, logit_bias={str(4 + ord("z")): 100})
        self.assertEqual((status, r["choices"][0]["text"]), (200, "zzzzz"), r)
        for body in [{"presence_penalty": 2.5}, {"frequency_penalty": "1"}, {"logit_bias": []},
                     {"logit_bias": {"x": 1}}, {"logit_bias": {"260": 1}}, {"logit_bias": {"-1": 1}},
                     {"logit_bias": {"5": 101}}, {"logit_bias": {"5": "1"}}]:
            param = next(iter(body))
            status, answer = self.s.complete(prompt="a", max_tokens=1, **body)
            self.assertEqual((status, answer["error"]["param"]), (400, param), (body, answer))
        self.assert_serving()

    def test_streaming_gives_the_same_text_in_pieces(self):
        whole = self.s.client.completions.create(model="small", prompt="the cat", max_tokens=30, temperature=0.8,
                                                 seed=3)
        chunks = list(self.s.client.completions.create(model="small", prompt="the cat", max_tokens=30,
                                                       temperature=0.8, seed=3, stream=True))
        self.assertGreater(len(chunks), 2)
        self.assertEqual("".join(c.choices[0].text for c in chunks), whole.choices[0].text)
        self.assertEqual(chunks[-1].choices[0].finish_reason, whole.choices[0].finish_reason)
        self.assertTrue(all(c.choices[0].finish_reason is None for c in chunks[:-1]))

    def test_stream_options_include_usage(self):
        """stream_options.include_usage (the openai client's stream_options, LangChain's stream_usage): the
        usage comes in a last event of its own with no choices, and no other event has it."""
        chunks = list(self.s.client.completions.create(model="small", prompt="the", max_tokens=5, temperature=0,
                                                       stream=True, stream_options={"include_usage": True},
                                                       extra_body={"ignore_eos": True}))
        self.assertEqual((chunks[-1].choices, chunks[-1].usage.completion_tokens), ([], 5))
        self.assertEqual([c.usage for c in chunks[:-1]], [None] * (len(chunks) - 1))
        self.assertEqual(chunks[-2].choices[0].finish_reason, "length")
        for body in [{"stream_options": {"include_usage": True}}, {"stream": True, "stream_options": {"x": True}},
                     {"stream": True, "stream_options": {"include_usage": 1}}, {"stream": True, "stream_options": 1}]:
            status, answer = self.s.complete(prompt="a", max_tokens=1, **body)
            self.assertEqual((status, answer["error"]["param"]), (400, "stream_options"), (body, answer))
        self.assert_serving()

    def test_stop_sequence(self):
        full = self.s.complete(prompt="the", max_tokens=40, temperature=0, ignore_eos=True)[1]["choices"][0]["text"]
        self.assertGreater(len(full), 10)
        self.assertEqual(full, cli_generate(self.model, "the", "--max-new-tokens", "40", "--temperature", "0",
                                            "--ignore-eos"))
        stop = full[5:8]
        r = self.s.client.completions.create(model="small", prompt="the", max_tokens=40, temperature=0,
                                             stop=[stop, "never", "zzz", "qqq", "jjj", "xxx"],  # more than OpenAI's 4
                                             extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].text, full[:full.index(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        streamed = "".join(c.choices[0].text for c in self.s.client.completions.create(
            model="small", prompt="the", max_tokens=40, temperature=0, stop=stop, stream=True,
            extra_body={"ignore_eos": True}))
        self.assertEqual(streamed, full[:full.index(stop)])

    def test_concurrent_requests_share_steps_and_get_their_own_tokens(self):
        prompts = [("the cat", 11), ("the dog", 12), ("a", 13), ("park", 14), ("mat", 15), ("ran", 16)]
        alone = {p: self.s.complete(prompt=p, max_tokens=40, temperature=0.9, seed=seed, ignore_eos=True)[1]
                 for p, seed in prompts}

        def run_together():
            """The six requests at once; returns the decoding steps they took."""
            steps_before = self.s.metric("qkv_decode_steps_total")
            results, errors = {}, []
            together = threading.Barrier(len(prompts))

            def client(p, seed):
                try:
                    together.wait()
                    chunks = self.s.client.completions.create(model="small", prompt=p, max_tokens=40,
                                                              temperature=0.9, seed=seed, stream=True,
                                                              extra_body={"ignore_eos": True})
                    results[p] = "".join(c.choices[0].text for c in chunks)
                except Exception as e:  # noqa: BLE001 (reported below)
                    errors.append(repr(e))

            threads = [threading.Thread(target=client, args=a) for a in prompts]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            for p, _ in prompts:
                self.assertEqual(results[p], alone[p]["choices"][0]["text"], p)
            return self.s.metric("qkv_decode_steps_total") - steps_before

        # 6 x 39 tokens after the prefills: one at a time they take 234 steps. A 40-token
        # completion of this model takes milliseconds, so on a busy machine the clients may
        # still arrive one after another; the tokens are checked on every try, the sharing
        # must show in one of them.
        steps = [run_together()]
        while steps[-1] >= 6 * 39 and len(steps) < 5:
            steps.append(run_together())
        self.assertLess(min(steps), 6 * 39, steps)

    def test_bad_input_is_a_400_naming_the_field(self):
        cases = [
            (dict(raw='{"prompt": '), 400, None),
            (dict(raw='[1, 2]'), 400, None),
            (dict(raw=b'{"prompt": "\xff\xfe"}'), 400, None),  # invalid UTF-8
            (dict(raw='{"prompt": "a", "max_tokens": 1e999}'), 400, None),  # past a double (a 500 until the fuzzer)
            (dict(body={"prompt": "a", "max_tokens": "x"}), 400, "max_tokens"),
            (dict(body={"prompt": "a", "max_tokens": -1}), 400, "max_tokens"),
            (dict(body={"prompt": "a", "max_tokens": 64}), 400, "max_tokens"),  # past the context with the prompt
            (dict(body={"prompt": "x" * 70}), 400, "prompt"),  # past the context
            (dict(body={"prompt": 5}), 400, "prompt"),
            (dict(body={"prompt": []}), 400, "prompt"),
            (dict(body={"prompt": [[]]}), 400, "prompt"),
            (dict(body={"prompt": [1, "a"]}), 400, "prompt"),
            (dict(body={"prompt": ["a", 1]}), 400, "prompt"),
            (dict(body={"prompt": [1, 1.5]}), 400, "prompt"),
            (dict(body={"prompt": [1, -1]}), 400, "prompt"),
            (dict(body={"prompt": [1, 260]}), 400, "prompt"),  # past the byte model's vocabulary
            (dict(body={"prompt": [[1, 18446744073709551615]]}), 400, "prompt"),
            (dict(body={"prompt": ["a", "x" * 70]}), 400, "prompt"),  # the second past the context
            (dict(body={"prompt": ["a"] * 21}), 400, "prompt"),  # more than --parallel 4 plus --queue 16
            (dict(body={"prompt": [[1, 5]] * 21}), 400, "prompt"),
            (dict(body={"max_tokens": 5}), 400, "prompt"),
            (dict(body={"prompt": "a", "temperature": 3}), 400, "temperature"),
            (dict(body={"prompt": "a", "top_p": 0}), 400, "top_p"),
            (dict(body={"prompt": "a", "min_p": 1.5}), 400, "min_p"),
            (dict(body={"prompt": "a", "typical_p": 0}), 400, "typical_p"),
            (dict(body={"prompt": "a", "stream": "yes"}), 400, "stream"),
            (dict(body={"prompt": "a", "stop": [""]}), 400, "stop"),
            (dict(body={"prompt": "a", "stop": [str(i) for i in range(33)]}), 400, "stop"),  # 32 at most
            (dict(body={"prompt": "a", "n": 0}), 400, "n"),
            (dict(body={"prompt": "a", "n": 21}), 400, "n"),  # more than --parallel 4 plus --queue 16
            (dict(body={"prompt": ["a", "b"], "n": 11}), 400, "n"),
            (dict(body={"prompt": "a", "frobnicate": 1}), 400, "frobnicate"),
            (dict(body={"prompt": "a", "model": "gpt-4"}), 404, "model"),
            (dict(raw=json.dumps({"prompt": "a" * 5000})), 413, None),  # past --max-body 4096
        ]
        for kwargs, status, param in cases:
            got, body = self.s.request("POST", "/v1/completions", **kwargs)
            self.assertEqual(got, status, (kwargs, body))
            self.assertIn("message", body["error"], body)
            self.assertEqual(body["error"]["param"], param, body)
            self.assert_serving()
        for path, status in [("/v1/chat/completions", 400), ("/v1/embeddings", 400), ("/v1/translate", 400),
                             ("/v1/attention", 400), ("/v1/nothing", 404)]:
            got, body = self.s.request("POST", path, {"messages": [], "input": "a", "text": ["a"]})
            self.assertEqual(got, status, (path, body))
            self.assertTrue(body["error"]["message"], body)
        with self.assertRaises(openai.BadRequestError):
            self.s.client.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}])
        self.assert_serving()
        _, metrics = self.s.request("GET", "/metrics")
        self.assertRegex(metrics, r'qkv_requests_total\{endpoint="/v1/completions",code="400"\} \d+')
        self.assertRegex(metrics, r"qkv_request_duration_seconds_count \d+")

    def test_masked_self_attention_of_every_head(self):
        status, a = self.s.request("POST", "/v1/attention", {"text": "the cat"})
        self.assertEqual(status, 200, a)
        T = 1 + len("the cat")  # <bos> and the bytes
        self.assertEqual(len(a["source_tokens"]), T)
        self.assertEqual((len(a["layers"]), len(a["layers"][0])), (1, 4))  # 1 layer, 4 heads
        for head in a["layers"][0]:
            self.assertEqual(len(head), T)
            for t, row in enumerate(head):
                self.assertAlmostEqual(sum(row), 1.0, places=5)
                self.assertTrue(all(w == 0 for w in row[t + 1:]), (t, row))  # a query never sees later keys
        for t, row in enumerate(a["weights"]):
            for j, w in enumerate(row):
                self.assertAlmostEqual(sum(h[t][j] for h in a["layers"][0]) / 4, w, places=5)
        # While generations run: the attention is computed between their steps, and they are not disturbed.
        results = []
        threads = [threading.Thread(target=lambda: results.append(self.s.complete(
            prompt="the", max_tokens=30, temperature=0, ignore_eos=True)[1]["choices"][0]["text"])) for _ in range(3)]
        for t in threads:
            t.start()
        for _ in range(5):
            self.assertEqual(self.s.request("POST", "/v1/attention", {"text": "the dog"})[0], 200)
        for t in threads:
            t.join()
        self.assertEqual(len(set(results)), 1, results)
        status, body = self.s.request("POST", "/v1/attention", {"text": "x" * 80})
        self.assertEqual((status, body["error"]["param"]), (400, "text"), body)

    def test_load_200_requests_from_16_clients(self):
        def one_round(n, clients):
            latencies, errors = [], []
            lock = threading.Lock()
            todo = list(range(n))

            def client():
                while True:
                    with lock:
                        if not todo:
                            return
                        i = todo.pop()
                    t0 = time.monotonic()
                    try:
                        r = self.s.client.completions.create(model="small", prompt=f"the {i}", max_tokens=24,
                                                             temperature=0.8, seed=i, stream=i % 2 == 0)
                        text = "".join(c.choices[0].text for c in r) if i % 2 == 0 else r.choices[0].text
                        assert isinstance(text, str)
                    except Exception as e:  # noqa: BLE001
                        with lock:
                            errors.append(repr(e))
                    with lock:
                        latencies.append(time.monotonic() - t0)

            t0 = time.monotonic()
            threads = [threading.Thread(target=client) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return errors, sorted(latencies), time.monotonic() - t0

        rss = [self.s.rss_kib()]
        tokens0 = self.s.metric("qkv_completion_tokens_total")
        for round_ in range(3):
            errors, lat, seconds = one_round(200 if round_ == 0 else 100, 16)
            self.assertEqual(errors, [])
            rss.append(self.s.rss_kib())
            if round_ == 0:
                tokens = self.s.metric("qkv_completion_tokens_total") - tokens0
                print(f"\nload: 200 requests, 16 clients: p50 {lat[len(lat) // 2] * 1e3:.1f} ms, "
                      f"p99 {lat[int(len(lat) * 0.99)] * 1e3:.1f} ms, {tokens / seconds:.0f} tokens/s", flush=True)
        print(f"load: RSS after each round (KiB): {rss}", flush=True)
        # The first round grows the pools (threads, allocator); later rounds may not keep growing.
        if not SANITIZED:
            self.assertLess(rss[3] - rss[1], 4096, rss)


class Chat(unittest.TestCase):
    """/v1/chat/completions on a folder whose tokenizer_config.json has a ChatML template, run by qkv's Jinja:
    the text it renders, then what generate gives for that prompt, cut at <|im_end|>; the template's own
    raise_exception is a 400 with its message."""

    @classmethod
    def setUpClass(cls):
        cls.model = train_decoder("chat", {"d_model": 32, "nhead": 4, "num_layers": 1, "dim_feedforward": 64,
                                           "context": 160}, 30)  # room for the layout's markers
        template = ("{% if messages[-1].role != 'user' %}{{ raise_exception('the last message must be the user\\'s') }}"
                    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
        with open(os.path.join(cls.model, "tokenizer_config.json"), "w") as f:
            json.dump({"chat_template": template}, f)
        cls.s = Server(cls.model)

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat"}]
    PROMPT = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n"

    def test_chat_is_generate_on_the_formatted_prompt(self):
        r = self.s.client.chat.completions.create(model="chat", messages=self.MESSAGES, max_tokens=12, temperature=0)
        want = cli_generate(self.model, self.PROMPT, "--max-new-tokens", "12", "--temperature", "0")
        # Content given as text parts is their text, joined.
        parts = [self.MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": "the "},
                                                                 {"type": "text", "text": "cat"}]}]
        same = self.s.client.chat.completions.create(model="chat", messages=parts, max_tokens=12, temperature=0)
        self.assertEqual(same.choices[0].message.content, r.choices[0].message.content)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertEqual(r.choices[0].message.content, want.split("<|im_end|>")[0])
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.usage.completion_tokens + r.usage.prompt_tokens, r.usage.total_tokens)
        pieces = self.s.client.chat.completions.create(model="chat", messages=self.MESSAGES, max_tokens=12,
                                                       temperature=0, stream=True)
        text, finish = "", None
        for chunk in pieces:
            self.assertEqual(chunk.object, "chat.completion.chunk")
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual(text, r.choices[0].message.content)
        self.assertEqual(finish, r.choices[0].finish_reason)
        chunks = list(self.s.client.chat.completions.create(model="chat", messages=self.MESSAGES, max_tokens=12,
                                                            temperature=0, stream=True,
                                                            stream_options={"include_usage": True}))
        self.assertEqual((chunks[-1].choices, chunks[-1].usage.total_tokens), ([], r.usage.total_tokens))

    def test_n_replies(self):
        """n: reply j samples from seed + j, as that request alone would; the prompt counts once; a stream's
        deltas name their reply."""
        r = self.s.client.chat.completions.create(model="chat", messages=self.MESSAGES, max_tokens=8, n=2, seed=5,
                                                  temperature=1.0)
        self.assertEqual([c.index for c in r.choices], [0, 1])
        for j in range(2):
            one = self.s.client.chat.completions.create(model="chat", messages=self.MESSAGES, max_tokens=8,
                                                        seed=5 + j, temperature=1.0)
            self.assertEqual(r.choices[j].message.content, one.choices[0].message.content, j)
        self.assertEqual(r.usage.prompt_tokens, one.usage.prompt_tokens)
        texts = ["", ""]
        for chunk in self.s.client.chat.completions.create(model="chat", messages=self.MESSAGES, max_tokens=8, n=2,
                                                           seed=5, temperature=1.0, stream=True):
            texts[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
        self.assertEqual(texts, [c.message.content for c in r.choices])

    def test_logprobs_of_a_chat_reply(self):
        r = self.s.client.chat.completions.create(model="chat", messages=self.MESSAGES, max_tokens=6, temperature=0,
                                                  logprobs=True, top_logprobs=2)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for t in content:
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace"), t.token)
            self.assertEqual(len(t.top_logprobs), 2)
            self.assertLessEqual(t.logprob, t.top_logprobs[0].logprob + 1e-6)
            self.assertGreaterEqual(t.top_logprobs[0].logprob, t.top_logprobs[1].logprob)
        plain = self.s.client.chat.completions.create(model="chat", messages=self.MESSAGES, max_tokens=6,
                                                      temperature=0)
        self.assertIsNone(plain.choices[0].logprobs)
        self.assertEqual(plain.choices[0].message.content, r.choices[0].message.content)
        status, answer = self.s.request("POST", "/v1/chat/completions", {"messages": self.MESSAGES, "max_tokens": 2,
                                                                         "response_format": {"type": "text"}})
        self.assertEqual(status, 200, answer)
        for extra, param in [({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21},
                                                                      "top_logprobs"), ({"logprobs": 1}, "logprobs"),
                             ({"response_format": {"type": "json_object"}}, "response_format"),
                             ({"response_format": "text"}, "response_format")]:
            status, answer = self.s.request("POST", "/v1/chat/completions",
                                            {"messages": self.MESSAGES, "max_tokens": 2, **extra})
            self.assertEqual((status, answer["error"]["param"]), (400, param), answer)

    def test_bad_messages_are_a_400_and_the_server_goes_on(self):
        for messages, says in [([], "at least one message"), ([{"role": "bot", "content": "a"}], "role 'bot'"),
                               ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                                "last message must be the user's"),
                               ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                                "only text parts"),
                               ([{"role": "user", "content": 3}], "a string or a list of text parts"),
                               ("hi", "must be a list")]:
            status, body = self.s.request("POST", "/v1/chat/completions", {"messages": messages})
            self.assertEqual(status, 400, body)
            self.assertEqual(body["error"]["param"], "messages", body)
            self.assertIn(says, body["error"]["message"])
            r = self.s.client.chat.completions.create(model="chat", messages=self.MESSAGES, max_tokens=2)
            self.assertEqual(len(r.choices), 1)
        status, body = self.s.request("POST", "/v1/chat/completions",
                                      {"messages": self.MESSAGES, "max_tokens": 2, "max_completion_tokens": 2})
        self.assertEqual((status, body["error"]["param"]), (400, "max_tokens"), body)
        status, body = self.s.request("POST", "/v1/chat/completions", {"messages": self.MESSAGES, "tools": [
            {"type": "function", "function": {"name": "now"}}]})  # this template reads no tools
        self.assertEqual((status, body["error"]["param"]), (400, "tools"), body)
        self.assertIn("does not show tools", body["error"]["message"])


class ChatTools(unittest.TestCase):
    """Tools in /v1/chat/completions: on a folder whose template shows them (the qwen2 fixture's, with
    <tool_call> blocks), they reach the prompt, and a conversation with an assistant's tool_calls and a
    tool's answer is read; a template that does not read tools, a tool_choice qkv cannot honour, and
    malformed tools or calls are a 400 naming the field. (The <tool_call> blocks of a reply are read by
    parse_tool_calls, tested in tests/test_chat.cpp: these random models write none.)"""

    TOOLS = [{"type": "function", "function": {"name": "now", "description": "The time now, in UTC."}}]
    MESSAGES = [{"role": "user", "content": "the cat"}]

    @classmethod
    def setUpClass(cls):
        trained = train_decoder("chat-long", {"d_model": 32, "nhead": 4, "num_layers": 1, "dim_feedforward": 64,
                                              "context": 512}, 30)  # room for the tools in the prompt
        cls.model = os.path.join(TMP, "chat-tools")
        shutil.rmtree(cls.model, ignore_errors=True)
        shutil.copytree(trained, cls.model)
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf", "qwen2",
                                 "tokenizer_config.json"),
                    os.path.join(cls.model, "tokenizer_config.json"))
        cls.s = Server(cls.model)

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def test_tools_reach_the_prompt(self):
        plain = self.s.client.chat.completions.create(model="chat-tools", messages=self.MESSAGES, max_tokens=2)
        with_tools = self.s.client.chat.completions.create(model="chat-tools", messages=self.MESSAGES,
                                                           max_tokens=2, tools=self.TOOLS)
        self.assertGreater(with_tools.usage.prompt_tokens, plain.usage.prompt_tokens + 20)
        none = self.s.client.chat.completions.create(model="chat-tools", messages=self.MESSAGES, max_tokens=2,
                                                     tools=self.TOOLS, tool_choice="none")
        self.assertEqual(none.usage.prompt_tokens, plain.usage.prompt_tokens)
        status, auto = self.s.request("POST", "/v1/chat/completions", {"messages": self.MESSAGES, "max_tokens": 2,
                                                                       "tools": self.TOOLS, "tool_choice": None})
        self.assertEqual((status, auto["usage"]["prompt_tokens"]), (200, with_tools.usage.prompt_tokens), auto)
        history = self.MESSAGES + [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
        r = self.s.client.chat.completions.create(model="chat-tools", messages=history, max_tokens=4,
                                                  temperature=0, tools=self.TOOLS)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        text = "".join(c.choices[0].delta.content or "" for c in self.s.client.chat.completions.create(
            model="chat-tools", messages=history, max_tokens=4, temperature=0, tools=self.TOOLS, stream=True))
        self.assertEqual(text, r.choices[0].message.content)

    def test_what_cannot_be_honoured_is_a_400_and_the_server_goes_on(self):
        call = {"id": "c", "type": "function", "function": {"name": "now", "arguments": "[1]"}}
        for extra, param, says in [
                ({"tool_choice": "required"}, "tool_choice", "\"auto\" or \"none\""),
                ({"tools": [{"type": "function"}]}, "tools", "tools[0] must be"),
                ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools", "non-empty string"),
                ({"tools": "now"}, "tools", "must be a list"),
                ({"messages": self.MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [call]},
                                               {"role": "user", "content": "?"}]}, "messages",
                 "JSON text of an object")]:
            body = {"messages": self.MESSAGES, "max_tokens": 2, **extra}
            status, answer = self.s.request("POST", "/v1/chat/completions", body)
            self.assertEqual((status, answer["error"]["param"]), (400, param), answer)
            self.assertIn(says, answer["error"]["message"])
            r = self.s.client.chat.completions.create(model="chat-tools", messages=self.MESSAGES, max_tokens=2)
            self.assertEqual(len(r.choices), 1)

    def test_json_nested_past_the_limit_is_a_400_and_the_server_goes_on(self):
        """A body, or a call's arguments (JSON text of their own), nested 100,000 deep: a 400, and the server goes
        on. Parsed, such a body overflowed the server's stack (under AddressSanitizer; ordered_json copies an
        object's earlier members as it adds one), and the template's conversion recursed a call a level.
        A body 100 levels deep still serves, 101 is refused."""
        deep = '{"a": ' * 100000 + "{}" + "}" * 100000
        head = '{"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 2, '
        tool = '"tools": [{"type": "function", "function": {"name": "now", "parameters": %s}}]'
        call = ('"messages": [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": null, '
                '"tool_calls": [{"id": "c", "type": "function", "function": {"name": "now", "arguments": %s}}]}, '
                '{"role": "tool", "tool_call_id": "c", "content": "12:00"}], "max_tokens": 2}')
        for raw, param in [(head + tool % deep + "}", None),
                           ("{" + call % json.dumps(deep), "messages"),
                           ("{" + call % deep, None)]:
            status, answer = self.s.request("POST", "/v1/chat/completions", raw=raw)
            self.assertEqual(status, 400, str(answer)[:300])
            self.assertEqual(answer["error"]["param"], param, answer)
            self.assertIn("nested deeper than", answer["error"]["message"])
            r = self.s.client.chat.completions.create(model="chat-tools", messages=self.MESSAGES, max_tokens=2)
            self.assertEqual(len(r.choices), 1)
        # The body 100 levels deep at most: tools [ {function {parameters ...}}] leave 96 to the schema
        # (tool_choice "none" keeps it out of the prompt, which this context has no room for).
        for levels, status_wanted in [(96, 200), (97, 400)]:
            schema = '{"a": ' * (levels - 1) + "{}" + "}" * (levels - 1)
            status, answer = self.s.request("POST", "/v1/chat/completions",
                                            raw=head + '"tool_choice": "none", ' + tool % schema + "}")
            self.assertEqual(status, status_wanted, str(answer)[:300])
            if status == 400:
                self.assertEqual(answer["error"]["param"], None, answer)
                self.assertIn("the body is nested deeper than 100 levels", answer["error"]["message"])


class Slow(unittest.TestCase):
    """A model slow enough that requests overlap: queueing, leaving mid-stream, draining on SIGTERM."""

    @classmethod
    def setUpClass(cls):
        cls.model = train_decoder("wide", {"d_model": 384, "nhead": 6, "num_layers": 4, "dim_feedforward": 1024,
                                           "context": 512}, 1)

    def test_queue_full_is_a_429(self):
        s = Server(self.model, "--parallel", "1", "--queue", "1")
        try:
            codes = []

            def client():
                codes.append(s.complete(prompt="a", max_tokens=400, temperature=0, ignore_eos=True)[0])

            threads = [threading.Thread(target=client) for _ in range(5)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(sorted(codes)[:2], [200, 200], codes)  # one decoding, one waiting
            self.assertIn(429, codes)
            status, body = s.complete(prompt="a", max_tokens=2)
            self.assertEqual(status, 200, body)
            # A list of prompts is queued whole or not at all: past --parallel 1 plus --queue 1 it is a 400, and
            # two while one decodes a 429 (the first, queued before the second was refused, leaves with it).
            status, body = s.complete(prompt=["a", "b", "c"], max_tokens=2)
            self.assertEqual((status, body["error"]["param"]), (400, "prompt"), body)
            codes.clear()
            busy = threading.Thread(target=client)
            busy.start()
            deadline = time.monotonic() + 30 * SLOW
            while s.request("GET", "/health")[1]["active"] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            status, body = s.complete(prompt=["a", "b"], max_tokens=2)
            self.assertEqual(status, 429, body)
            busy.join()
            self.assertEqual(codes, [200])
            status, body = s.complete(prompt=["a", "b"], max_tokens=2, temperature=0)
            self.assertEqual((status, [c["index"] for c in body["choices"]]), (200, [0, 1]), body)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_a_client_that_leaves_frees_its_slot(self):
        s = Server(self.model, "--parallel", "1", "--queue", "0")
        try:
            c = socket.create_connection((s.host, s.port))
            body = json.dumps({"prompt": "a", "max_tokens": 500, "ignore_eos": True, "stream": True}).encode()
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            got = b""
            while b"data: " not in got:
                got += c.recv(4096)
            c.close()
            deadline = time.monotonic() + 30 * SLOW
            while s.metric('qkv_generations_total{reason="cancelled"}') < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(s.metric('qkv_generations_total{reason="cancelled"}'), 1)
            self.assertLess(s.metric("qkv_completion_tokens_total"), 500)
            status, body = s.complete(prompt="a", max_tokens=2)  # the only slot is free again
            self.assertEqual(status, 200, body)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_attention_of_a_long_text_is_a_400_for_a_decoder_too(self):
        """A decoder's /v1/attention has the translation's bound, checked before the model runs: 451 positions
        (<bos> and 450 bytes) of this 4-layer, 6-head model are 451^2 x (1 + 24) = 5,085,025 weights with the
        mean over heads, past 4,194,304."""
        s = Server(self.model)
        try:
            status, body = s.request("POST", "/v1/attention", {"text": "a" * 450})
            self.assertEqual((status, body["error"]["param"]), (400, "text"), body)
            self.assertIn("a 451-token text is 5085025 weights", body["error"]["message"])
            status, a = s.request("POST", "/v1/attention", {"text": "the cat"})
            self.assertEqual(status, 200, a)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_sigterm_finishes_the_stream_in_flight(self):
        s = Server(self.model)
        stream = s.client.completions.create(model="wide", prompt="a", max_tokens=300, temperature=0, stream=True,
                                             extra_body={"ignore_eos": True})
        it = iter(stream)
        first = next(it)
        s.proc.send_signal(signal.SIGTERM)
        rest = list(it)
        self.assertEqual(rest[-1].choices[0].finish_reason, "length")
        self.assertEqual(rest[-1].usage.completion_tokens, 300)
        self.assertEqual(s.stop(), 0)
        with self.assertRaises(OSError):
            socket.create_connection((s.host, s.port), timeout=2)
        del first


def at_once(server, path, bodies):
    """POSTs the bodies to `path` together (a barrier), one client thread each; their (status, body) in order."""
    results, errors = [None] * len(bodies), []
    barrier = threading.Barrier(len(bodies))

    def client(i):
        try:
            barrier.wait()
            results[i] = server.request("POST", path, bodies[i])
        except Exception as e:  # noqa: BLE001 (raised below)
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise AssertionError(errors)
    return results


def shares_batches(test, together, requests):
    """Runs together() (the requests at once; returns the model runs they took) until the requests took fewer runs
    than there were requests, at most five times. A request of these small models takes a millisecond or less, so
    without the server's --batch-wait-ms each would find the model free (CI saw it, five tries running); with the
    wait (200 ms) requests that leave the client threads together share a run unless the machine stalls a thread
    that long; the results are checked on every try, the sharing must show in one."""
    counts = [together()]
    while counts[-1] >= requests and len(counts) < 5:
        counts.append(together())
    test.assertLess(min(counts), requests, counts)


def model_runs(server, endpoint):
    """qkv_model_runs_total of the endpoint: the batches it ran (concurrent requests share one)."""
    _, text = server.request("GET", "/metrics")
    return int(re.search(r'^qkv_model_runs_total\{endpoint="' + re.escape(endpoint) + r'"\} (\d+)$', text,
                         re.M).group(1))


def chromium(*args):
    """Headless Chromium (Debian's chromium, installed by scripts/install-deps.sh); root needs --no-sandbox."""
    return subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
                           *args], capture_output=True, text=True, timeout=120 * SLOW)


def settled_page(url, timeout=60):
    """The DOM of url in headless Chromium once the page's state (body's data-state) is past "loading" and
    "running":
    asked every 0.1 s over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages ended
    by a NUL byte, Chromium reading fd 3 and writing fd 4). --dump-dom cannot wait for a streamed body:
    its virtual time runs on while the body arrives."""
    to_chromium, from_chromium = os.pipe(), os.pipe()

    def as_fds_3_and_4():
        os.dup2(to_chromium[0], 3)
        os.dup2(from_chromium[1], 4)

    proc = subprocess.Popen(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                             "about:blank"], pass_fds=(3, 4), preexec_fn=as_fds_3_and_4,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(to_chromium[0])
    os.close(from_chromium[1])
    writer, reader = os.fdopen(to_chromium[1], "wb", buffering=0), os.fdopen(from_chromium[0], "rb", buffering=0)
    pending, calls = b"", 0

    def call(method, params, session=None):
        nonlocal pending, calls
        calls += 1
        message = {"id": calls, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        writer.write(json.dumps(message).encode() + b"\0")
        while True:  # replies and events, until the reply to this call
            while b"\0" not in pending:
                chunk = reader.read(1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                pending += chunk
            raw, pending = pending.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == calls:
                if "error" in reply:
                    raise RuntimeError(f"chromium: {method}: {reply['error']}")
                return reply["result"]

    def evaluate(session, expression):
        return call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)["result"].get("value")

    try:
        target = call("Target.createTarget", {"url": url})["targetId"]
        session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        deadline = time.time() + timeout * SLOW
        while time.time() < deadline and evaluate(session, "document.body && document.body.dataset.state") in (
                None, "", "loading", "running"):
            time.sleep(0.1)
        return evaluate(session, "document.documentElement.outerHTML")
    finally:
        try:
            call("Browser.close", {})
        except (RuntimeError, OSError):
            pass
        writer.close()
        reader.close()
        proc.wait(timeout=30)


class Explorer(unittest.TestCase):
    """The attention explorer page in a real browser: it loads, translates the text of its URL, and draws one
    row of cells per output token, one cell per source token, shaded by the weight /v1/attention returned; its
    other views draw the encoder's self-attention and the decoder's masked self-attention the same way."""

    def test_page_draws_the_cross_attention(self):
        model = os.path.join(FIXTURES, "folders", "transformer")
        s = Server(model)
        try:
            status, page = s.request("GET", "/")
            self.assertEqual(status, 200)
            self.assertIn("qkv attention explorer", page)
            _, a = s.request("POST", "/v1/attention", {"text": "我是中国人"})
            dom = chromium("--dump-dom", s.base + "/?text=" + "我是中国人").stdout
            self.assertIn('data-state="done"', dom, dom[-2000:])
            rows = re.findall(r'<tr class="target">(.*?)</tr>', dom)
            self.assertEqual(len(rows), len(a["target_tokens"]))
            for row, want in zip(rows, a["weights"]):
                got = [float(w) for w in re.findall(r'data-weight="([\d.]+)"', row)]
                self.assertEqual(len(got), len(a["source_tokens"]))
                for g, w in zip(got, want):
                    self.assertAlmostEqual(g, w, places=3)
                # The darkest cell of each row is its largest weight.
                shades = [int(x) for x in re.findall(r"background: rgb\((\d+),", row)]
                self.assertEqual(shades.index(min(shades)), want.index(max(want)))
            # Every head of every layer, small, below the big map.
            heads = re.findall(r'<canvas[^>]*data-layer="(\d+)" data-head="(\d+)"', dom)
            self.assertEqual(len(heads), sum(len(layer) for layer in a["layers"]), dom[-2000:])
            # The views: cross-attention first (the top-level fields), then the encoder's self-attention over
            # the source and the decoder's masked self-attention over what it read (its start token, then the
            # output tokens but the last), each drawn when the URL names it.
            views = {v["name"]: v for v in a["views"]}
            with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
                config = json.load(f)
            self.assertEqual([v["name"] for v in a["views"]], ["cross", "encoder", "decoder"])
            self.assertEqual(views["cross"]["weights"], a["weights"])
            self.assertEqual(views["encoder"]["row_tokens"], a["source_tokens"])
            self.assertEqual(views["decoder"]["row_tokens"][1:], a["target_tokens"][:-1])
            for name in ("encoder", "decoder"):
                view = views[name]
                n = len(view["row_tokens"])
                self.assertEqual(view["column_tokens"], view["row_tokens"])
                layers = config["num_encoder_layers" if name == "encoder" else "num_decoder_layers"]
                self.assertEqual([len(heads) for heads in view["layers"]], [config["nhead"]] * layers)
                dom = chromium("--dump-dom", s.base + "/?view=" + name + "&text=" + "我是中国人").stdout
                self.assertIn('data-state="done"', dom, dom[-2000:])
                self.assertRegex(dom, r'<button data-view="' + name + r'" class="on">')
                rows = re.findall(r'<tr class="target">(.*?)</tr>', dom)
                self.assertEqual(len(rows), n, name)
                for t, (row, want) in enumerate(zip(rows, view["weights"])):
                    got = [float(w) for w in re.findall(r'data-weight="([\d.]+)"', row)]
                    self.assertEqual(len(got), n)
                    for g, w in zip(got, want):
                        self.assertAlmostEqual(g, w, places=3)
                    self.assertAlmostEqual(sum(want), 1, places=4)
                    if name == "decoder":  # each query sees itself and what came before it
                        self.assertTrue(all(w == 0 for w in got[t + 1:]), (t, got))
                    elif t + 1 < n:  # the encoder's every token sees the whole sentence
                        self.assertTrue(any(w > 0 for w in got[t + 1:]), (t, got))
            png = os.path.join(TMP, "explorer.png")
            chromium("--window-size=900,700", "--screenshot=" + png, s.base + "/?text=" + "我是中国人")
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        finally:
            self.assertEqual(s.stop(), 0)


def png(width, height, pixel):
    """A PNG file's bytes (8-bit RGB), pixel(x, y) -> (r, g, b); the stdlib only."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"".join(bytes(pixel(x, y)) for x in range(width)) for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


class ExplorerDecoder(unittest.TestCase):
    # Skipped under the sanitizers since 2026-12-06, when the page was read with --dump-dom and the stream
    # outlasted Chromium's virtual time there (ten tries in a row, twice in six sanitizer runs); it is now
    # read once settled (settled_page), and make test checks it.
    @unittest.skipIf(SANITIZED, "make test checks the page; under the sanitizers its browser adds minutes")
    def test_page_streams_a_completion_and_draws_its_masked_attention(self):
        s = Server(small_decoder())
        try:
            # The page is read once its state leaves "running" (settled_page). With --dump-dom, which does
            # not wait for a streamed body, ten tries over 30 s were all caught mid-stream once in make test
            # (2026-12-06, beside the cli, python and mpi tests).
            dom = settled_page(s.base + "/?text=the&max_tokens=6")
            self.assertIn('data-state="done"', dom, dom[-2000:])
            rows = re.findall(r'<tr class="target">(.*?)</tr>', dom)
            self.assertGreater(len(rows), 2)  # <bos>, "the" and what followed
            for t, row in enumerate(rows):
                weights = [float(w) for w in re.findall(r'data-weight="([\d.]+)"', row)]
                self.assertEqual(len(weights), len(rows))
                self.assertTrue(all(w == 0 for w in weights[t + 1:]), (t, weights))
            self.assertEqual(len(re.findall(r"<canvas[^>]*data-head=", dom)), 4)
        finally:
            self.assertEqual(s.stop(), 0)


class Images(unittest.TestCase):
    def test_classify_is_what_the_cli_gives(self):
        import base64
        model = os.path.join(FIXTURES, "folders", "vit")  # 8x8 grey images, classes dark and light
        images = {"light": png(12, 12, lambda x, y: (230, 230, 230)),
                  "stripes": png(8, 8, lambda x, y: (255, 255, 255) if x % 2 else (0, 0, 0))}
        paths = []
        for name, data in images.items():
            paths.append(os.path.join(TMP, name + ".png"))
            with open(paths[-1], "wb") as f:
                f.write(data)
        cli = json.loads(run("classify", "--model", model, "--top-k", "2", "--json", *paths))
        s = Server(model)
        try:
            encoded = [base64.b64encode(d).decode() for d in images.values()]
            encoded[1] = "data:image/png;base64," + encoded[1]
            status, body = s.request("POST", "/v1/classify", {"image": encoded, "top_k": 2})
            self.assertEqual(status, 200, body)
            for got, want in zip(body["results"], cli):
                self.assertEqual([t["label"] for t in got["top"]], [t["label"] for t in want["top"]])
                for g, w in zip(got["top"], want["top"]):
                    self.assertAlmostEqual(g["probability"], w["probability"], places=5)
                grid = got["rollout"]  # the 2x2 patches of an 8x8 image with patch 4
                self.assertEqual([len(r) for r in grid], [2, 2])
                # What the class token draws from each patch: the rollout's row less its own column.
                self.assertTrue(all(w >= 0 for r in grid for w in r), grid)
                self.assertTrue(0 < sum(map(sum, grid)) <= 1 + 1e-5, grid)
            for bad in [{"image": "not base64!"}, {"image": base64.b64encode(b"not an image").decode()},
                        {"image": []}, {"image": encoded[0], "top_k": 3}, {}]:
                status, body = s.request("POST", "/v1/classify", bad)
                self.assertEqual(status, 400, (bad, body))
                self.assertIn(body["error"]["param"], ("image", "top_k"), body)
            status, body = s.request("POST", "/v1/classify", {"image": encoded[0]})
            self.assertEqual(status, 200, body)
            status, body = s.complete(prompt="a")
            self.assertEqual((status, body["error"]["param"]), (400, "model"), body)
        finally:
            self.assertEqual(s.stop(), 0)


class HuggingFace(unittest.TestCase):
    def test_a_hugging_face_folder_serves_transformers_text(self):
        """The llama fixture with its tokenizer.json: the OpenAI client gets what transformers' generate() gave."""
        model = os.path.join(FIXTURES, "hf", "llama")
        with open(os.path.join(FIXTURES, "hf", "llama.expected.json"), encoding="utf-8") as f:
            expected = json.load(f)
        s = Server(model)
        try:
            r = s.client.completions.create(model="llama", prompt=expected["prompt"], max_tokens=16, temperature=0)
            self.assertEqual(r.choices[0].text, expected["text"])
            self.assertEqual(r.usage.prompt_tokens, len(expected["prompt_ids"]))  # <|begin_of_text|> included
            self.assertEqual(r.usage.completion_tokens, len(expected["new_ids"]))
            self.assertEqual(cli_generate(model, expected["prompt"], "--temperature", "0", "--max-new-tokens", "16"),
                             expected["text"])
            # The tokenizer endpoints give transformers' ids; those ids as the prompt give the same completion.
            status, t = s.request("POST", "/tokenize", {"prompt": expected["prompt"]})
            self.assertEqual((status, t["tokens"]), (200, expected["prompt_ids"]), t)
            status, info = s.request("GET", "/tokenizer_info")
            self.assertEqual(status, 200, info)
            status, eos = s.request("POST", "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
            self.assertEqual((status, len(eos["tokens"])), (200, 1), (info, eos))  # lm-eval's eos_token_id
            status, d = s.request("POST", "/detokenize", {"tokens": expected["prompt_ids"]})
            self.assertEqual((status, d["prompt"]), (200, expected["prompt"]), d)
            r = s.client.completions.create(model="llama", prompt=expected["prompt_ids"], max_tokens=16, temperature=0)
            self.assertEqual(r.choices[0].text, expected["text"])
        finally:
            self.assertEqual(s.stop(), 0)


class Embeddings(unittest.TestCase):
    def test_concurrent_embeddings_share_batches(self):
        """Six one-text requests at once get qkv embed's vectors and their own token counts, and in one of up to
        five tries take fewer model runs than requests (tools/serve/merged_runs.h; a bad input among merged ones
        is tests/test_serve_merge.cpp's)."""
        model = os.path.join(FIXTURES, "hf", "bert")
        texts = ["我是中国人", "The quick brown fox.", "a", "猫が好きです", "the lazy dog", "空"]
        cli = [json.loads(line) for line in subprocess.run(
            [QKV, "embed", "--model", model], input="\n".join(texts) + "\n", capture_output=True, text=True,
            check=True).stdout.splitlines()]
        s = Server(model, "--batch-wait-ms", "200")

        def together():
            """The requests at once; returns the model runs they took."""
            before = model_runs(s, "/v1/embeddings")
            results = at_once(s, "/v1/embeddings", [{"input": [t], "encoding_format": "float"} for t in texts])
            for i, (status, body) in enumerate(results):
                self.assertEqual(status, 200, body)
                self.assertLess(max(abs(a - b) for a, b in zip(body["data"][0]["embedding"], cli[i])), 1e-5)
                self.assertEqual(body["usage"], alone[i]["usage"])
            return model_runs(s, "/v1/embeddings") - before

        try:
            alone = {i: s.request("POST", "/v1/embeddings", {"input": [texts[i]], "encoding_format": "float"})[1]
                     for i in range(len(texts))}
            shares_batches(self, together, len(texts))
        finally:
            self.assertEqual(s.stop(), 0)

    def test_embeddings_are_what_the_cli_gives(self):
        """The bert fixture (a sentence-transformers folder): the OpenAI client's embeddings (it asks for
        base64) and encoding_format "float" both give qkv embed's vectors; a text past max_seq_length is a 400."""
        model = os.path.join(FIXTURES, "hf", "bert")
        texts = ["我是中国人", "The quick brown fox jumps over the lazy dog."]
        cli = [json.loads(line) for line in subprocess.run(
            [QKV, "embed", "--model", model], input="\n".join(texts) + "\n", capture_output=True, text=True,
            check=True).stdout.splitlines()]
        s = Server(model)
        try:
            r = s.client.embeddings.create(model="bert", input=texts)
            self.assertEqual([d.index for d in r.data], [0, 1])
            for d, want in zip(r.data, cli):
                self.assertEqual(len(d.embedding), 32)
                self.assertLess(max(abs(a - b) for a, b in zip(d.embedding, want)), 1e-6)
            self.assertGreater(r.usage.prompt_tokens, 4)
            status, body = s.request("POST", "/v1/embeddings", {"input": texts[0], "encoding_format": "float"})
            self.assertEqual(status, 200, body)
            self.assertLess(max(abs(a - b) for a, b in zip(body["data"][0]["embedding"], cli[0])), 1e-6)
            for payload, param in [({"input": "the " * 40}, "input"), ({"input": []}, "input"),
                                   ({"input": [[1, 2, 3]]}, "input"), ({}, "input"),
                                   ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
                                   ({"input": "a", "dimensions": 8}, "dimensions"),
                                   ({"input": "a", "model": "other"}, "model")]:
                status, body = s.request("POST", "/v1/embeddings", payload)
                self.assertIn(status, (400, 404), (payload, body))
                self.assertEqual(body["error"]["param"], param, (payload, body))
            status, body = s.request("POST", "/v1/completions", {"prompt": "a"})
            self.assertEqual(status, 400, body)
            self.assertIn("an encoder (sentence embeddings)", body["error"]["message"])
        finally:
            self.assertEqual(s.stop(), 0)


class Translation(unittest.TestCase):
    def test_translate_is_what_the_cli_gives(self):
        model = os.path.join(FIXTURES, "folders", "transformer")
        s = Server(model)
        try:
            texts = ["我是中国人", "这本书很有意思"]
            status, body = s.request("POST", "/v1/translate", {"text": texts, "beam": 2})
            self.assertEqual(status, 200, body)
            r = subprocess.run([QKV, "translate", "--model", model, "--beam", "2"], input="\n".join(texts) + "\n",
                               capture_output=True, text=True, check=True)
            self.assertEqual(body["translations"], r.stdout.split("\n")[:2])
            for bad, param in [({"text": 3}, "text"), ({"text": ["a"], "beam": 0}, "beam"), ({}, "text")]:
                status, body = s.request("POST", "/v1/translate", bad)
                self.assertEqual((status, body["error"]["param"]), (400, param), body)
            status, body = s.complete(prompt="a")
            self.assertEqual((status, body["error"]["param"]), (400, "model"), body)
            # The cross-attention behind the first translation: one row per output token (<eos> included), each a
            # distribution over the source tokens.
            status, a = s.request("POST", "/v1/attention", {"text": texts[0]})
            self.assertEqual(status, 200, a)
            greedy = subprocess.run([QKV, "translate", "--model", model], input=texts[0] + "\n", capture_output=True,
                                    text=True, check=True).stdout
            self.assertEqual(a["translation"] + "\n", greedy)
            self.assertEqual(len(a["weights"]), len(a["target_tokens"]))
            for row in a["weights"]:
                self.assertEqual(len(row), len(a["source_tokens"]))
                self.assertAlmostEqual(sum(row), 1.0, places=4)
            # Every layer and head: [layer][head][token][source token]; the last layer's mean over heads is "weights".
            layers = a["layers"]
            self.assertEqual(len(layers), 1)  # the fixture: 1 decoder layer, 2 heads
            self.assertEqual(len(layers[0]), 2)
            for t, row in enumerate(a["weights"]):
                for j, w in enumerate(row):
                    self.assertAlmostEqual(sum(h[t][j] for h in layers[-1]) / len(layers[-1]), w, places=5)
            status, body = s.request("POST", "/v1/attention", {"text": ["a"]})
            self.assertEqual((status, body["error"]["param"]), (400, "text"), body)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_attention_of_a_long_text_is_a_400_and_the_server_goes_on(self):
        """/v1/attention answers every layer and head of every view; past 4,194,304 weights it is a 400 naming
        text (an 800-byte text to the Marian fixture, 773 source tokens, answered 111 MB before the bound)."""
        s = Server(os.path.join(FIXTURES, "hf", "marian"))
        try:
            status, body = s.request("POST", "/v1/attention", {"text": "我是" + "q" * 770, "max_len": 5})
            self.assertEqual((status, body["error"]["param"]), (400, "text"), body)
            self.assertIn("more than the 4194304 one answer holds", body["error"]["message"])
            status, a = s.request("POST", "/v1/attention", {"text": "我是中国人", "max_len": 5})
            self.assertEqual(status, 200, a)
            self.assertEqual(len(a["weights"]), len(a["target_tokens"]))
        finally:
            self.assertEqual(s.stop(), 0)

    def test_generation_config_gives_the_default_beam(self):
        """A request without beam and max_len runs with the folder's generation_config.json ones, as the CLI does."""
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "model")
            shutil.copytree(os.path.join(FIXTURES, "folders", "transformer"), model)
            with open(os.path.join(model, "generation_config.json"), "w") as f:
                json.dump({"num_beams": 3, "length_penalty": 0.6, "max_new_tokens": 12}, f)
            texts = ["我是中国人", "这本书很有意思"]
            cli = subprocess.run([QKV, "translate", "--model", model, "--beam", "3", "--max-len", "12"],
                                 input="\n".join(texts) + "\n", capture_output=True, text=True, check=True)
            s = Server(model)
            try:
                status, body = s.request("POST", "/v1/translate", {"text": texts})
                self.assertEqual(status, 200, body)
                self.assertEqual(body["translations"], cli.stdout.split("\n")[:2])
            finally:
                self.assertEqual(s.stop(), 0)

    def test_concurrent_translations_share_batches(self):
        """Eight one-sentence requests at once translate as the CLI translates them, in fewer model runs than
        requests: those that arrive while a batch runs share the next one (tools/serve/merged_runs.h)."""
        model = os.path.join(FIXTURES, "folders", "transformer")
        texts = ["我是中国人", "这本书很有意思", "我是学生", "他是中国人", "这是书", "我很好", "你是谁", "中国很大"]
        cli = subprocess.run([QKV, "translate", "--model", model, "--max-len", "32"], input="\n".join(texts) + "\n",
                             capture_output=True, text=True, check=True).stdout.split("\n")[:len(texts)]
        s = Server(model, "--batch-wait-ms", "200")

        def together():
            """The eight requests at once; returns the model runs they took."""
            before = model_runs(s, "/v1/translate")
            results = at_once(s, "/v1/translate", [{"text": [t], "max_len": 32} for t in texts])
            for status, body in results:
                self.assertEqual(status, 200, body)
            self.assertEqual([body["translations"][0] for _, body in results], cli)
            return model_runs(s, "/v1/translate") - before

        try:
            shares_batches(self, together, len(texts))
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    if result.wasSuccessful():
        shutil.rmtree(TMP, ignore_errors=True)
    else:
        print(f"test files kept in {TMP}", file=sys.stderr)
    sys.exit(0 if result.wasSuccessful() else 1)
