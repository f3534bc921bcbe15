#!/usr/bin/env python3
"""The decoder-only model of `qkv bench generate` in plain PyTorch, with its own KV cache.

Reads the weights qkv wrote (safetensors, qkv's names) and the config, builds
the same model (token embedding, Pre-Norm RMSNorm blocks with causal
self-attention, RoPE and SwiGLU, final RMSNorm, tied output), and times
prefill of the prompt and greedy decoding token by token with a KV cache.
Prints one JSON object:
{"torch": version, "threads": n, "params": n, "prefill_tokens_per_s": x, "decode_tokens_per_s": x, "tokens": [...]}

Usage: bench_generate_torch.py --weights FILE --config JSON --prompt-len N --new-tokens N [--threads 2]
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, offset):
    t, dh = x.shape[-2], x.shape[-1]
    half = dh // 2
    inv = 10000.0 ** (-2.0 * torch.arange(half, dtype=torch.float32) / dh)
    ang = (torch.arange(t, dtype=torch.float32) + offset)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Model:
    def __init__(self, w, c):
        self.w, self.c = w, c
        self.d, self.h, self.layers = c["d_model"], c["nhead"], c["num_layers"]
        self.hkv = c.get("num_kv_heads") or self.h
        self.dh = self.d // self.h

    def step(self, ids, cache):
        """ids [1, T] at positions cache length .. -> logits of the last position."""
        w, B, T = self.w, ids.shape[0], ids.shape[1]
        offset = cache[0][0].shape[2] if cache[0] is not None else 0
        x = F.embedding(ids, w["embed.weight"])
        for i in range(self.layers):
            a = f"layers.{i}."
            h = rms_norm(x, w[a + "norm1.weight"])
            q, k, v = F.linear(h, w[a + "self_attn.qkv_proj.weight"], w[a + "self_attn.qkv_proj.bias"]).split(
                [self.h * self.dh, self.hkv * self.dh, self.hkv * self.dh], -1)
            q = rope(q.view(B, T, self.h, self.dh).transpose(1, 2), offset)
            k = rope(k.view(B, T, self.hkv, self.dh).transpose(1, 2), offset)
            v = v.view(B, T, self.hkv, self.dh).transpose(1, 2)
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            g = self.h // self.hkv
            ctx = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                                 is_causal=T > 1)
            x = x + F.linear(ctx.transpose(1, 2).reshape(B, T, self.d), w[a + "self_attn.out_proj.weight"],
                             w[a + "self_attn.out_proj.bias"])
            h = rms_norm(x, w[a + "norm2.weight"])
            x = x + F.linear(F.silu(F.linear(h, w[a + "mlp.w1.weight"])) * F.linear(h, w[a + "mlp.w2.weight"]),
                             w[a + "mlp.w3.weight"])
        x = rms_norm(x[:, -1:], w["norm.weight"])
        return F.linear(x, w["embed.weight"])[:, -1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    c = json.loads(args.config)
    w = load_file(args.weights)
    model = Model(w, c)
    prompt = torch.tensor([[4 + (i * 7919) % (c["vocab_size"] - 4) for i in range(args.prompt_len)]])
    with torch.inference_mode():
        model.step(prompt[:, :8], [None] * model.layers)  # warm up
        cache = [None] * model.layers
        t0 = time.perf_counter()
        logits = model.step(prompt, cache)
        prefill = time.perf_counter() - t0
        tokens = []
        t0 = time.perf_counter()
        for _ in range(args.new_tokens):
            nxt = int(logits[0, 2:].argmax()) + 2
            tokens.append(nxt)
            logits = model.step(torch.tensor([[nxt]]), cache)
        decode = time.perf_counter() - t0
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "params": sum(t.numel() for t in w.values()),
                      "prefill_tokens_per_s": args.prompt_len / prefill,
                      "decode_tokens_per_s": args.new_tokens / decode, "tokens": tokens}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
