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
// The easy tier is the grammar above, unchanged since the first release so
// its corpora stay reproducible; the hard tier (see src/data/synth_zh_ja.cpp)
// adds relative clauses, time and place in both orders, counters to 99,
// comparatives, aspect (过, 在), every topic-adjective pair in every mood,
// names and figures to copy through, and long sentences nesting a relative clause.
enum class ZhJaTier { Easy, Hard };

class ZhJaGenerator {
public:
  explicit ZhJaGenerator(uint64_t seed, ZhJaTier tier = ZhJaTier::Easy);
  // The next pair; `category`, when given, gets its construction's name
  // (copula, verb, like, adjective, counting; relative, time_place, counter,
  // comparative, aspect, contrast, copy, long).
  SentencePair next(std::string* category = nullptr);

private:
  uint64_t state_;
  ZhJaTier tier_;
  uint64_t draw(uint64_t n);
  std::pair<std::string, std::string> subject();
  SentencePair easy(std::string& category);
  SentencePair hard(std::string& category);
};

// `count` distinct pairs, none of whose source sentences is in `exclude`;
// `categories`, when given, gets each pair's category.
std::vector<SentencePair> synth_zh_ja(int64_t count, uint64_t seed, const std::vector<SentencePair>& exclude = {},
                                      ZhJaTier tier = ZhJaTier::Easy, std::vector<std::string>* categories = nullptr);

// `count` pairs as the generator draws them, repeats kept, none whose source
// is in `exclude`: each sentence comes about as often as the grammar makes
// it, as in text from the world. Distinct pairs (synth_zh_ja) weight every
// sentence the same, so a construction with few combinations is rare in them:
// in 20,000 distinct easy pairs, "X 很好 -> X はいいです" comes 4 times; in
// 20,000 drawn ones (about 9,800 distinct), 52 times. The demo trains on these.
std::vector<SentencePair> sample_zh_ja(int64_t count, uint64_t seed, const std::vector<SentencePair>& exclude = {},
                                       ZhJaTier tier = ZhJaTier::Easy, std::vector<std::string>* categories = nullptr);

// The demo's check list: 24 pairs of the grammar above that a model must tell
// apart (很有意思 / 没有意思 / 有意思吗; 是 / 不是 / 吗; present, negative, past
// and past negative; counters 个 / 本 / 辆; 喜欢 / 不喜欢). The demo never
// trains on them; each is a new combination of parts seen in training (every
// topic and adjective of the list is also seen together in another mood).
const std::vector<SentencePair>& zh_ja_checks();

// Tab-separated parallel text: one "source<TAB>target" per line, optionally
// with a third column, the pair's category (as the hard tier writes it), which
// `qkv eval` scores separately and training ignores. Errors name the file and
// line: a missing tab, more than three columns, an empty field, invalid UTF-8.
struct ReadTextOptions {
  bool replace_invalid_utf8 = false;             // replace bad bytes by U+FFFD instead of failing
  std::vector<int64_t>* line_numbers = nullptr;  // if given, filled with each pair's line number
  std::vector<std::string>* categories = nullptr;  // if given, each pair's category ("" where a line has none)
};
std::vector<SentencePair> read_parallel_tsv(const std::string& path, ReadTextOptions options = {});
std::string format_parallel_tsv(const std::vector<SentencePair>& pairs);
// The same with a third column: categories[i] after pair i.
std::string format_parallel_tsv(const std::vector<SentencePair>& pairs, const std::vector<std::string>& categories);

}  // namespace qkv
