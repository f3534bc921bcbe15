"""Bad input from Python raises the right exception with qkv's one-line message, and the
interpreter goes on: the same model answers the next call."""
import shutil

import numpy as np
import pytest

import qkv
from conftest import FOLDERS


@pytest.fixture(scope="module")
def translator():
    return qkv.load(FOLDERS / "transformer")


def test_error_is_a_value_error():
    assert issubclass(qkv.Error, ValueError)


def test_missing_and_broken_folders(tmp_path):
    with pytest.raises(qkv.Error, match="nope"):
        qkv.load(tmp_path / "nope")
    broken = tmp_path / "broken"
    shutil.copytree(FOLDERS / "transformer", broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])  # cut in the middle of its tensors
    with pytest.raises(qkv.Error, match="model.safetensors") as e:
        qkv.load(broken)
    assert "\n" not in str(e.value)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(qkv.Error, match="config.json"):
        qkv.load(broken)
    with pytest.raises(qkv.Error, match="dtype 'f64'"):
        qkv.load(FOLDERS / "transformer", dtype="f64")
    with pytest.raises(qkv.Error, match="threads=-1"):
        qkv.load(FOLDERS / "transformer", threads=-1)


def test_wrong_types(translator):
    with pytest.raises(TypeError, match=r"list of str.*\[text\]"):
        translator.translate("我是中国人")  # one text, not a list
    with pytest.raises(TypeError, match="source 2: expected str or bytes, got int"):
        translator.translate(["你好", 3])
    with pytest.raises(TypeError):
        translator.translate(["你好"], beam="wide")
    with pytest.raises(TypeError):
        qkv.load(42)
    assert translator.translate(["你好"], max_len=4)  # still answering


def test_invalid_text(translator):
    with pytest.raises(qkv.Error, match=r"translate: source 2: invalid UTF-8 at byte 3"):
        translator.translate(["你好", b"ab\xff"])
    with pytest.raises(qkv.Error, match="lone surrogate"):
        translator.translate(["ab\udc80"])
    lm = qkv.load(FOLDERS / "decoder")
    with pytest.raises(qkv.Error, match="generate: prompt: invalid UTF-8 at byte 1"):
        lm.generate(b"\xc3", max_new_tokens=2)
    assert isinstance(lm.generate(b"ok", max_new_tokens=2), str)


def test_bad_values(translator):
    with pytest.raises(qkv.Error, match="beam must be at least 1"):
        translator.translate(["你好"], beam=0)
    with pytest.raises(qkv.Error, match="too long|tokens"):
        translator.translate(["你" * 5000])  # past the model's learned positions
    lm = qkv.load(FOLDERS / "decoder")
    with pytest.raises(qkv.Error, match="top_p"):
        lm.generate("a", top_p=0)
    with pytest.raises(qkv.Error, match="min_p"):
        lm.generate("a", min_p=-0.5)
    with pytest.raises(qkv.Error, match="typical_p"):
        lm.generate("a", typical_p=0)
    with pytest.raises(qkv.Error, match="frequency_penalty"):
        lm.generate("a", frequency_penalty=2.5)
    with pytest.raises(qkv.Error, match="temperature"):
        lm.generate("a", temperature=-1)
    vit = qkv.load(FOLDERS / "vit")
    with pytest.raises(qkv.Error, match="the model takes 1x8x8"):
        vit.classify(np.zeros((2, 9, 9), np.uint8))
    with pytest.raises(qkv.Error, match="uint8 array"):
        vit.classify(np.zeros((2, 8, 8), np.float32))
    with pytest.raises(qkv.Error, match="cannot|no such|missing|not found|open"):
        vit.classify(["/no/such/image.png"])
    assert len(translator.translate(["你好"], max_len=4)) == 1
