"""qkv.train: a model trained from Python is a model folder the qkv program reads, and back;
callbacks see every step; Ctrl-C ends a long run cleanly."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import qkv
from conftest import run_cli

TINY = {"d_model": 16, "nhead": 2, "num_encoder_layers": 1, "num_decoder_layers": 1, "dim_feedforward": 32,
        "train": {"steps": 6, "batch_tokens": 256, "eval_every": 3, "eval_sentences": 4}}


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


def test_train_then_the_cli_reads_it_and_back(tmp_path, tiny_config, zh_ja):
    steps, evals = [], []
    out = tmp_path / "model"
    result = qkv.train(tiny_config, train=zh_ja / "train.tsv", valid=zh_ja / "test.tsv", out=out,
                       on_step=steps.append, on_eval=evals.append, verbose=False)
    assert result == {"out": str(out), "last_step": 6, "stopped_early": ""}
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6] and all(s["total_steps"] == 6 for s in steps)
    assert all(s["loss"] > 0 and s["tokens_per_second"] > 0 for s in steps)
    assert [e["step"] for e in evals] == [3, 6] and all(0 <= e["chrf"] <= 100 for e in evals)
    # The folder is the program's: qkv translate reads it and agrees with Python.
    sources = [line.split("\t")[0] for line in (zh_ja / "test.tsv").read_text().splitlines()[:5]]
    cli = run_cli("translate", "--model", out, "--max-len", 20, stdin=("\n".join(sources) + "\n").encode())
    assert qkv.load(out).translate(sources, max_len=20) == cli.decode().splitlines()
    # And back: the program resumes what Python trained, and Python what the program resumed.
    run_cli("train", "--config", tiny_config, "--train", zh_ja / "train.tsv", "--valid", zh_ja / "test.tsv",
            "--out", out, "--steps", 8, "--resume")
    again = qkv.train(tiny_config, train=zh_ja / "train.tsv", valid=zh_ja / "test.tsv", out=out, steps=9,
                      resume=True, verbose=False)
    assert again["last_step"] == 9
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 9


def test_on_eval_can_stop_and_errors_propagate(tmp_path, tiny_config, zh_ja):
    result = qkv.train(tiny_config, train=zh_ja / "train.tsv", out=tmp_path / "m", steps=12,
                       on_eval=lambda r: r["step"] >= 3, verbose=False)
    assert result["last_step"] == 3 and result["stopped_early"]

    def boom(report):
        raise RuntimeError("from the callback")

    with pytest.raises(RuntimeError, match="from the callback"):
        qkv.train(tiny_config, train=zh_ja / "train.tsv", out=tmp_path / "m2", on_step=boom, verbose=False)
    with pytest.raises(qkv.Error, match="steps must be at least 1"):
        qkv.train(tiny_config, train=zh_ja / "train.tsv", out=tmp_path / "m3", steps=0)
    with pytest.raises(qkv.Error, match="missing.tsv"):
        qkv.train(tiny_config, train=tmp_path / "missing.tsv", out=tmp_path / "m3")
    with pytest.raises(qkv.Error, match="epochs is for vit"):
        qkv.train(tiny_config, train=zh_ja / "train.tsv", out=tmp_path / "m3", epochs=2)
    with pytest.raises(qkv.Error, match="precision must be 'f32' or 'bf16', got 'fp8'"):
        qkv.train(tiny_config, train=zh_ja / "train.tsv", out=tmp_path / "m3", precision="fp8")


def test_init_fine_tunes_a_hugging_face_folder_without_a_config(tmp_path):
    fixtures = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "hf", "llama")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 300)
    result = qkv.train(init=fixtures, train=text, out=tmp_path / "ft", steps=2, verbose=False)
    assert result["last_step"] == 2
    tuned = qkv.load(tmp_path / "ft")
    assert tuned.arch == "decoder" and isinstance(tuned.generate("the quick", max_new_tokens=3, temperature=0), str)
    with pytest.raises(qkv.Error, match="config is required"):
        qkv.train(train=text, out=tmp_path / "none")


def test_mixed_precision_trains_and_saves_a_float32_folder(tmp_path, tiny_config, zh_ja):
    out = tmp_path / "bf16"
    result = qkv.train(tiny_config, train=zh_ja / "train.tsv", valid=zh_ja / "test.tsv", out=out, steps=3,
                       precision="bf16", verbose=False)
    assert result["last_step"] == 3
    assert len(qkv.load(out).translate(["我是中国人"], max_len=8)) == 1


def test_ctrl_c_interrupts_a_long_run(tmp_path, tiny_config, zh_ja):
    """SIGINT (Ctrl-C) during qkv.train raises KeyboardInterrupt at the next step, promptly,
    and the interpreter goes on to run more Python."""
    script = textwrap.dedent(f"""
        import sys, time, qkv
        started = []
        try:
            qkv.train({str(tiny_config)!r}, train={str(zh_ja / 'train.tsv')!r}, out={str(tmp_path / 'long')!r},
                      steps=100000, verbose=False,
                      on_step=lambda s: started or (started.append(1), print("training", flush=True)))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(0)
        sys.exit(3)
    """)
    env = dict(os.environ)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         text=True)
    assert p.stdout.readline().strip() == "training"
    p.send_signal(signal.SIGINT)
    start = time.monotonic()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "interrupted" in out
    assert time.monotonic() - start < 10
