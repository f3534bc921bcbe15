#!/usr/bin/env python3
"""Aggregate decoding throughput of `qkv serve` with 1, 4 and 16 concurrent
streams (a benchmark, not a test).

For each stream count N it starts `qkv serve --parallel N`, sends one warm-up
request, then has N client threads each send --requests completions of
--max-tokens tokens (greedy, ignore_eos, so every request is the same length)
and reports the completion tokens per second of the whole server, the
latency of a request, and the server's peak resident memory.

Without --model it builds the lm-20m recipe (configs/lm-20m.json: 21 M
parameters, SentencePiece BPE 4096) once in out/bench-serve/: a tokenizer
trained on generated text and one training step, since only the shapes
matter for speed.

With --translate and a translation --model (a qkv folder, or a Marian one
from scripts/make_bench_marian.py), each request is one sentence to
/v1/translate (greedy, max_len --max-tokens; the sentences of DIR/sources.txt
in turn when it exists): concurrent requests share batches
(tools/serve/merged_runs.h), and the rate is sentences per second.

With --llama-server PATH (llama.cpp's server binary) and a Hugging Face
--model folder, llama-server runs the same measurement at each stream count
on the folder's GGUF (model-f32.gguf beside the weights, made once by
llama.cpp's convert_hf_to_gguf.py at $QKV_CONVERT_HF_TO_GGUF, as `qkv bench
generate` makes it): `--parallel N` slots sharing its continuous batch, a
context of 512 per slot, the same threads, greedy, ignore_eos.

usage: scripts/bench_serve.py [--qkv build/release/qkv] [--model DIR] [--streams 1,4,16]
                              [--llama-server PATH] [--translate]
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time


def build_recipe_model(qkv, out):
    model = os.path.join(out, "lm-20m")
    if os.path.exists(os.path.join(model, "model.safetensors")):
        return model
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + ["ai", "ou", "ei"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(20000)]
    text = os.path.join(out, "text.txt")
    with open(text, "w") as f:
        for _ in range(20000):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(8, 30))) + "\n\n")
    print("bench serve: building the lm-20m recipe model (a tokenizer and one training step) ...", file=sys.stderr)
    subprocess.run([qkv, "train", "--config", "configs/lm-20m.json", "--train", text, "--out", model, "--steps", "1"],
                   check=True, stdout=subprocess.DEVNULL)
    return model


def serve(qkv, model, parallel, threads, extra=()):
    proc = subprocess.Popen([qkv, "serve", "--model", model, "--port", "0", "--parallel", str(parallel),
                             "--queue", str(parallel), "--quiet", "--threads", str(threads), *extra],
                            stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        m = re.match(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            return proc, m.group(1), int(m.group(2))
    raise RuntimeError("qkv serve did not start")


def serve_llama(binary, gguf, parallel, threads):
    """llama.cpp's server on a free port, once its /health answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--parallel",
                             str(parallel), "-c", str(512 * parallel), "--threads", str(threads),
                             "--threads-batch", str(threads), "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"{binary} exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, "127.0.0.1", port
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("llama-server did not start")


def gguf_of(model):
    """The folder's float32 GGUF, converted once by llama.cpp's own script."""
    gguf = os.path.join(model, "model-f32.gguf")
    if not os.path.exists(gguf):
        convert = os.environ.get("QKV_CONVERT_HF_TO_GGUF", "")
        if not os.path.isfile(convert):
            raise RuntimeError("set QKV_CONVERT_HF_TO_GGUF to llama.cpp's convert_hf_to_gguf.py")
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(convert), "gguf-py"))
        subprocess.run([sys.executable, convert, model, "--outtype", "f32", "--outfile", gguf], env=env, check=True,
                       capture_output=True)
    return gguf


def complete(host, port, body, path="/v1/completions"):
    c = http.client.HTTPConnection(host, port, timeout=600)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = json.loads(r.read())
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {data}")
    return data


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--qkv", default="build/release/qkv")
    p.add_argument("--model", help="a decoder model folder (default: the lm-20m recipe, built once)")
    p.add_argument("--streams", default="1,4,16")
    p.add_argument("--requests", type=int, default=2, help="requests per stream")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt", default="the quick brown fox jumps over the lazy dog and runs far away")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary: the peer, on the folder's GGUF")
    p.add_argument("--translate", action="store_true", help="one-sentence /v1/translate requests to a translation model")
    p.add_argument("--serve-args", default="", help="more qkv serve flags, e.g. '--batch-wait-ms 5'")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.translate and (not a.model or a.llama_server):
        p.error("--translate needs a translation --model and no --llama-server")
    sentences = ["我是中国人"]
    if a.translate and os.path.exists(os.path.join(a.model, "sources.txt")):
        with open(os.path.join(a.model, "sources.txt"), encoding="utf-8") as f:
            sentences = [line.rstrip("\n") for line in f if line.strip()]
    model = a.model or build_recipe_model(a.qkv, "out/bench-serve")
    servers = [("qkv", lambda n: serve(a.qkv, model, n, a.threads, a.serve_args.split()))]
    if a.llama_server:
        gguf = gguf_of(model)
        servers.append(("llama-server", lambda n: serve_llama(a.llama_server, gguf, n, a.threads)))
    rows = []
    for n, (server, start) in [(n, s) for n in [int(x) for x in a.streams.split(",")] for s in servers]:
        proc, host, port = start(n)
        try:
            body = {"prompt": a.prompt, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}
            if a.translate:
                complete(host, port, {"text": sentences[:1], "max_len": a.max_tokens}, "/v1/translate")  # warm-up
            else:
                complete(host, port, body)  # warm-up
            latencies, tokens, errors = [], [0], []
            lock = threading.Lock()

            def client(k):
                for i in range(a.requests):
                    t0 = time.monotonic()
                    try:
                        if a.translate:
                            sentence = sentences[(k * a.requests + i) % len(sentences)]
                            complete(host, port, {"text": [sentence], "max_len": a.max_tokens}, "/v1/translate")
                        else:
                            r = complete(host, port, body)
                    except Exception as e:  # noqa: BLE001 (reported below)
                        errors.append(repr(e))
                        return
                    with lock:
                        latencies.append(time.monotonic() - t0)
                        tokens[0] += 1 if a.translate else r["usage"]["completion_tokens"]

            t0 = time.monotonic()
            threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.monotonic() - t0
            if errors:
                raise RuntimeError(errors[0])
            latencies.sort()
            rows.append({"server": server, "streams": n, "requests": len(latencies), "completion_tokens": tokens[0],
                         "seconds": seconds, "tokens_per_s": tokens[0] / seconds,
                         "latency_p50_s": latencies[len(latencies) // 2], "peak_rss_mib": peak_rss_mib(proc.pid)})
        finally:
            proc.terminate()
            proc.wait()
    for r in rows:  # against the same server's first stream count, and qkv against the peer at the same count
        r["x_first"] = r["tokens_per_s"] / next(q for q in rows if q["server"] == r["server"])["tokens_per_s"]
        if r["server"] == "qkv":
            peer = [q for q in rows if q["server"] != "qkv" and q["streams"] == r["streams"]]
            if peer:
                r["qkv_vs_llama_server"] = r["tokens_per_s"] / peer[0]["tokens_per_s"]
    if a.json:
        print(json.dumps({"model": model, "max_tokens": a.max_tokens, "threads": a.threads, "rows": rows}))
        return
    if a.translate:
        print(f"{model}, one sentence per request to /v1/translate (greedy, max_len {a.max_tokens}), {a.threads} threads")
    else:
        print(f"{model}, {a.max_tokens} tokens per request (greedy, ignore_eos), {a.threads} threads")
    rate = "sentences/s" if a.translate else "tokens/s"
    print(f"{'server':>13} {'streams':>8} {'requests':>9} {rate:>11} {'x first':>8} {'p50 latency':>12} "
          f"{'peak RSS':>9} {'qkv vs it':>10}")
    for r in rows:
        vs = f"{r['qkv_vs_llama_server']:>9.2f}x" if "qkv_vs_llama_server" in r else ""
        print(f"{r['server']:>13} {r['streams']:>8} {r['requests']:>9} {r['tokens_per_s']:>11.1f} "
              f"{r['x_first']:>7.2f}x {r['latency_p50_s']:>11.2f}s {r['peak_rss_mib']:>7.0f}MB {vs}")


if __name__ == "__main__":
    main()
