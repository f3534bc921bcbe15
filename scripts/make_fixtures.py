#!/usr/bin/env python3
"""Writes the golden fixtures the C++ tests compare against (tests/fixtures/).

PyTorch computes every op from the same inputs the C++ test reads back: the
output and the gradient of each input for the loss sum(out * R), R a fixed
random tensor. References are computed in float64 and stored as float32.

Also writes:
  mlp_adamw.safetensors    three AdamW training steps of a small MLP
  python_written.safetensors  a file from Python's safetensors writer, every dtype
and, with --check-qkv-file FILE, loads a file that qkv wrote and checks it.

Usage: python3 scripts/make_fixtures.py [--out tests/fixtures] [--check-qkv-file F]
Needs: torch, safetensors, numpy, sacrebleu (pip install torch safetensors numpy sacrebleu).
The tests themselves need no Python; rerun this only to change fixtures.
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import load_file, save_file

torch.manual_seed(1234)


def randn(*shape):
    return torch.randn(tuple(shape), dtype=torch.float32)


def away_from_zero(*shape):
    x = randn(*shape)
    return x.sign() * (x.abs() + 0.1)


def positive(*shape):
    return torch.rand(*shape, dtype=torch.float32) * 1.5 + 0.5


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


# name -> (list of float inputs, function of float64 tensors, extra int tensors)
# Dropout has no case here: its mask comes from qkv's own counter-based RNG,
# not PyTorch's; tests/test_ops.cpp checks its statistics and its gradient.
def cases():
    ids = torch.tensor([[1, 3, 3], [9, 0, 1]], dtype=torch.int64)
    targets = torch.tensor([2, 0, -100, 6, 6, 1], dtype=torch.int64)
    mask = torch.tensor([[1, 0, 0, 1, 0]], dtype=torch.uint8)
    return {
        "add_bcast": ([randn(3, 1, 5), randn(4, 5)], lambda a, b: a + b, {}),
        "sub_bcast": ([randn(2, 3), randn(3)], lambda a, b: a - b, {}),
        "mul_bcast": ([randn(2, 3, 4), randn(4)], lambda a, b: a * b, {}),
        "div_bcast": ([randn(2, 3), positive(2, 1)], lambda a, b: a / b, {}),
        "scale": ([randn(7)], lambda x: x * -1.5, {}),
        "add_scalar": ([randn(2, 2)], lambda x: x + 3.0, {}),
        "sum_all": ([randn(3, 4)], lambda x: x.sum(), {}),
        "sum_axes": ([randn(3, 4, 5)], lambda x: x.sum(dim=(0, 2)), {}),
        "mean_keepdim": ([randn(3, 4, 5)], lambda x: x.mean(dim=-1, keepdim=True), {}),
        "exp": ([randn(4, 7)], torch.exp, {}),
        "log": ([positive(4, 7)], torch.log, {}),
        "tanh": ([randn(4, 7)], torch.tanh, {}),
        "sigmoid": ([randn(4, 7)], torch.sigmoid, {}),
        "relu": ([away_from_zero(4, 7)], torch.relu, {}),
        "gelu": ([randn(4, 7)], F.gelu, {}),
        "gelu_tanh": ([randn(4, 7)], lambda x: F.gelu(x, approximate="tanh"), {}),
        "silu": ([randn(4, 7)], F.silu, {}),
        "matmul_batched": ([randn(2, 1, 4, 5), randn(3, 5, 6)], torch.matmul, {}),
        "linear": ([randn(2, 3, 5), randn(4, 5), randn(4)], F.linear, {}),
        "softmax": ([randn(6, 11)], lambda x: torch.softmax(x, -1), {}),
        "log_softmax": ([randn(6, 11)], lambda x: torch.log_softmax(x, -1), {}),
        "layer_norm": ([randn(4, 9), randn(9), randn(9)],
                       lambda x, w, b: F.layer_norm(x, (9,), w, b, 1e-5), {}),
        "rms_norm": ([randn(4, 9), randn(9)], lambda x, w: rms_norm(x, w, 1e-6), {}),
        "embedding": ([randn(10, 6)], lambda w: F.embedding(ids, w), {"ids": ids}),
        "masked_fill": ([randn(3, 5)], lambda x: x.masked_fill(mask.bool(), -2.5), {"mask": mask}),
        "concat": ([randn(2, 3), randn(2, 1), randn(2, 4)], lambda a, b, c: torch.cat([a, b, c], 1), {}),
        "split": ([randn(3, 5)], lambda x: torch.cat([x.split([2, 3], 1)[1] * 2, x.split([2, 3], 1)[0]], 1), {}),
        "matmul_transposed": ([randn(6, 4), randn(3, 6)], lambda a, b: a.t() @ b.t(), {}),
        "cross_entropy": ([randn(6, 7)],
                          lambda x: F.cross_entropy(x, targets, ignore_index=-100, label_smoothing=0.1),
                          {"targets": targets}),
    }


def make_ops(out_dir):
    tensors = {}
    for name, (inputs, fn, extra) in cases().items():
        xs = [x.double().requires_grad_(True) for x in inputs]
        out = fn(*xs)
        r = randn(*out.shape)
        (out * r.double()).sum().backward()
        for i, x in enumerate(inputs):
            tensors[f"{name}.in{i}"] = x.contiguous()
            tensors[f"{name}.grad{i}"] = xs[i].grad.float().contiguous()
        tensors[f"{name}.out"] = out.detach().float().contiguous()
        tensors[f"{name}.r"] = r.contiguous()
        for k, v in extra.items():
            tensors[f"{name}.{k}"] = v.contiguous()
    save_file(tensors, os.path.join(out_dir, "ops_golden.safetensors"), metadata={"producer": "scripts/make_fixtures.py",
                                                                               "torch": torch.__version__})
    return len(cases())


# ---------------------------------------------------------------- blocks
# Each case stores, under "<case>.": x (and memory), r (loss weights), out,
# grad.x (grad.memory), param.<qkv name> and pgrad.<qkv name> in qkv's
# parameter names, and lengths (key padding, I64 [B]) where used.

def rope_ref(x, offset=0, theta=10000.0):
    """Rotate channel pairs (i, i + Dh/2) by (offset + t) * theta^(-2i/Dh)."""
    t, dh = x.shape[-2], x.shape[-1]
    half = dh // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / dh)
    ang = (torch.arange(t, dtype=torch.float64) + offset)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def padding_mask(lengths, s):
    return torch.arange(s)[None, :] >= lengths[:, None]  # True = padding


def mha_params(prefix, m, cross, d):
    """torch.nn.MultiheadAttention parameters under qkv's names."""
    w, b = m.in_proj_weight, m.in_proj_bias
    if cross:
        out = {prefix + "q_proj.weight": w[:d], prefix + "q_proj.bias": b[:d],
               prefix + "kv_proj.weight": w[d:], prefix + "kv_proj.bias": b[d:]}
    else:
        out = {prefix + "qkv_proj.weight": w, prefix + "qkv_proj.bias": b}
    out[prefix + "out_proj.weight"] = m.out_proj.weight
    out[prefix + "out_proj.bias"] = m.out_proj.bias
    return out


def mha_grads(prefix, m, cross, d):
    g = {k: None for k in mha_params(prefix, m, cross, d)}
    w, b = m.in_proj_weight.grad, m.in_proj_bias.grad
    if cross:
        g.update({prefix + "q_proj.weight": w[:d], prefix + "q_proj.bias": b[:d],
                  prefix + "kv_proj.weight": w[d:], prefix + "kv_proj.bias": b[d:]})
    else:
        g.update({prefix + "qkv_proj.weight": w, prefix + "qkv_proj.bias": b})
    g[prefix + "out_proj.weight"] = m.out_proj.weight.grad
    g[prefix + "out_proj.bias"] = m.out_proj.bias.grad
    return g


def layer_params(layer, decoder, d):
    p = mha_params("self_attn.", layer.self_attn, False, d)
    if decoder:
        p.update(mha_params("cross_attn.", layer.multihead_attn, True, d))
    p["mlp.mlp.fc1.weight"], p["mlp.mlp.fc1.bias"] = layer.linear1.weight, layer.linear1.bias
    p["mlp.mlp.fc2.weight"], p["mlp.mlp.fc2.bias"] = layer.linear2.weight, layer.linear2.bias
    for i in (1, 2, 3) if decoder else (1, 2):
        n = getattr(layer, f"norm{i}")
        p[f"norm{i}.weight"], p[f"norm{i}.bias"] = n.weight, n.bias
    return p


def layer_grads(layer, decoder, d):
    g = mha_grads("self_attn.", layer.self_attn, False, d)
    if decoder:
        g.update(mha_grads("cross_attn.", layer.multihead_attn, True, d))
    g["mlp.mlp.fc1.weight"], g["mlp.mlp.fc1.bias"] = layer.linear1.weight.grad, layer.linear1.bias.grad
    g["mlp.mlp.fc2.weight"], g["mlp.mlp.fc2.bias"] = layer.linear2.weight.grad, layer.linear2.bias.grad
    for i in (1, 2, 3) if decoder else (1, 2):
        n = getattr(layer, f"norm{i}")
        g[f"norm{i}.weight"], g[f"norm{i}.bias"] = n.weight.grad, n.bias.grad
    return g


def store(t, case, tensors, out, r, params, grads, lengths=None):
    t[f"{case}.out"] = out.detach().float()
    t[f"{case}.r"] = r.float()
    for k, v in tensors.items():
        t[f"{case}.{k}"] = v.detach().float()
        t[f"{case}.grad.{k}"] = v.grad.float()
    for k, v in params.items():
        t[f"{case}.param.{k}"] = v.detach().float().contiguous()
    for k, v in grads.items():
        t[f"{case}.pgrad.{k}"] = v.float().contiguous()
    if lengths is not None:
        t[f"{case}.lengths"] = lengths


def make_blocks(out_dir):
    torch.manual_seed(11)
    t = {}
    B, T, S, D, H = 2, 6, 9, 16, 4
    dt = torch.float64

    # nn.MultiheadAttention, self-attention with a causal mask and key padding.
    m = torch.nn.MultiheadAttention(D, H, batch_first=True, dtype=dt)
    x = torch.randn(B, T, D, dtype=dt, requires_grad=True)
    lengths = torch.tensor([T, 4])
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    out, _ = m(x, x, x, attn_mask=causal, key_padding_mask=padding_mask(lengths, T), need_weights=False)
    r = torch.randn(out.shape, dtype=dt)
    (out * r).sum().backward()
    store(t, "mha_self", {"x": x}, out, r, mha_params("", m, False, D), mha_grads("", m, False, D), lengths)

    # nn.MultiheadAttention, cross-attention T != S with key padding on the memory.
    m = torch.nn.MultiheadAttention(D, H, batch_first=True, dtype=dt)
    x = torch.randn(B, T, D, dtype=dt, requires_grad=True)
    mem = torch.randn(B, S, D, dtype=dt, requires_grad=True)
    lengths = torch.tensor([S, 5])
    out, _ = m(x, mem, mem, key_padding_mask=padding_mask(lengths, S), need_weights=False)
    r = torch.randn(out.shape, dtype=dt)
    (out * r).sum().backward()
    store(t, "mha_cross", {"x": x, "memory": mem}, out, r, mha_params("", m, True, D), mha_grads("", m, True, D),
          lengths)

    # nn.TransformerEncoderLayer / DecoderLayer, Post-Norm and Pre-Norm.
    for norm_first in (False, True):
        tag = "pre" if norm_first else "post"
        enc = torch.nn.TransformerEncoderLayer(D, H, 32, dropout=0.0, batch_first=True, norm_first=norm_first,
                                               dtype=dt)
        enc.train()  # the train-mode path: no fused fast path
        x = torch.randn(B, S, D, dtype=dt, requires_grad=True)
        lengths = torch.tensor([S, 6])
        out = enc(x, src_key_padding_mask=padding_mask(lengths, S))
        r = torch.randn(out.shape, dtype=dt)
        (out * r).sum().backward()
        store(t, f"encoder_{tag}", {"x": x}, out, r, layer_params(enc, False, D), layer_grads(enc, False, D), lengths)

        dec = torch.nn.TransformerDecoderLayer(D, H, 32, dropout=0.0, batch_first=True, norm_first=norm_first,
                                               dtype=dt)
        dec.train()
        x = torch.randn(B, T, D, dtype=dt, requires_grad=True)
        mem = torch.randn(B, S, D, dtype=dt, requires_grad=True)
        lengths = torch.tensor([S, 3])
        out = dec(x, mem, tgt_mask=causal, memory_key_padding_mask=padding_mask(lengths, S))
        r = torch.randn(out.shape, dtype=dt)
        (out * r).sum().backward()
        store(t, f"decoder_{tag}", {"x": x, "memory": mem}, out, r, layer_params(dec, True, D),
              layer_grads(dec, True, D), lengths)

    # Plain PyTorch reference: grouped-query attention with QK-Norm and RoPE, causal.
    Hkv, Dh = 2, D // H
    w_qkv = (torch.randn((H + 2 * Hkv) * Dh, D, dtype=dt) / 4).requires_grad_(True)
    b_qkv = (torch.randn((H + 2 * Hkv) * Dh, dtype=dt) / 4).requires_grad_(True)
    w_o = (torch.randn(D, D, dtype=dt) / 4).requires_grad_(True)
    b_o = (torch.randn(D, dtype=dt) / 4).requires_grad_(True)
    qn = (1 + torch.randn(Dh, dtype=dt) / 4).requires_grad_(True)
    kn = (1 + torch.randn(Dh, dtype=dt) / 4).requires_grad_(True)
    x = torch.randn(B, T, D, dtype=dt, requires_grad=True)
    q, k, v = F.linear(x, w_qkv, b_qkv).split([H * Dh, Hkv * Dh, Hkv * Dh], -1)
    q = rope_ref(rms_norm(q.view(B, T, H, Dh).transpose(1, 2), qn, 1e-6), offset=3)
    k = rope_ref(rms_norm(k.view(B, T, Hkv, Dh).transpose(1, 2), kn, 1e-6), offset=3)
    v = v.view(B, T, Hkv, Dh).transpose(1, 2)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    scores = q @ k.transpose(-1, -2) / Dh ** 0.5
    scores = scores.masked_fill(causal, float("-inf"))
    out = F.linear((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D), w_o, b_o)
    r = torch.randn(out.shape, dtype=dt)
    (out * r).sum().backward()
    params = {"qkv_proj.weight": w_qkv, "qkv_proj.bias": b_qkv, "out_proj.weight": w_o, "out_proj.bias": b_o,
              "q_norm.weight": qn, "k_norm.weight": kn}
    store(t, "gqa_qknorm_rope", {"x": x}, out, r, params, {k_: v_.grad for k_, v_ in params.items()})

    # Plain PyTorch reference: SwiGLU.
    w1, w2 = [(torch.randn(24, D, dtype=dt) / 4).requires_grad_(True) for _ in range(2)]
    w3 = (torch.randn(D, 24, dtype=dt) / 4).requires_grad_(True)
    x = torch.randn(B, T, D, dtype=dt, requires_grad=True)
    out = F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w2), w3)
    r = torch.randn(out.shape, dtype=dt)
    (out * r).sum().backward()
    params = {"w1.weight": w1, "w2.weight": w2, "w3.weight": w3}
    store(t, "swiglu", {"x": x}, out, r, params, {k_: v_.grad for k_, v_ in params.items()})

    # RoPE alone, with a position offset.
    x = torch.randn(B, H, T, 8, dtype=dt, requires_grad=True)
    out = rope_ref(x, offset=5)
    r = torch.randn(out.shape, dtype=dt)
    (out * r).sum().backward()
    store(t, "rope", {"x": x}, out, r, {}, {})

    # F.scaled_dot_product_attention with a causal mask, a boolean mask, and grouped-query heads.
    q = torch.randn(B, H, T, 8, dtype=dt, requires_grad=True)
    k = torch.randn(B, 2, T, 8, dtype=dt, requires_grad=True)
    v = torch.randn(B, 2, T, 8, dtype=dt, requires_grad=True)
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    r = torch.randn(out.shape, dtype=dt)
    (out * r).sum().backward()
    store(t, "sdpa_causal_gqa", {"q": q, "k": k, "v": v}, out, r, {}, {})
    mask = torch.rand(T, T) < 0.3
    mask[:, 0] = False  # every query sees at least one key
    q, k, v = [torch.randn(B, H, T, 8, dtype=dt, requires_grad=True) for _ in range(3)]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask)  # torch: True = attend
    r = torch.randn(out.shape, dtype=dt)
    (out * r).sum().backward()
    store(t, "sdpa_bool_mask", {"q": q, "k": k, "v": v}, out, r, {}, {})
    t["sdpa_bool_mask.mask"] = mask.to(torch.uint8)  # qkv: nonzero = masked

    # Plain PyTorch reference: Mixture of Experts, 4 SwiGLU experts, top-2, with the
    # load-balancing loss in the loss: L = sum(out * r) + aux.
    E, K, Hd = 4, 2, 24
    router = (torch.randn(E, D, dtype=dt) / 2).requires_grad_(True)
    ws = {}
    for e in range(E):
        ws[f"experts.{e}.w1.weight"] = (torch.randn(Hd, D, dtype=dt) / 4).requires_grad_(True)
        ws[f"experts.{e}.w2.weight"] = (torch.randn(Hd, D, dtype=dt) / 4).requires_grad_(True)
        ws[f"experts.{e}.w3.weight"] = (torch.randn(D, Hd, dtype=dt) / 4).requires_grad_(True)
    x = torch.randn(B, T, D, dtype=dt, requires_grad=True)
    x2 = x.reshape(-1, D)
    y, aux = moe_ref(x2, router, ws, "", E, K)
    top_i = torch.softmax(x2 @ router.t(), -1).topk(K, -1)[1]
    out = y.reshape(B, T, D)
    r = torch.randn(out.shape, dtype=dt)
    ((out * r).sum() + aux).backward()
    params = {"router.weight": router, **ws}
    store(t, "moe", {"x": x}, out, r, params, {k_: v_.grad for k_, v_ in params.items()})
    t["moe.aux"] = aux.detach().float().reshape(1)
    t["moe.counts"] = F.one_hot(top_i, E).sum((0, 1))

    t = {k_: v_.contiguous() for k_, v_ in t.items()}
    save_file(t, os.path.join(out_dir, "blocks_golden.safetensors"), metadata={"torch": torch.__version__})


def sinusoidal_2d(gh, gw, d):
    """qkv's 2-D sinusoidal encoding: rows in the first d/2 channels, columns in the last d/2."""
    def one_d(n, width):
        pos = torch.arange(n, dtype=torch.float64)[:, None]
        inv = 10000.0 ** (-torch.arange(0, width, 2, dtype=torch.float64) / width)
        pe = torch.zeros(n, width, dtype=torch.float64)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * inv), torch.cos(pos * inv)
        return pe
    rows = one_d(gh, d // 2)[:, None, :].expand(gh, gw, d // 2)
    cols = one_d(gw, d // 2)[None, :, :].expand(gh, gw, d // 2)
    return torch.cat([rows, cols], -1).reshape(gh * gw, d)


def make_vit(out_dir):
    """The Vision Transformer as plain PyTorch: Conv2d patch embedding, Pre-Norm
    nn.TransformerEncoderLayer blocks with GELU, final LayerNorm, mean or class-token pooling."""
    torch.manual_seed(13)
    t = {}
    dt = torch.float64
    B, I, P, D, H, L, K = 3, 12, 4, 16, 4, 2, 5
    g = I // P
    for case, C, pool, positions in (("vit_mean_learned", 1, "mean", "learned"),
                                     ("vit_cls_sin2d", 3, "cls", "sinusoidal_2d")):
        conv = torch.nn.Conv2d(C, D, P, stride=P, dtype=dt)
        layers = [torch.nn.TransformerEncoderLayer(D, H, 2 * D, dropout=0.0, activation="gelu", batch_first=True,
                                                   norm_first=True, dtype=dt) for _ in range(L)]
        norm, head = torch.nn.LayerNorm(D, dtype=dt), torch.nn.Linear(D, K, dtype=dt)
        with torch.no_grad():  # norms that are not the identity
            for n in [norm] + [l.norm1 for l in layers] + [l.norm2 for l in layers]:
                n.weight.add_(0.2 * torch.randn(D, dtype=dt))
                n.bias.add_(0.1 * torch.randn(D, dtype=dt))
        tokens = g * g + (1 if pool == "cls" else 0)
        pos = torch.nn.Parameter(0.5 * torch.randn(tokens, D, dtype=dt)) if positions == "learned" else None
        cls = torch.nn.Parameter(0.5 * torch.randn(D, dtype=dt)) if pool == "cls" else None
        for l in layers:
            l.train()
        x = torch.randn(B, C, I, I, dtype=dt, requires_grad=True)
        z = conv(x).flatten(2).transpose(1, 2)  # [B, N, D], patches row-major
        if cls is not None:
            z = torch.cat([cls.expand(B, 1, D), z], 1)
        if pos is not None:
            z = z + pos
        else:
            pe = sinusoidal_2d(g, g, D)
            z = z + (torch.cat([torch.zeros(1, D, dtype=dt), pe]) if cls is not None else pe)
        for l in layers:
            z = l(z)
        z = norm(z)
        out = head(z[:, 0] if cls is not None else z.mean(1))
        r = torch.randn(out.shape, dtype=dt)
        (out * r).sum().backward()
        params = {"patch_embed.weight": conv.weight.reshape(D, -1), "patch_embed.bias": conv.bias,
                  "norm.weight": norm.weight, "norm.bias": norm.bias,
                  "head.weight": head.weight, "head.bias": head.bias}
        grads = {"patch_embed.weight": conv.weight.grad.reshape(D, -1), "patch_embed.bias": conv.bias.grad,
                 "norm.weight": norm.weight.grad, "norm.bias": norm.bias.grad,
                 "head.weight": head.weight.grad, "head.bias": head.bias.grad}
        if pos is not None:
            params["pos_embed"], grads["pos_embed"] = pos, pos.grad
        if cls is not None:
            params["cls_token"], grads["cls_token"] = cls, cls.grad
        for i, l in enumerate(layers):
            params.update({f"layers.{i}.{k}": v for k, v in layer_params(l, False, D).items()})
            grads.update({f"layers.{i}.{k}": v for k, v in layer_grads(l, False, D).items()})
        store(t, case, {"images": x}, out, r, params, grads)
    save_file(t, os.path.join(out_dir, "vit_golden.safetensors"), metadata={"torch": torch.__version__})


def moe_ref(x2, router, ws, prefix, E, K):
    """Top-K routing over E SwiGLU experts, gates renormalized; the Switch load-balancing loss (weight 0.01)."""
    probs = torch.softmax(x2 @ router.t(), -1)
    top_p, top_i = probs.topk(K, -1)
    gates = top_p / top_p.sum(-1, keepdim=True)
    y = torch.zeros_like(x2)
    for j in range(K):
        for e in range(E):
            sel = top_i[:, j] == e
            if sel.any():
                xe = x2[sel]
                h = F.silu(F.linear(xe, ws[f"{prefix}experts.{e}.w1.weight"])) * F.linear(xe, ws[f"{prefix}experts.{e}.w2.weight"])
                y = y.index_add(0, sel.nonzero()[:, 0], gates[sel, j:j + 1] * F.linear(h, ws[f"{prefix}experts.{e}.w3.weight"]))
    fraction = F.one_hot(top_i, E).sum(1).to(x2.dtype).mean(0) / K
    return y, 0.01 * E * (fraction * probs.mean(0)).sum()


def make_decoder(out_dir):
    """The decoder-only LM as plain PyTorch: a dense case (RMSNorm, RoPE, QK-Norm, grouped-query heads,
    SwiGLU, tied output) and a MoE case (LayerNorm, learned positions, 4 SwiGLU experts top-2, untied output).
    Loss: sum(logits * r) (+ the MoE auxiliary loss)."""
    torch.manual_seed(17)
    t = {}
    dt = torch.float64
    B, T, V, D, H, L, FF = 2, 7, 23, 16, 4, 2, 24
    Dh = D // H
    for case, moe in (("lm_dense", False), ("lm_moe", True)):
        Hkv = 2 if not moe else H
        p = {"embed.weight": torch.randn(V, D, dtype=dt) * 0.5}
        if moe:
            p["positions.weight"] = torch.randn(T + 3, D, dtype=dt) * 0.3
            p["output_proj.weight"] = torch.randn(V, D, dtype=dt) / 4
        for i in range(L):
            a = f"layers.{i}."
            p[a + "self_attn.qkv_proj.weight"] = torch.randn((H + 2 * Hkv) * Dh, D, dtype=dt) / 4
            p[a + "self_attn.qkv_proj.bias"] = torch.randn((H + 2 * Hkv) * Dh, dtype=dt) / 4
            p[a + "self_attn.out_proj.weight"] = torch.randn(D, H * Dh, dtype=dt) / 4
            p[a + "self_attn.out_proj.bias"] = torch.randn(D, dtype=dt) / 4
            if not moe:
                p[a + "self_attn.q_norm.weight"] = 1 + torch.randn(Dh, dtype=dt) / 4
                p[a + "self_attn.k_norm.weight"] = 1 + torch.randn(Dh, dtype=dt) / 4
            for n in ("norm1", "norm2"):
                p[a + n + ".weight"] = 1 + torch.randn(D, dtype=dt) / 4
                if moe:
                    p[a + n + ".bias"] = torch.randn(D, dtype=dt) / 4
            if moe:
                p[a + "mlp.router.weight"] = torch.randn(4, D, dtype=dt) / 2
                for e in range(4):
                    p[a + f"mlp.experts.{e}.w1.weight"] = torch.randn(FF, D, dtype=dt) / 4
                    p[a + f"mlp.experts.{e}.w2.weight"] = torch.randn(FF, D, dtype=dt) / 4
                    p[a + f"mlp.experts.{e}.w3.weight"] = torch.randn(D, FF, dtype=dt) / 4
            else:
                p[a + "mlp.w1.weight"] = torch.randn(FF, D, dtype=dt) / 4
                p[a + "mlp.w2.weight"] = torch.randn(FF, D, dtype=dt) / 4
                p[a + "mlp.w3.weight"] = torch.randn(D, FF, dtype=dt) / 4
        p["norm.weight"] = 1 + torch.randn(D, dtype=dt) / 4
        if moe:
            p["norm.bias"] = torch.randn(D, dtype=dt) / 4
        for v in p.values():
            v.requires_grad_(True)

        def norm(x, name):
            if moe:
                return F.layer_norm(x, (D,), p[name + ".weight"], p[name + ".bias"], 1e-5)
            return rms_norm(x, p[name + ".weight"], 1e-5)

        ids = torch.randint(0, V, (B, T))
        x = F.embedding(ids, p["embed.weight"])
        if moe:
            x = x + p["positions.weight"][:T]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        aux = torch.zeros((), dtype=dt)
        for i in range(L):
            a = f"layers.{i}."
            h = norm(x, a + "norm1")
            q, k, v = F.linear(h, p[a + "self_attn.qkv_proj.weight"], p[a + "self_attn.qkv_proj.bias"]).split(
                [H * Dh, Hkv * Dh, Hkv * Dh], -1)
            q, k = q.view(B, T, H, Dh).transpose(1, 2), k.view(B, T, Hkv, Dh).transpose(1, 2)
            v = v.view(B, T, Hkv, Dh).transpose(1, 2)
            if not moe:
                q = rope_ref(rms_norm(q, p[a + "self_attn.q_norm.weight"], 1e-6))
                k = rope_ref(rms_norm(k, p[a + "self_attn.k_norm.weight"], 1e-6))
            k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
            scores = (q @ k.transpose(-1, -2) / Dh ** 0.5).masked_fill(causal, float("-inf"))
            ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
            x = x + F.linear(ctx, p[a + "self_attn.out_proj.weight"], p[a + "self_attn.out_proj.bias"])
            h = norm(x, a + "norm2")
            if moe:
                y, aux_i = moe_ref(h.reshape(-1, D), p[a + "mlp.router.weight"], p, a + "mlp.", 4, 2)
                x = x + y.reshape(B, T, D)
                aux = aux + aux_i
            else:
                x = x + F.linear(F.silu(F.linear(h, p[a + "mlp.w1.weight"])) * F.linear(h, p[a + "mlp.w2.weight"]),
                                 p[a + "mlp.w3.weight"])
        x = norm(x, "norm")
        out = F.linear(x, p["output_proj.weight"] if moe else p["embed.weight"])
        r = torch.randn(out.shape, dtype=dt)
        ((out * r).sum() + aux).backward()
        store(t, case, {}, out, r, p, {k_: v_.grad for k_, v_ in p.items()})
        t[f"{case}.ids"] = ids
        t[f"{case}.aux"] = aux.detach().float().reshape(1)
    make_decoder_separate(t)
    t = {k_: v_.contiguous() for k_, v_ in t.items()}
    save_file(t, os.path.join(out_dir, "decoder_golden.safetensors"), metadata={"torch": torch.__version__})


def make_decoder_separate(t):
    """The layout of pretrained checkpoints (Qwen3-like): separate q/k/v projections with a bias on q and v only
    and none on out, head_dim 6 with nhead * head_dim (24) != d_model (16), RoPE theta 500000, QK-Norm with eps
    1e-3, layer RMSNorms with eps 1e-2 (large, so that a dropped eps shows), SwiGLU, tied output."""
    torch.manual_seed(29)  # its own stream: the cases above stay as they were
    dt = torch.float64
    B, T, V, D, H, Hkv, Dh, L, FF = 2, 7, 23, 16, 4, 2, 6, 2, 24
    eps, qk_eps, theta = 1e-2, 1e-3, 500000.0
    case = "lm_separate"
    p = {"embed.weight": torch.randn(V, D, dtype=dt) * 0.5}
    for i in range(L):
        a = f"layers.{i}.self_attn."
        p[a + "q_proj.weight"] = torch.randn(H * Dh, D, dtype=dt) / 4
        p[a + "q_proj.bias"] = torch.randn(H * Dh, dtype=dt) / 4
        p[a + "k_proj.weight"] = torch.randn(Hkv * Dh, D, dtype=dt) / 4
        p[a + "v_proj.weight"] = torch.randn(Hkv * Dh, D, dtype=dt) / 4
        p[a + "v_proj.bias"] = torch.randn(Hkv * Dh, dtype=dt) / 4
        p[a + "out_proj.weight"] = torch.randn(D, H * Dh, dtype=dt) / 4
        p[a + "q_norm.weight"] = 1 + torch.randn(Dh, dtype=dt) / 4
        p[a + "k_norm.weight"] = 1 + torch.randn(Dh, dtype=dt) / 4
        a = f"layers.{i}."
        for n in ("norm1", "norm2"):
            p[a + n + ".weight"] = 1 + torch.randn(D, dtype=dt) / 4
        p[a + "mlp.w1.weight"] = torch.randn(FF, D, dtype=dt) / 4
        p[a + "mlp.w2.weight"] = torch.randn(FF, D, dtype=dt) / 4
        p[a + "mlp.w3.weight"] = torch.randn(D, FF, dtype=dt) / 4
    p["norm.weight"] = 1 + torch.randn(D, dtype=dt) / 4
    for v in p.values():
        v.requires_grad_(True)
    ids = torch.randint(0, V, (B, T))
    x = F.embedding(ids, p["embed.weight"])
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for i in range(L):
        a = f"layers.{i}.self_attn."
        h = rms_norm(x, p[f"layers.{i}.norm1.weight"], eps)
        q = F.linear(h, p[a + "q_proj.weight"], p[a + "q_proj.bias"]).view(B, T, H, Dh).transpose(1, 2)
        k = F.linear(h, p[a + "k_proj.weight"]).view(B, T, Hkv, Dh).transpose(1, 2)
        v = F.linear(h, p[a + "v_proj.weight"], p[a + "v_proj.bias"]).view(B, T, Hkv, Dh).transpose(1, 2)
        q = rope_ref(rms_norm(q, p[a + "q_norm.weight"], qk_eps), theta=theta)
        k = rope_ref(rms_norm(k, p[a + "k_norm.weight"], qk_eps), theta=theta)
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        scores = (q @ k.transpose(-1, -2) / Dh ** 0.5).masked_fill(causal, float("-inf"))
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * Dh)
        x = x + F.linear(ctx, p[a + "out_proj.weight"])
        h = rms_norm(x, p[f"layers.{i}.norm2.weight"], eps)
        m = f"layers.{i}.mlp."
        x = x + F.linear(F.silu(F.linear(h, p[m + "w1.weight"])) * F.linear(h, p[m + "w2.weight"]), p[m + "w3.weight"])
    out = F.linear(rms_norm(x, p["norm.weight"], eps), p["embed.weight"])
    r = torch.randn(out.shape, dtype=dt)
    (out * r).sum().backward()
    store(t, case, {}, out, r, p, {k_: v_.grad for k_, v_ in p.items()})
    t[f"{case}.ids"] = ids


def make_metrics(out_dir):
    """sacreBLEU's corpus BLEU (tokenize='char') and chrF on fixed sentences."""
    import json
    import sacrebleu
    from sacrebleu.metrics import BLEU, CHRF
    sets = {
        "japanese": (["私は中国人です", "彼は学校で本を読みます", "この本は面白いです", "私たちはりんごが好きです",
                      "あなたは医者ですか"],
                     ["私は中国人です", "彼は図書館で本を読みます", "この本は高いです", "私たちはりんごが好きではありません",
                      "あなたは医者ですか"]),
        "with_spaces_and_latin": (["the cat sat on the mat", "a b c", "日本 語"],
                                  ["the cat is on the mat", "a b c d", "日本語"]),
        "short_and_empty": (["私", "", "はい"], ["私は学生です", "いいえ", "はい"]),
    }
    out = {}
    for name, (hyps, refs) in sets.items():
        out[name] = {"hypotheses": hyps, "references": refs,
                     "bleu": sacrebleu.corpus_bleu(hyps, [refs], tokenize="char").score,
                     "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score}
    # Bootstrap intervals (--confidence): sacreBLEU draws with numpy's RNG and qkv
    # with its own, so the test compares mean and half-width within a tolerance.
    import random
    rng = random.Random(5)
    subjects, objects = ["私", "彼", "彼女", "田中さん", "先生"], ["本", "りんご", "お茶", "新聞", "映画", "日本語"]
    verbs = ["読みます", "食べます", "飲みます", "見ます", "勉強します", "買いました"]
    refs = [f"{rng.choice(subjects)}は{rng.choice(objects)}を{rng.choice(verbs)}" for _ in range(80)]
    hyps = []
    for r in refs:
        k = rng.random()
        if k < 0.5:
            hyps.append(r)                                    # right
        elif k < 0.75:
            i = rng.randrange(len(r))
            hyps.append(r[:i] + rng.choice("のがでにへ") + r[i + 1:])  # one character wrong
        elif k < 0.9:
            hyps.append(r[: rng.randrange(1, len(r))])        # cut short
        else:
            hyps.append(rng.choice(refs))                     # another sentence
    b = BLEU(tokenize="char").corpus_score(hyps, [refs], n_bootstrap=1000)
    c = CHRF().corpus_score(hyps, [refs], n_bootstrap=1000)
    out["bootstrap"] = {"hypotheses": hyps, "references": refs, "resamples": 1000,
                        "bleu": b.score, "bleu_mean": float(b._mean), "bleu_ci": float(b._ci),
                        "chrf": c.score, "chrf_mean": float(c._mean), "chrf_ci": float(c._ci)}
    out["sacrebleu"] = sacrebleu.__version__
    with open(os.path.join(out_dir, "metrics_sacrebleu.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)


def make_mlp(out_dir):
    """A 4 -> 8 -> 3 MLP with GELU, cross-entropy, AdamW, three steps."""
    torch.manual_seed(7)
    fc1, fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)
    x = randn(5, 4)
    y = torch.tensor([0, 2, 1, 2, 0], dtype=torch.int64)
    t = {"x": x, "y": y}
    for n, p in [("fc1.weight", fc1.weight), ("fc1.bias", fc1.bias), ("fc2.weight", fc2.weight),
                 ("fc2.bias", fc2.bias)]:
        t[f"init.{n}"] = p.detach().clone()
    params = list(fc1.parameters()) + list(fc2.parameters())
    opt = torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    losses = []
    for step in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(fc2(F.gelu(fc1(x))), y)
        loss.backward()
        if step == 0:
            t["grad0.fc1.weight"] = fc1.weight.grad.clone()
            t["grad0.fc2.weight"] = fc2.weight.grad.clone()
        opt.step()
        losses.append(loss.item())
    t["losses"] = torch.tensor(losses, dtype=torch.float32)
    for n, p in [("fc1.weight", fc1.weight), ("fc1.bias", fc1.bias), ("fc2.weight", fc2.weight),
                 ("fc2.bias", fc2.bias)]:
        t[f"final.{n}"] = p.detach().clone()
    save_file(t, os.path.join(out_dir, "mlp_adamw.safetensors"), metadata={"lr": "0.01", "weight_decay": "0.1"})


def make_python_written(out_dir):
    """Every dtype qkv reads, from Python's own safetensors writer."""
    arrays = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
        "f16": np.array([1.5, -2.25, 65504.0], dtype=np.float16),
        "i64": np.array([[-3, 2**40]], dtype=np.int64),
        "i32": np.array([7, -8], dtype=np.int32),
        "i8": np.array([-128, 127], dtype=np.int8),
        "u8": np.array([0, 255], dtype=np.uint8),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    save_numpy(arrays, os.path.join(out_dir, "python_written_np.safetensors"), metadata={"source": "numpy"})
    bf16 = {"bf16": torch.tensor([1.0, -0.5, 3.140625], dtype=torch.bfloat16)}
    save_file(bf16, os.path.join(out_dir, "python_written_bf16.safetensors"))


def check_qkv_file(path):
    """A file written by qkv must load in Python with the expected contents."""
    t = load_file(path)
    expected = {"weight": torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5,
                "ids": torch.tensor([1, 2, 3], dtype=torch.int64)}
    for k, v in expected.items():
        assert k in t, f"{path}: missing {k}"
        assert t[k].dtype == v.dtype and torch.equal(t[k], v), f"{path}: {k} is {t[k]}, expected {v}"
    print(f"ok: {path} loads in Python safetensors with the expected tensors")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    ap.add_argument("--check-qkv-file", help="a safetensors file written by the qkv test suite")
    ap.add_argument("--only-metrics", action="store_true", help="rewrite metrics_sacrebleu.json alone")
    args = ap.parse_args()
    if args.check_qkv_file:
        check_qkv_file(args.check_qkv_file)
        return 0
    os.makedirs(args.out, exist_ok=True)
    if args.only_metrics:
        make_metrics(args.out)
        return 0
    n = make_ops(args.out)
    make_mlp(args.out)
    make_blocks(args.out)
    make_vit(args.out)
    make_decoder(args.out)
    make_metrics(args.out)
    make_python_written(args.out)
    print(f"wrote {n} op cases, the MLP AdamW steps and the Python-written files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
