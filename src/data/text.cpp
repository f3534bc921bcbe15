// Parallel text files.
#include <sstream>

#include "qkv/data.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/utf8.h"

namespace qkv {

std::vector<SentencePair> read_parallel_tsv(const std::string& path, ReadTextOptions options) {
  std::string text = read_file(path);
  std::vector<SentencePair> pairs;
  if (options.line_numbers) options.line_numbers->clear();
  if (options.categories) options.categories->clear();
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
    const size_t tab = line.find('\t');
    QKV_CHECK(tab != std::string::npos, path, ":", number, ": expected source<TAB>target, found no tab");
    const size_t second = line.find('\t', tab + 1);
    QKV_CHECK(second == std::string::npos || line.find('\t', second + 1) == std::string::npos, path, ":", number,
              ": expected source<TAB>target or source<TAB>target<TAB>category, found more than two tabs");
    SentencePair p{line.substr(0, tab), line.substr(tab + 1, second == std::string::npos ? second : second - tab - 1)};
    QKV_CHECK(!p.first.empty() && !p.second.empty(), path, ":", number, ": empty ",
              p.first.empty() ? "source" : "target");
    const std::string category = second == std::string::npos ? "" : line.substr(second + 1);
    QKV_CHECK(second == std::string::npos || !category.empty(), path, ":", number, ": empty category");
    pairs.push_back(std::move(p));
    if (options.categories) options.categories->push_back(category);
    if (options.line_numbers) options.line_numbers->push_back(number);
  }
  QKV_CHECK(!pairs.empty(), path, ": no sentence pairs");
  return pairs;
}

std::string format_parallel_tsv(const std::vector<SentencePair>& pairs) {
  std::string out;
  for (auto& [src, tgt] : pairs) out += src + "\t" + tgt + "\n";
  return out;
}

std::string format_parallel_tsv(const std::vector<SentencePair>& pairs, const std::vector<std::string>& categories) {
  QKV_CHECK(categories.size() == pairs.size(), "format_parallel_tsv: ", categories.size(), " categories for ",
            pairs.size(), " pairs");
  std::string out;
  for (size_t i = 0; i < pairs.size(); ++i) out += pairs[i].first + "\t" + pairs[i].second + "\t" + categories[i] + "\n";
  return out;
}

}  // namespace qkv
