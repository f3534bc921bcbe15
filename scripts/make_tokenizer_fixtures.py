#!/usr/bin/env python3
"""Writes the tokenizer parity fixtures (tests/fixtures/tokenizers/): small
BPE tokenizer.json files trained locally with the `tokenizers`
library, a test text, and what the library makes of each of its lines.

  gpt2    ByteLevel pre-tokenizer with GPT-2's split pattern, <|endoftext|>,
          a <mask> token that takes the white space before it (lstrip)
  llama3  Llama 3's split pattern (Split, then ByteLevel without its own
          pattern), ignore_merges, a template that puts <|begin_of_text|>
          first, a single_word added token
  qwen2   NFC normalizer, Qwen2's split pattern, <|im_start|> and <|im_end|>,
          a normalized added token ("café") found in the normalized text

  llama2  SentencePiece-style BPE as Llama 2's tokenizer.json has it: the
          normalizer prepends U+2581 and turns spaces into it, no
          pre-tokenizer, byte_fallback to <0x00>..<0xFF> (ids 3 to 258) for
          characters outside the vocabulary, fuse_unk, a template that puts
          <s> first, the decoder Replace, ByteFallback, Fuse, Strip
  spm     the same model behind a Metaspace pre-tokenizer (prepend_scheme
          "first", split), decoded by ByteFallback, then Metaspace

  bert    WordPiece as BERT's tokenizer.json has it: BertNormalizer (clean
          the text, spaces around CJK ideographs, strip accents, lowercase),
          BertPreTokenizer, the WordPiece model with "##" continuations and
          [UNK], a template [CLS] $A [SEP], the WordPiece decoder (cleanup on)
  unigram T5's kind: NFKC, a Metaspace pre-tokenizer (prepend_scheme
          "always"), the Unigram model (Viterbi over piece scores; characters
          outside the vocabulary fused into one <unk>), a template $A </s>,
          the Metaspace decoder
  xlmr    XLM-R's kind: a SentencePiece Unigram model trained with nmt_nfkc,
          its compiled rules as the Precompiled normalizer (then runs of
          spaces made one), Metaspace, a template <s> $A </s>
text.txt has 5,000 lines of English, Chinese, Japanese, emoji, digits, runs
of white space (tabs, U+00A0, U+3000, U+0085, carriage returns), combining
accents, added tokens written out, and invalid UTF-8. Lines are split at
b"\\n" only; each is read as Python reads bytes (invalid parts replaced by
U+FFFD). For each tokenizer, NAME.expected has one line per text line:

  <number of ids> <FNV-1a 32 of the ids> <FNV-1a 32 of the decoded text>

(ids as 4 little-endian bytes each; the decoded text is decode(ids,
skip_special_tokens=True), as UTF-8). The C++ test recomputes all three.

  llama2-spm  a folder with Llama 2's kind of tokenizer.model and no
          tokenizer.json (make_sentencepiece_folder), expected from the
          sentencepiece package itself

Usage: python3 scripts/make_tokenizer_fixtures.py [--out DIR] [--only NAME ...]   (--only: just those, text.txt kept)
       python3 scripts/make_tokenizer_fixtures.py --show NAME LINE   (the ids of one line, for a failing test)
Needs: tokenizers, sentencepiece and protobuf (pip install tokenizers sentencepiece protobuf).
"""
import argparse
import json
import os
import random
import struct
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizers")
VOCAB = 512

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")

ENGLISH = ("the quick brown fox jumps over a lazy dog while attention heads look back at every token they have "
           "seen before Transformers encode decode translate query key value softmax").split()
CONTRACTIONS = ["don't", "it's", "I'LL", "we've", "they're", "she'd", "I'm", "You'RE", "o'clock", "rock'n'roll"]
CHINESE = list("我是中国人你好世界今天天气很好我们学习注意力机制翻译模型的编码器和解码器")
JAPANESE = ["私は中国人です", "こんにちは", "コンピュータ", "ありがとうございます", "東京都", "ｶﾀｶﾅ", "日本語の文章"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "🤖", "✨"]
SPACES = ["  ", "   ", "\t", "\t\t", " \u00a0 ", "\u3000", "\u0085", "\r", " \r", "\u2028", "\u200b", "\u180e", "\u000b\u000c"]
ACCENTS = ["cafe\u0301", "café", "nai\u0308ve", "Ångström", "A\u030angstro\u0308m"]
ADDED = ["<|endoftext|>", "<mask>", " <mask>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "qkv", "xqkv"]
INVALID = [b"\xff", b"\xe3\x81", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xe2\x82"]


def fragment(rng):
    kind = rng.randrange(10)
    if kind == 0:
        return " ".join(rng.choice(ENGLISH) for _ in range(rng.randint(1, 6))).encode()
    if kind == 1:
        return rng.choice(CONTRACTIONS).encode()
    if kind == 2:
        return "".join(rng.choice(CHINESE) for _ in range(rng.randint(1, 8))).encode()
    if kind == 3:
        return rng.choice(JAPANESE).encode()
    if kind == 4:
        return rng.choice(EMOJI).encode()
    if kind == 5:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9)))
        return rng.choice([digits, digits + "." + digits[:2], "1,000", "3.14159", "２０２６"]).encode()
    if kind == 6:
        return rng.choice(SPACES).encode()
    if kind == 7:
        return rng.choice(ACCENTS).encode()
    if kind == 8:
        return rng.choice(ADDED).encode()
    return rng.choice(INVALID) if rng.random() < 0.5 else rng.choice(["!", "?!", "...", "(x)", "—", "«»", "#1"]).encode()


def make_text(seed, lines):
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        if rng.random() < 0.03:
            out.append(b"")
            continue
        parts = [fragment(rng) for _ in range(rng.randint(1, 6))]
        out.append(b"".join(p + (b" " if rng.random() < 0.6 else b"") for p in parts))
    return out


SPACE = "\u2581"


def build_sentencepiece(name, corpus):
    """Llama 2's kind: the vocabulary trained with BPE on words, then laid out
    as Llama 2's is (<unk>, <s>, </s>, the 256 byte tokens, the rest)."""
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 256 - 16, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=120, show_progress=False)
    trained.train_from_iterator(corpus, trainer)
    model = json.loads(trained.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    order = specials + [f"<0x{b:02X}>" for b in range(256)]
    order += [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if t not in specials]
    vocab = {t: i for i, t in enumerate(order)}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if name == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
        tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=True)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                         decoders.Metaspace(replacement=SPACE, prepend_scheme="first")])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def build_wordpiece(corpus):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                        show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    return tok


def build_unigram(corpus):
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    trainer = trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                      show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", eos)])
    tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    return tok


def build_xlmr(corpus):
    """XLM-R's kind: a SentencePiece Unigram model trained with the nmt_nfkc rules, as a tokenizer.json the
    way transformers converts one: the Precompiled normalizer (SentencePiece's compiled rules), runs of
    spaces made one, Metaspace, the model's pieces and scores, <s> $A </s>."""
    import tempfile

    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "xlmr")
        spm.SentencePieceTrainer.train(sentence_iterator=iter([c for c in corpus if c]), model_prefix=prefix,
                                       vocab_size=VOCAB, model_type="unigram", normalization_rule_name="nmt_nfkc",
                                       character_coverage=0.98, num_threads=1, minloglevel=2)
        proto = sentencepiece_model_pb2.ModelProto()
        with open(prefix + ".model", "rb") as f:
            proto.ParseFromString(f.read())
    pieces = [(p.piece, p.score) for p in proto.pieces]
    unk = next(i for i, p in enumerate(proto.pieces) if p.type == sentencepiece_model_pb2.ModelProto.SentencePiece.UNKNOWN)
    tok = Tokenizer(models.Unigram(pieces, unk_id=unk, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", bos), ("</s>", eos)])
    tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    tok.add_special_tokens(["<s>", "</s>", "<unk>"])
    return tok


def build(name, corpus):
    if name == "xlmr":
        return build_xlmr(corpus)
    if name == "bert":
        return build_wordpiece(corpus)
    if name == "unigram":
        return build_unigram(corpus)
    if name in ("llama2", "spm"):
        return build_sentencepiece(name, corpus)
    if name == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        specials = ["<|endoftext|>"]
    elif name == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    else:
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 4, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    if name == "gpt2":
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    elif name == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B:1",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
        tok.add_tokens([AddedToken("qkv", single_word=True, normalized=False)])
    else:
        tok.add_tokens([AddedToken("café", normalized=True)])
    return tok


def make_sentencepiece_folder(out, corpus, text):
    """llama2-spm/: a tokenizer.model as Llama 2's (SentencePiece BPE, byte fallback, digits split, <unk> 0,
    <s> 1, </s> 2, the dummy-prefix space) with its tokenizer_config.json, no tokenizer.json. The expected
    ids are SentencePiece's own with <s> first (as the slow LlamaTokenizer and llama.cpp give them); the
    text is SentencePiece's decoding of the ids other than <s>, </s> and <unk>."""
    import sentencepiece as spm
    folder = os.path.join(out, "llama2-spm")
    os.makedirs(folder, exist_ok=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter([c for c in corpus if c]),
                                   model_prefix=os.path.join(folder, "tokenizer"), vocab_size=VOCAB,
                                   model_type="bpe", byte_fallback=True, split_digits=True,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   allow_whitespace_only_pieces=True, character_coverage=0.9995,
                                   num_threads=1, minloglevel=2)
    os.remove(os.path.join(folder, "tokenizer.vocab"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                   "add_bos_token": True, "add_eos_token": False}, f, indent=1)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "tokenizer.model"))
    rows = []
    for line in text:
        s = line.decode("utf-8", errors="replace")
        ids = [sp.bos_id()] + sp.encode(s)
        decoded = sp.decode([i for i in ids if i not in (sp.bos_id(), sp.eos_id(), sp.unk_id())])
        rows.append(f"{len(ids)} {fnv(struct.pack(f'<{len(ids)}I', *ids)):08x} {fnv(decoded.encode()):08x}")
    with open(os.path.join(out, "llama2-spm.expected"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print(f"llama2-spm: {sp.get_piece_size()} pieces")


def fnv(data):
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="write only these tokenizers (and keep text.txt)")
    ap.add_argument("--show", nargs=2, metavar=("NAME", "LINE"), help="print the ids of one line (1-based)")
    args = ap.parse_args()
    if args.show:
        tok = Tokenizer.from_file(os.path.join(args.out, args.show[0] + ".json"))
        line = open(os.path.join(args.out, "text.txt"), "rb").read().split(b"\n")[int(args.show[1]) - 1]
        text = line.decode("utf-8", errors="replace")
        print(repr(text))
        print(tok.encode(text, add_special_tokens=False).ids)
        return 0
    os.makedirs(args.out, exist_ok=True)
    corpus = [l.decode("utf-8", errors="replace") for l in make_text(1, 3000)]
    text = make_text(2, 5000)
    if not args.only:
        with open(os.path.join(args.out, "text.txt"), "wb") as f:
            f.write(b"\n".join(text))
    for name in args.only or ("gpt2", "llama3", "qwen2", "llama2", "spm", "bert", "unigram", "xlmr", "llama2-spm"):
        if name == "llama2-spm":
            make_sentencepiece_folder(args.out, corpus, text)
            continue
        tok = build(name, corpus)
        tok.save(os.path.join(args.out, name + ".json"))
        rows = []
        for line in text:
            s = line.decode("utf-8", errors="replace")
            ids = tok.encode(s, add_special_tokens=False).ids
            decoded = tok.decode(ids, skip_special_tokens=True)
            rows.append(f"{len(ids)} {fnv(struct.pack(f'<{len(ids)}I', *ids)):08x} {fnv(decoded.encode()):08x}")
        with open(os.path.join(args.out, name + ".expected"), "w") as f:
            f.write("\n".join(rows) + "\n")
        with_specials = tok.encode("hello", add_special_tokens=True).ids
        print(f"{name}: {tok.get_vocab_size()} tokens; 'hello' with specials: {with_specials}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
