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

}  // namespace qkv
