// tokenizer.json parity (tests/fixtures/tokenizers, from
// scripts/make_tokenizer_fixtures.py): byte-level BPE tokenizers of the GPT-2,
// Llama 3 and Qwen2 kinds, trained locally with the `tokenizers` library, give
// the library's ids and decoded text on every line of a 5,000-line text of
// English, Chinese, Japanese, emoji, digits, white space runs, added tokens
// and invalid UTF-8. What qkv does not read is one error naming the field.
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "qkv/tokenizer.h"
#include "qkv/utf8.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::error_of;
using testing::fnv;
using testing::hex;
using testing::split_lines;

std::string fixture(const std::string& name) { return std::string(QKV_FIXTURES_DIR) + "/tokenizers/" + name; }

class TokenizerParity : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerParity, IdsAndDecodedTextMatchTheTokenizersLibraryOnEveryLine) {
  const std::string name = GetParam();
  std::unique_ptr<Tokenizer> tok = load_hf_tokenizer(fixture(name + ".json"), {});
  const std::vector<std::string> text = split_lines(read_file(fixture("text.txt")));
  std::vector<std::string> expected = split_lines(read_file(fixture(name + ".expected")));
  if (!expected.empty() && expected.back().empty()) expected.pop_back();
  ASSERT_EQ(text.size(), 5000u);
  ASSERT_EQ(expected.size(), text.size());
  int wrong = 0;
  size_t ids_total = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const std::vector<int64_t> ids = tok->encode(text[i]);
    ids_total += ids.size();
    const std::string got = std::to_string(ids.size()) + " " + hex(fnv(ids)) + " " + hex(fnv(replace_invalid_utf8(tok->decode(ids))));
    if (got == expected[i]) continue;
    if (++wrong <= 5) {
      std::string shown;
      for (int64_t id : ids) shown.append(shown.empty() ? "" : " ").append(std::to_string(id));
      ADD_FAILURE() << name << " line " << i + 1 << " '" << replace_invalid_utf8(text[i]) << "': qkv " << got
                    << " [" << shown << "], tokenizers " << expected[i]
                    << " (python3 scripts/make_tokenizer_fixtures.py --show " << name << " " << i + 1 << ")";
    }
  }
  EXPECT_EQ(wrong, 0) << name << ": lines that differ";
  EXPECT_GT(ids_total, 30000u);  // the text is long enough to mean something (unigram: 34,654 ids)
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerParity,
                         ::testing::Values("gpt2", "llama3", "qwen2", "llama2", "spm", "bert", "unigram", "xlmr"));

// A folder with a Llama 2 kind of tokenizer.model and no tokenizer.json
// (tests/fixtures/tokenizers/llama2-spm): SentencePiece's own ids with <s>
// first, and its decoding, on every line. (transformers 5.24's LlamaTokenizer,
// converted from the same file, differs on the 219 lines that begin with white
// space: it puts one U+2581 before the text where SentencePiece, llama.cpp and
// Llama 2's own tokenizer.json keep the space as well.)
TEST(HfTokenizer, ATokenizerModelFolderGivesSentencePiecesIdsOnEveryLine) {
  std::unique_ptr<Tokenizer> tok = load_sentencepiece_folder_tokenizer(fixture("llama2-spm"), {});
  EXPECT_EQ(tok->specials().prefix, std::vector<int64_t>{1});  // <s>
  EXPECT_TRUE(tok->specials().suffix.empty());
  EXPECT_EQ(tok->specials().eos, std::vector<int64_t>{2});  // </s>, without an eos_token_id from the folder
  EXPECT_EQ(load_sentencepiece_folder_tokenizer(fixture("llama2-spm"), {7})->specials().eos, std::vector<int64_t>{7});
  const std::vector<std::string> text = split_lines(read_file(fixture("text.txt")));
  std::vector<std::string> expected = split_lines(read_file(fixture("llama2-spm.expected")));
  if (!expected.empty() && expected.back().empty()) expected.pop_back();
  ASSERT_EQ(expected.size(), text.size());
  int wrong = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const std::vector<int64_t> ids = tok->encode_prompt(text[i]);
    const std::string got = std::to_string(ids.size()) + " " + hex(fnv(ids)) + " " + hex(fnv(tok->decode(ids)));
    if (got != expected[i] && ++wrong <= 5)
      ADD_FAILURE() << "line " << i + 1 << " '" << replace_invalid_utf8(text[i]) << "': qkv " << got
                    << ", sentencepiece " << expected[i];
  }
  EXPECT_EQ(wrong, 0) << "lines that differ";
  // The specials written in a text are those tokens; decoding skips them.
  EXPECT_EQ(tok->encode("a</s>b<s>"), (std::vector<int64_t>{tok->encode("a")[0], 2, tok->encode("b")[0], 1}));
  EXPECT_EQ(tok->decode(tok->encode_prompt("hello world</s>")), "hello world");
}

TEST(HfTokenizer, PostProcessorTemplatesGiveThePromptPrefix) {
  EXPECT_TRUE(load_hf_tokenizer(fixture("gpt2.json"), {})->specials().prefix.empty());  // GPT-2 adds nothing
  std::unique_ptr<Tokenizer> llama = load_hf_tokenizer(fixture("llama3.json"), {1});
  EXPECT_EQ(llama->specials().prefix, std::vector<int64_t>{0});  // <|begin_of_text|>
  EXPECT_TRUE(llama->specials().suffix.empty());
  EXPECT_TRUE(llama->specials().never_sampled.empty());
  EXPECT_TRUE(llama->is_eos(1));
  EXPECT_FALSE(llama->is_eos(2));
  const std::vector<int64_t> prompt = llama->encode_prompt("hello");
  ASSERT_FALSE(prompt.empty());
  EXPECT_EQ(prompt[0], 0);
  EXPECT_EQ(llama->decode(prompt), "hello");  // specials are skipped
}

TEST(HfTokenizer, AddedTokensAreFoundAndDecodedAsTheirText) {
  std::unique_ptr<Tokenizer> gpt2 = load_hf_tokenizer(fixture("gpt2.json"), {});
  const std::vector<int64_t> ids = gpt2->encode("a<|endoftext|>b   <mask>c");
  // <mask> takes the spaces before it (lstrip): a, <|endoftext|>, b, <mask>, c.
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(gpt2->pieces({ids[1], ids[3]}), (std::vector<std::string>{"<|endoftext|>", "<mask>"}));
  EXPECT_EQ(gpt2->decode(ids), "abc");
}

// Llama 2's kind: <s> first, characters outside the vocabulary as their
// bytes, and bytes that are not UTF-8 one U+FFFD each on decoding, as
// `tokenizers` does (ids 3 + b are the tokens <0xb>). A character cut short
// at the very end stays bytes, so that a stream can wait for the rest.
TEST(HfTokenizer, ByteFallbackAndTheSentencePieceSpace) {
  std::unique_ptr<Tokenizer> llama = load_hf_tokenizer(fixture("llama2.json"), {2});
  const std::vector<int64_t> prompt = llama->encode_prompt("我是 hi");
  ASSERT_FALSE(prompt.empty());
  EXPECT_EQ(prompt[0], 1);  // <s>
  EXPECT_NE(std::find(prompt.begin(), prompt.end(), 3 + 0xE6), prompt.end());  // 是 is not in the vocabulary: E6 98 AF
  EXPECT_EQ(llama->decode(prompt), "我是 hi");  // the normalizer's U+2581 in front is stripped again
  // The expected values are what tokenizers' decode() gives, but for the cut-short end.
  const int64_t t = llama->encode("t").back();  // "▁t"
  const std::string two_marks = "\xEF\xBF\xBD\xEF\xBF\xBD";
  EXPECT_EQ(llama->decode({1, 3 + 0xE6, 3 + 0x88, t}), two_marks + " t");
  EXPECT_EQ(llama->decode({t, 3 + 0xE6, 3 + 0x88}), "t\xE6\x88");  // tokenizers: 't\ufffd\ufffd'
  EXPECT_EQ(llama->decode({t, 3 + 0xE6, 3 + 0x88, 3 + 0x91}), "t我");
  EXPECT_EQ(llama->decode({t, 3 + 0xFF, 3 + 0x88}), "t" + two_marks);  // can never become a character
  // The Metaspace decoder (spm) drops the replacement in the first token, as `tokenizers` does.
  std::unique_ptr<Tokenizer> spm = load_hf_tokenizer(fixture("spm.json"), {2});
  EXPECT_EQ(spm->decode(spm->encode("a b")), "a b");
}

// BERT's kind: lowercased, accents stripped, each CJK ideograph a word of its
// own, punctuation split off; [CLS] and [SEP] around the text; a word with a
// character the vocabulary lacks (or of more than 100 characters) is one
// [UNK]; "##" pieces rejoin their word on decoding. (The fixture was trained
// on the test text's kind of lines: 512 entries, [UNK] is 1.)
TEST(HfTokenizer, WordPieceAsBertDoesIt) {
  std::unique_ptr<Tokenizer> bert = load_hf_tokenizer(fixture("bert.json"), {});
  EXPECT_EQ(bert->specials().prefix, std::vector<int64_t>{2});  // [CLS]
  EXPECT_EQ(bert->specials().suffix, std::vector<int64_t>{3});  // [SEP]
  const std::vector<int64_t> ids = bert->encode("Café, 我是!");
  EXPECT_EQ(ids, (std::vector<int64_t>{223, 10, 100, 103, 5}));  // cafe , 我 是 !  (as tokenizers gives them)
  EXPECT_EQ(bert->decode(ids), "cafe, 我 是!");
  EXPECT_EQ(bert->encode("\xF0\x9F\x90\xA2"), std::vector<int64_t>{1});  // a turtle: not in the vocabulary
  EXPECT_EQ(bert->encode(std::string(101, 'a')), std::vector<int64_t>{1});
  EXPECT_EQ(bert->decode(bert->encode("the quick  brown\tfox")), "the quick brown fox");
}

// T5's kind: the best-scoring split into pieces (Viterbi), characters outside
// the vocabulary fused into one <unk> (id 2), </s> after the text, and the
// Metaspace decoder. (Expected ids: what `tokenizers` gives for the fixture.)
TEST(HfTokenizer, UnigramAsT5DoesIt) {
  std::unique_ptr<Tokenizer> t5 = load_hf_tokenizer(fixture("unigram.json"), {});
  EXPECT_EQ(t5->specials().suffix, std::vector<int64_t>{1});  // </s>
  EXPECT_EQ(t5->encode("the"), std::vector<int64_t>{27});     // "▁the"
  EXPECT_EQ(t5->encode("\xF0\x9F\x90\xA2\xF0\x9F\x90\xA2 the"), (std::vector<int64_t>{3, 2, 27}));  // ▁ 🐢🐢 ▁the
  EXPECT_EQ(t5->decode(t5->encode("hello world")), "hello world");
}

// XLM-R's kind: SentencePiece's compiled nmt_nfkc rules (the Precompiled
// normalizer) before Unigram, applied per grapheme cluster as `tokenizers`
// does: full-width letters, half-width kana and circled digits folded, a
// decomposed "Å" and "ö" composed (each a cluster of two characters), and
// "\r\n" one cluster that becomes one space, as "\r" alone does.
// (Expected ids: what `tokenizers` gives for the fixture.)
TEST(HfTokenizer, PrecompiledRulesAsXlmRDoesThem) {
  std::unique_ptr<Tokenizer> xlmr = load_hf_tokenizer(fixture("xlmr.json"), {});
  using Ids = std::vector<int64_t>;
  EXPECT_EQ(xlmr->encode("\xEF\xBC\xA1\xEF\xBC\xA2\xEF\xBC\xA3 abc"), (Ids{3, 0, 100, 503, 510}));  // ＡＢＣ abc
  EXPECT_EQ(xlmr->encode("A\xCC\x8Angstro\xCC\x88m"), Ids{14});  // Ångström, decomposed
  EXPECT_EQ(xlmr->encode("\xC3\x85ngstr\xC3\xB6m"), Ids{14});    // Ångström, composed
  EXPECT_EQ(xlmr->encode("a\r\nb"), (Ids{100, 3, 503}));
  EXPECT_EQ(xlmr->encode("a\rb"), (Ids{100, 3, 503}));
  EXPECT_EQ(xlmr->encode("\xEF\xBD\xB6\xEF\xBE\x80\xEF\xBD\xB6\xEF\xBE\x85"), Ids{85});  // ｶﾀｶﾅ: カタカナ
  EXPECT_EQ(xlmr->encode("x\xE3\x80\x80y"), (Ids{3, 91, 3, 505}));                       // U+3000
  EXPECT_EQ(xlmr->encode("\xE2\x91\xA0"), (Ids{3, 36}));                                 // ①
}

TEST(HfTokenizer, ALongLineEncodesAndDecodesBack) {
  std::unique_ptr<Tokenizer> tok = load_hf_tokenizer(fixture("llama3.json"), {});
  std::string line;
  for (int i = 0; i < 20000; ++i) line += i % 7 ? "ab" : "  \t";
  line += std::string(50000, 'x');  // one word of 50,000 characters: BPE by a heap, not a quadratic scan
  EXPECT_EQ(tok->decode(tok->encode(line)), line);
}

// A copy of the gpt2 fixture with `changes` merged into its JSON.
std::string with_changes(const nlohmann::json& changes) {
  nlohmann::json j = nlohmann::json::parse(read_file(fixture("gpt2.json")));
  j.merge_patch(changes);
  const std::string path = testing::temp_dir("tokenizer") + "/tokenizer.json";
  write_file_atomic(path, j.dump());
  return path;
}

TEST(HfTokenizer, WhatIsNotReadIsOneErrorNamingTheField) {
  auto error_with = [](const nlohmann::json& changes) {
    const std::string path = with_changes(changes);
    return error_of([&] { load_hf_tokenizer(path, {}); }).substr(path.size());
  };
  EXPECT_EQ(error_with({{"pre_tokenizer", {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}}}}),
            ": pre_tokenizer.prepend_scheme 'sometimes' is not one of always, first, never");
  EXPECT_EQ(error_with({{"decoder", {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}}}}),
            ": decoder.prepend_scheme 'sometimes' is not one of always, first, never");
  EXPECT_EQ(error_with({{"decoder", {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}}}}),
            ": decoder.content must be one character");
  EXPECT_EQ(error_with({{"normalizer", {{"type", "Replace"}, {"content", "x"}}}}), ": normalizer: no 'pattern'");
  EXPECT_EQ(error_with({{"normalizer", {{"type", "Precompiled"}}}}), ": normalizer: no 'precompiled_charsmap'");
  EXPECT_EQ(error_with({{"normalizer", {{"type", "Precompiled"}, {"precompiled_charsmap", "AB$C"}}}}),
            ": normalizer.precompiled_charsmap is not base64 (character 3 is outside its alphabet)");
  EXPECT_EQ(error_with({{"normalizer", {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}}}}),
            ": normalizer.precompiled_charsmap is not SentencePiece's compiled rules (3 bytes, the trie's size 0)");
  EXPECT_EQ(error_with({{"normalizer", {{"type", "Precompiled"}, {"precompiled_charsmap", "EAAAAAAAAAA="}}}}),
            ": normalizer.precompiled_charsmap is not SentencePiece's compiled rules (8 bytes, the trie's size 16)");
  EXPECT_EQ(error_with({{"normalizer", {{"type", "BertNormalizer"}, {"strip_accents", "yes"}}}}),
            ": normalizer.strip_accents must be true, false or null");
  EXPECT_EQ(error_with({{"pre_tokenizer", {{"type", "Whitespace"}}}}),
            ": pre_tokenizer: pre-tokenizer type 'Whitespace' is not supported yet");
  EXPECT_EQ(error_with({{"model", {{"type", "WordLevel"}}}}),
            ": model: model type 'WordLevel' is not supported yet (BPE, WordPiece and Unigram are)");
  EXPECT_EQ(error_with({{"model", {{"type", "WordPiece"}, {"unk_token", nullptr}}}}),
            ": model.unk_token must name a token of the vocabulary");
  EXPECT_EQ(error_with({{"model", {{"dropout", 0.1}}}}),
            ": model.dropout: a tokenizer that samples its merges is not supported");
  EXPECT_EQ(error_with({{"decoder", {{"type", "CTC"}}}}), ": decoder: decoder type 'CTC' is not supported yet");
  EXPECT_EQ(error_with({{"post_processor", {{"type", "Nonsense"}}}}),
            ": post_processor: post-processor type 'Nonsense' is not supported yet");
  EXPECT_EQ(error_with({{"model", {{"merges", {"a"}}}}}), ": model.merges[0]: 'a' is not two tokens");
  EXPECT_EQ(error_with({{"model", {{"merges", {"Ġ zzzz"}}}}}),
            ": model.merges[0]: 'Ġ' + 'zzzz' are not all in the vocabulary");
  EXPECT_EQ(error_with({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(ab"}}}, {"behavior", "Isolated"}}}})
                .substr(0, 52),
            ": pre_tokenizer.pattern: the pattern '(ab' does not ");
  const std::string path = testing::temp_dir("tokenizer") + "/tokenizer.json";
  write_file_atomic(path, "[1, 2]");
  EXPECT_EQ(error_of([&] { load_hf_tokenizer(path, {}); }), path + ": not a tokenizer.json (the top level is not an object)");
  write_file_atomic(path, "{\"model\": ");
  EXPECT_NE(error_of([&] { load_hf_tokenizer(path, {}); }).find(": not valid JSON"), std::string::npos);
  // Refused by parse_json (src/core/json.h) before anything walks it: a copy recursed once a level.
  write_file_atomic(path, "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  EXPECT_EQ(error_of([&] { load_hf_tokenizer(path, {}); }), path + ": JSON nested deeper than 256 levels");
}

}  // namespace
}  // namespace qkv
