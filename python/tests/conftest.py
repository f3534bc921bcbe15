"""What the Python tests share: the qkv program and the fixtures they compare with.

make test runs them (tests/CMakeLists.txt) with PYTHONPATH at the build tree's
python/ folder, QKV_CLI at the qkv program and QKV_FIXTURES at tests/fixtures.
"""
import json
import os
import pathlib
import struct
import subprocess

import numpy as np

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(os.environ.get("QKV_FIXTURES", ROOT / "tests" / "fixtures"))
FOLDERS = FIXTURES / "folders"
HF = FIXTURES / "hf"
CLI = os.environ.get("QKV_CLI", str(ROOT / "build" / "release" / "qkv"))


def run_cli(*args, stdin=None):
    """Runs the qkv program; returns its stdout (bytes); a non-zero exit fails the test."""
    r = subprocess.run([CLI, *map(str, args)], input=stdin, capture_output=True, timeout=300)
    assert r.returncode == 0, f"qkv {' '.join(map(str, args))}: exit {r.returncode}: {r.stderr.decode()}"
    return r.stdout


@pytest.fixture(scope="session")
def zh_ja(tmp_path_factory):
    """A small synthetic zh-ja corpus (qkv data synth-zh-ja), train and test TSVs."""
    d = tmp_path_factory.mktemp("zh_ja")
    run_cli("data", "synth-zh-ja", "--pairs", 300, "--seed", 1, "--out", d / "train.tsv")
    run_cli("data", "synth-zh-ja", "--pairs", 20, "--seed", 2, "--exclude", d / "train.tsv", "--out", d / "test.tsv")
    return d


def expected_tensor(path, name):
    """One F32 or I64 tensor of a safetensors file, read with NumPy alone."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    begin, end = header[name]["data_offsets"]
    dtype = {"F32": np.float32, "I64": np.int64}[header[name]["dtype"]]
    return np.frombuffer(data[8 + n + begin:8 + n + end], dtype=dtype).reshape(header[name]["shape"])
