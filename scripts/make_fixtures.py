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
Needs: torch, safetensors, numpy (pip install torch safetensors numpy).
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
    args = ap.parse_args()
    if args.check_qkv_file:
        check_qkv_file(args.check_qkv_file)
        return 0
    os.makedirs(args.out, exist_ok=True)
    n = make_ops(args.out)
    make_mlp(args.out)
    make_python_written(args.out)
    print(f"wrote {n} op cases, the MLP AdamW steps and the Python-written files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
