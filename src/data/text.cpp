// Parallel text files and the character tokenizer.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "qkv/data.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/utf8.h"
#include "src/core/json.h"

namespace qkv {

std::vector<SentencePair> read_parallel_tsv(const std::string& path, ReadTextOptions options) {
  std::string text = read_file(path);
  std::vector<SentencePair> pairs;
  std::istringstream in(text);
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (size_t bad = invalid_utf8_offset(line); bad != std::string::npos) {
      QKV_CHECK(options.replace_invalid_utf8, path, ":", number, ": invalid UTF-8 at byte ", bad + 1,
                " of the line (use --replace-invalid-utf8 to replace it with U+FFFD)");
      line = replace_invalid_utf8(line);
    }
    size_t tab = line.find('\t');
    QKV_CHECK(tab != std::string::npos, path, ":", number, ": expected source<TAB>target, found no tab");
    QKV_CHECK(line.find('\t', tab + 1) == std::string::npos, path, ":", number,
              ": expected source<TAB>target, found more than one tab");
    SentencePair p{line.substr(0, tab), line.substr(tab + 1)};
    QKV_CHECK(!p.first.empty() && !p.second.empty(), path, ":", number, ": empty ",
              p.first.empty() ? "source" : "target");
    pairs.push_back(std::move(p));
  }
  QKV_CHECK(!pairs.empty(), path, ": no sentence pairs");
  return pairs;
}

std::string format_parallel_tsv(const std::vector<SentencePair>& pairs) {
  std::string out;
  for (auto& [src, tgt] : pairs) out += src + "\t" + tgt + "\n";
  return out;
}

static const char* kSpecials[] = {"<pad>", "<bos>", "<eos>", "<unk>"};

CharTokenizer CharTokenizer::build(const std::vector<std::string>& texts) {
  std::map<std::string, int64_t> counts;
  for (auto& t : texts)
    for (auto& c : utf8_chars(t)) counts[c]++;
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.second > b.second; });
  CharTokenizer tok;
  for (const char* s : kSpecials) tok.itos_.push_back(s);
  for (auto& [c, n] : sorted) tok.itos_.push_back(c);
  for (size_t i = 0; i < tok.itos_.size(); ++i) tok.stoi_[tok.itos_[i]] = (int64_t)i;
  return tok;
}

std::vector<int64_t> CharTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (auto& c : utf8_chars(text)) {
    auto it = stoi_.find(c);
    ids.push_back(it == stoi_.end() || it->second < 4 ? kUnk : it->second);
  }
  return ids;
}

std::vector<std::string> CharTokenizer::pieces(const std::vector<int64_t>& ids) const {
  std::vector<std::string> out;
  for (int64_t id : ids) out.push_back(id >= 0 && id < size() ? itos_[id] : "<unk>");
  return out;
}

std::string CharTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id == kEos) break;
    if (id == kPad || id == kBos) continue;
    out += id == kUnk || id < 0 || id >= size() ? "\xEF\xBF\xBD" : itos_[id];
  }
  return out;
}

std::string CharTokenizer::to_json() const {
  nlohmann::ordered_json j;
  j["type"] = "char";
  j["vocab"] = itos_;
  return j.dump(1) + "\n";
}

CharTokenizer CharTokenizer::from_json(const std::string& text, const std::string& source) {
  nlohmann::json j = parse_json(text, source);
  QKV_CHECK(j.is_object() && j.value("type", "") == "char" && j.contains("vocab") && j["vocab"].is_array(), source,
            ": expected {\"type\": \"char\", \"vocab\": [...]}");
  CharTokenizer tok;
  for (auto& v : j["vocab"]) {
    QKV_CHECK(v.is_string(), source, ": vocabulary entries must be strings");
    tok.itos_.push_back(v.get<std::string>());
  }
  QKV_CHECK(tok.itos_.size() >= 4, source, ": vocabulary lacks the four special tokens");
  for (int i = 0; i < 4; ++i)
    QKV_CHECK(tok.itos_[i] == kSpecials[i], source, ": token ", i, " must be ", kSpecials[i], ", found '",
              tok.itos_[i], "'");
  for (size_t i = 0; i < tok.itos_.size(); ++i) {
    QKV_CHECK(tok.stoi_.emplace(tok.itos_[i], (int64_t)i).second, source, ": token '", tok.itos_[i],
              "' appears twice");
  }
  return tok;
}

}  // namespace qkv
