// qkv/data.h — text data: the synthetic Chinese -> Japanese corpus, parallel
// text files, UTF-8 checks, and the character tokenizer.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace qkv {

using SentencePair = std::pair<std::string, std::string>;  // source, target

// A seeded generator of Chinese -> Japanese sentence pairs from a small
// grammar and lexicon written for qkv: copulas (我是中国人 -> 私は中国人です),
// subject-object-verb reordering, negation, questions, adjective predicates,
// time and place phrases, possessives, counted objects, past tense. Particles
// and verb forms follow what is generated. The same seed gives the same pairs.
class ZhJaGenerator {
public:
  explicit ZhJaGenerator(uint64_t seed);
  SentencePair next();

private:
  uint64_t state_;
  uint64_t draw(uint64_t n);
};

// `count` distinct pairs, none of whose source sentences is in `exclude`.
std::vector<SentencePair> synth_zh_ja(int64_t count, uint64_t seed, const std::vector<SentencePair>& exclude = {});

// Tab-separated parallel text: one "source<TAB>target" per line. Errors name
// the file and line: a missing tab, an empty side, invalid UTF-8.
struct ReadTextOptions {
  bool replace_invalid_utf8 = false;  // replace bad bytes by U+FFFD instead of failing
};
std::vector<SentencePair> read_parallel_tsv(const std::string& path, ReadTextOptions options = {});
std::string format_parallel_tsv(const std::vector<SentencePair>& pairs);

// A character vocabulary: <pad>=0, <bos>=1, <eos>=2, <unk>=3, then characters.
class CharTokenizer {
public:
  static constexpr int64_t kPad = 0, kBos = 1, kEos = 2, kUnk = 3;
  CharTokenizer() = default;
  // Every character of `texts`, most frequent first (ties by code point order).
  static CharTokenizer build(const std::vector<std::string>& texts);
  std::vector<int64_t> encode(const std::string& text) const;  // no <bos>/<eos>
  std::string decode(const std::vector<int64_t>& ids) const;   // stops at <eos>, skips specials
  std::vector<std::string> pieces(const std::vector<int64_t>& ids) const;
  int64_t size() const { return (int64_t)itos_.size(); }
  std::string to_json() const;
  static CharTokenizer from_json(const std::string& json, const std::string& source);

private:
  std::vector<std::string> itos_;
  std::map<std::string, int64_t> stoi_;
};

}  // namespace qkv
