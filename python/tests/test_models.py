"""The same outputs from Python as from the qkv program, on the model folders of tests/fixtures."""
import json
import os
import struct
import zlib

import numpy as np
import pytest

import qkv
from conftest import FOLDERS, HF, expected_tensor, run_cli

SOURCES = ["我是中国人", "你好", "这本书很有意思", "我们喜欢猫吗"]


@pytest.mark.parametrize("family", ["transformer", "rnn_attention", "conv"])
@pytest.mark.parametrize("beam", [1, 3])
def test_translate_matches_the_cli(family, beam):
    model = qkv.load(FOLDERS / family)
    assert isinstance(model, qkv.Translator) and model.arch == family
    got = model.translate(SOURCES, beam=beam, max_len=12)
    cli = run_cli("translate", "--model", FOLDERS / family, "--beam", beam, "--max-len", 12,
                  stdin="\n".join(SOURCES).encode() + b"\n")
    assert got == cli.decode().splitlines()
    assert model.translate([s.encode() for s in SOURCES], beam=beam, max_len=12) == got  # UTF-8 bytes alike
    assert model.translate([]) == []


@pytest.mark.parametrize("dtype", ["bf16", "f16", "int8"])
def test_low_precision_loads_and_translates_as_the_cli(dtype, tmp_path):
    f32 = qkv.load(FOLDERS / "transformer")
    low = qkv.load(FOLDERS / "transformer", dtype=dtype)
    cli = run_cli("translate", "--model", FOLDERS / "transformer", "--dtype", dtype, "--max-len", 12,
                  stdin="\n".join(SOURCES).encode() + b"\n")
    assert low.translate(SOURCES, max_len=12) == cli.decode().splitlines()
    assert len(f32.translate(SOURCES, max_len=12)) == len(SOURCES)
    # A folder qkv convert wrote loads in its dtype without being asked.
    run_cli("convert", "--model", FOLDERS / "transformer", "--out", tmp_path / "converted", "--dtype", dtype)
    assert qkv.load(tmp_path / "converted").translate(SOURCES, max_len=12) == cli.decode().splitlines()


def test_a_marian_folder_translates_as_transformers_and_the_cli():
    """A Hugging Face MarianMTModel folder (source.spm, target.spm, vocab.json): the text
    generate() made of the fixture's sentences (tests/fixtures/hf/marian.expected.json), greedy
    and max_new_tokens 16, whose 16th is the </s> the folder's forced_eos_token_id forces."""
    model = qkv.load(HF / "marian")
    assert isinstance(model, qkv.Translator) and model.arch == "transformer"
    expected = json.loads((HF / "marian.expected.json").read_text())
    got = model.translate(expected["sentences"], max_len=16)
    assert got == expected["translations"]
    cli = run_cli("translate", "--model", HF / "marian", "--beam", 4, "--max-len", 16,
                  stdin="\n".join(expected["sentences"]).encode() + b"\n")
    assert model.translate(expected["sentences"], beam=4, max_len=16) == cli.decode().splitlines()


def test_generation_config_gives_the_default_beam_and_length(tmp_path):
    """beam and max_len left at None take the folder's generation_config.json, as qkv translate does."""
    import shutil
    folder = tmp_path / "with-config"
    shutil.copytree(FOLDERS / "transformer", folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"num_beams": 3, "length_penalty": 0.6, "early_stopping": True, "max_new_tokens": 12}))
    model = qkv.load(folder)
    cli = run_cli("translate", "--model", folder, stdin="\n".join(SOURCES).encode() + b"\n")
    assert model.translate(SOURCES) == cli.decode().splitlines() == model.translate(SOURCES, beam=3, max_len=12)
    (folder / "generation_config.json").write_text(json.dumps({"num_beams": "three"}))
    with pytest.raises(qkv.Error, match="generation_config.json: num_beams must be a whole number"):
        qkv.load(folder)


def test_attention_weights_per_layer_and_head():
    model = qkv.load(FOLDERS / "transformer")
    a = model.attention("我是中国人", max_len=10)
    w = a["weights"]
    assert w.dtype == np.float32 and w.ndim == 4
    layers, heads, out_len, src_len = w.shape
    assert (layers, heads) == (1, 2)  # the fixture's 1 decoder layer of 2 heads
    assert src_len == len(a["source_tokens"]) and out_len == len(a["output_tokens"])
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-5)  # each query's weights are a distribution
    assert a["translation"] == model.translate(["我是中国人"], max_len=10)[0]
    # The encoder's self-attention over the source, the decoder's masked self-attention over what it read.
    enc, dec = a["encoder_self_attention"], a["decoder_self_attention"]
    assert enc.shape == (1, 2, src_len, src_len) and dec.shape == (1, 2, out_len, out_len)
    np.testing.assert_allclose(enc.sum(axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(dec.sum(axis=-1), 1.0, rtol=1e-5)
    assert (np.triu(dec, k=1) == 0).all() and (np.triu(enc, k=1) > 0).any()
    rnn = qkv.load(FOLDERS / "rnn_attention").attention("你好", max_len=6)
    assert rnn["weights"].shape[:2] == (1, 1) and rnn["averaged"]  # one attention: one layer, one head
    assert rnn["encoder_self_attention"] is None and rnn["decoder_self_attention"] is None


GENERATORS = [FOLDERS / "decoder", HF / "gpt2", HF / "llama", HF / "qwen3"]


@pytest.mark.parametrize("folder", GENERATORS, ids=lambda p: p.name)
def test_greedy_generate_matches_the_cli(folder):
    model = qkv.load(folder)
    assert isinstance(model, qkv.LanguageModel)
    prompt = "hello world"
    got = model.generate(prompt, max_new_tokens=8, temperature=0)
    cli = run_cli("generate", "--model", folder, "--prompt", prompt, "--max-new-tokens", 8, "--temperature", 0)
    assert cli.decode() == prompt + got + "\n"
    assert "".join(model.generate(prompt, max_new_tokens=8, temperature=0, stream=True)) == got


def test_sampling_is_seeded_as_in_the_cli():
    folder = HF / "llama"
    model = qkv.load(folder)
    opts = dict(max_new_tokens=10, temperature=0.9, top_k=20, top_p=0.9, seed=7, ignore_eos=True)
    got = model.generate("the", **opts)
    assert got == model.generate("the", **opts)
    cli = run_cli("generate", "--model", folder, "--prompt", "the", "--max-new-tokens", 10, "--temperature", 0.9,
                  "--top-k", 20, "--top-p", 0.9, "--seed", 7, "--ignore-eos")
    assert cli.decode() == "the" + got + "\n"
    got = model.generate("the", max_new_tokens=10, temperature=1.3, min_p=0.1, seed=4, ignore_eos=True)
    cli = run_cli("generate", "--model", folder, "--prompt", "the", "--max-new-tokens", 10, "--temperature", 1.3,
                  "--top-k", 0, "--top-p", 1, "--min-p", 0.1, "--seed", 4, "--ignore-eos")  # (not the folder's top_k)
    assert cli.decode() == "the" + got + "\n"
    got = model.generate("the", max_new_tokens=10, temperature=1.3, typical_p=0.6, seed=4, ignore_eos=True)
    cli = run_cli("generate", "--model", folder, "--prompt", "the", "--max-new-tokens", 10, "--temperature", 1.3,
                  "--top-k", 0, "--top-p", 1, "--typical-p", 0.6, "--seed", 4, "--ignore-eos")
    assert cli.decode() == "the" + got + "\n"
    got = model.generate("the", max_new_tokens=10, temperature=0, presence_penalty=-2, frequency_penalty=-1.5)
    cli = run_cli("generate", "--model", folder, "--prompt", "the", "--max-new-tokens", 10, "--temperature", 0,
                  "--presence-penalty", -2, "--frequency-penalty", -1.5)
    assert cli.decode() == "the" + got + "\n"
    assert got != model.generate("the", max_new_tokens=10, temperature=0)  # the penalties change the greedy text
    # min_p 1 keeps only the most likely token: greedy
    assert model.generate("the", max_new_tokens=10, min_p=1.0, seed=4) == model.generate("the", max_new_tokens=10,
                                                                                          temperature=0)


def test_score_gives_the_log_softmax_of_transformers_logits():
    """score(): each token's log-probability given those before it, against log_softmax of the logits that
    transformers computed for the llama fixture's prompt (tests/fixtures/hf/llama.expected.*); a text is
    tokenized as transformers tokenizes it, after <bos>; a list of prompts gives what each gives alone."""
    folder = HF / "llama"
    model = qkv.load(folder)
    expected = json.loads((HF / "llama.expected.json").read_text())
    logits = expected_tensor(HF / "llama.expected.safetensors", "logits")[0].astype(np.float64)
    log_softmax = logits - logits.max(-1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
    ids = expected_tensor(HF / "llama.expected.safetensors", "ids")[0].tolist()  # the ids of those logits
    want = [log_softmax[i - 1, ids[i]] for i in range(1, len(ids))]
    got = model.score(ids)
    assert got["tokens"] == ids and got["logprobs"][0] is None
    np.testing.assert_allclose(got["logprobs"][1:], want, atol=1e-4)
    assert model.score(expected["prompt"])["tokens"] == expected["prompt_ids"]
    prompts = [ids, "the cat", [5, 6, 7], expected["prompt"].encode()]
    each = model.score(prompts)
    assert [e["tokens"] for e in each] == [model.score(p)["tokens"] for p in prompts]
    for together, prompt in zip(each, prompts):
        alone = model.score(prompt)["logprobs"]
        assert together["logprobs"][0] is None and alone[0] is None
        np.testing.assert_allclose(together["logprobs"][1:], alone[1:], atol=1e-5)
    with pytest.raises(qkv.Error, match="outside the vocabulary"):
        model.score([1, 2, 10**6])
    with pytest.raises(qkv.Error, match="prompt 2 is empty"):
        model.score(["a", []])
    with pytest.raises(qkv.Error, match="fit \\(the context is"):
        model.score(list(range(5)) * 10000)
    with pytest.raises(TypeError, match="expected str, bytes or a list of token ids"):
        model.score(3)
    with pytest.raises(TypeError, match="token ids must be int"):
        model.score([[1, 2.0]])


def test_chat_runs_the_folders_template(tmp_path):
    """The qwen2 fixture's chat template (tokenizer_config.json): chat_prompt is the text transformers'
    apply_chat_template renders (tests/fixtures/hf/qwen2.chat.expected.json), chat() is generate() on it up
    to <|im_end|>; what a template refuses is a qkv.Error."""
    import shutil
    model = qkv.load(HF / "qwen2")
    expected = json.loads((HF / "qwen2.chat.expected.json").read_text())[0]
    prompt = model.chat_prompt(expected["messages"])
    assert prompt == expected["text"]
    whole = model.generate(prompt, max_new_tokens=10, temperature=0)
    assert model.chat(expected["messages"], max_new_tokens=10, temperature=0) == whole.split("<|im_end|>")[0]
    folder = tmp_path / "strict"
    shutil.copytree(FOLDERS / "decoder", folder)
    template = "{% if messages[-1].role != 'user' %}{{ raise_exception('the user speaks last') }}{% endif %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    strict = qkv.load(folder)
    with pytest.raises(qkv.Error, match="the chat template says: the user speaks last"):
        strict.chat([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    with pytest.raises(qkv.Error, match=r"messages\[0\]: \"content\" must be a str"):
        strict.chat_prompt([{"role": "user", "content": 3}])
    with pytest.raises(qkv.Error, match="cannot chat: its folder defines no chat template"):
        qkv.load(FOLDERS / "decoder").chat(expected["messages"])


def test_a_stream_left_early_stops_and_the_model_goes_on():
    model = qkv.load(FOLDERS / "decoder")
    stream = model.generate("hello", max_new_tokens=12, temperature=0, ignore_eos=True, stream=True)
    first = next(stream)
    stream.close()  # ends the generation; the model is free again
    whole = model.generate("hello", max_new_tokens=12, temperature=0, ignore_eos=True)
    assert whole.startswith(first)
    assert model.tokenize("hello") == model.tokenize(b"hello") and len(model.tokenize("hello")) > 0


def write_png(path, pixels):
    """An 8-bit grayscale PNG of a 2-D uint8 array (no library needed)."""
    h, w = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) +
                     chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_classify_matches_the_cli(tmp_path):
    model = qkv.load(FOLDERS / "vit")
    assert isinstance(model, qkv.ImageClassifier) and model.class_names == ["dark", "light"]
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 8, 8), dtype=np.uint8)
    paths = []
    for i, im in enumerate(images):
        write_png(tmp_path / f"{i}.png", im)
        paths.append(str(tmp_path / f"{i}.png"))
    cli = json.loads(run_cli("classify", "--model", FOLDERS / "vit", "--json", "--top-k", 2, *paths))
    from_array = model.classify(images, top_k=2)
    from_paths = model.classify(paths, top_k=2)
    assert from_array == from_paths
    for mine, theirs in zip(from_array, cli):
        assert [label for label, _ in mine] == [t["label"] for t in theirs["top"]]
        np.testing.assert_allclose([p for _, p in mine], [t["probability"] for t in theirs["top"]], rtol=1e-6)
    probs = model.probabilities(images[:, None])  # [B, C, H, W] alike
    assert probs.shape == (3, 2)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(model.probabilities(images[0]), probs[:1], rtol=1e-6)  # one image [H, W]


def test_embed_matches_the_cli_and_sentence_transformers():
    """A BertModel folder with sentence-transformers' pooling and Normalize: the same vectors as
    qkv embed prints, and as SentenceTransformer.encode() recorded (tests/fixtures/hf/bert.expected.*)."""
    model = qkv.load(HF / "bert")
    assert isinstance(model, qkv.Embedder) and model.dimension == 32
    sentences = json.loads((HF / "bert.expected.json").read_text())["sentences"]
    got = model.embed(sentences, truncate=True)
    assert got.dtype == np.float32 and got.shape == (len(sentences), 32)
    cli = run_cli("embed", "--truncate", "--model", HF / "bert", stdin="\n".join(sentences).encode() + b"\n")
    assert np.array_equal(got, np.array([json.loads(line) for line in cli.decode().splitlines()], dtype=np.float32))
    want = expected_tensor(HF / "bert.expected.safetensors", "embeddings")
    assert np.abs(got - want).max() < 1e-4
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    with pytest.raises(qkv.Error, match="embed: text 5: .* tokens, more than the 22"):
        model.embed(sentences)
    with pytest.raises(TypeError, match="one text goes in a list"):
        model.embed("just one")


def test_threads_and_runtime():
    model = qkv.load(FOLDERS / "transformer", threads=2)
    assert model.threads == 2
    assert model.translate(["你好"], max_len=8) == qkv.load(FOLDERS / "transformer").translate(["你好"], max_len=8)
    assert "gemm:" in qkv.runtime() and "cpu:" in qkv.runtime()


def test_calls_reuse_their_worker_threads():
    """A call's compute runs on a worker thread that is kept for the next call, and with it its OpenMP
    threads (docs/python.md): the process has the same threads after each call, streamed or not."""
    lm = qkv.load(FOLDERS / "decoder", threads=2)
    tr = qkv.load(FOLDERS / "transformer", threads=2)
    lm.generate("hello", max_new_tokens=2, temperature=0)
    threads = set(os.listdir("/proc/self/task"))
    assert len(threads) >= 3  # this one, the worker, its second OpenMP thread
    for _ in range(3):
        lm.generate("hello", max_new_tokens=2, temperature=0)
        list(lm.generate("hi", max_new_tokens=2, stream=True))
        tr.translate(["你好"], max_len=4)
        assert set(os.listdir("/proc/self/task")) == threads


def test_a_forked_child_runs_models():
    """After fork() the child has none of the parent's threads, so it starts workers of its own
    (the parent's idle ones would never run its calls)."""
    import time
    lm = qkv.load(FOLDERS / "decoder", threads=2)
    want = lm.generate("hello", max_new_tokens=4, temperature=0)
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = lm.generate("hello", max_new_tokens=4, temperature=0) == want
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child's generate did not return within 60 s")
