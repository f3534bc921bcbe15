// qkv/data.h — text data: the synthetic Chinese -> Japanese corpus, parallel
// text files and UTF-8 checks (tokenizers: qkv/tokenizer.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "qkv/tokenizer.h"

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

// The demo's check list: 24 pairs of the grammar above that a model must tell
// apart (很有意思 / 没有意思 / 有意思吗; 是 / 不是 / 吗; present, negative, past
// and past negative; counters 个 / 本 / 辆; 喜欢 / 不喜欢). The demo never
// trains on them; each is a new combination of parts seen in training (every
// topic and adjective of the list is also seen together in another mood).
const std::vector<SentencePair>& zh_ja_checks();

// Tab-separated parallel text: one "source<TAB>target" per line. Errors name
// the file and line: a missing tab, an empty side, invalid UTF-8.
struct ReadTextOptions {
  bool replace_invalid_utf8 = false;             // replace bad bytes by U+FFFD instead of failing
  std::vector<int64_t>* line_numbers = nullptr;  // if given, filled with each pair's line number
};
std::vector<SentencePair> read_parallel_tsv(const std::string& path, ReadTextOptions options = {});
std::string format_parallel_tsv(const std::vector<SentencePair>& pairs);

}  // namespace qkv
