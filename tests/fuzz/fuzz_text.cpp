// Tab-separated parallel text and the UTF-8 functions under it.
#include "qkv/data.h"
#include "qkv/utf8.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = qkv::fuzz::as_string(data, size);
  // Replacing bad bytes always yields valid UTF-8, and valid text is left alone.
  const std::string fixed = qkv::replace_invalid_utf8(text);
  if (qkv::invalid_utf8_offset(fixed) != std::string::npos) std::abort();
  if (qkv::invalid_utf8_offset(text) == std::string::npos && fixed != text) std::abort();
  std::string joined;
  for (const std::string& c : qkv::utf8_chars(fixed)) joined += c;
  if (joined != fixed) std::abort();

  const std::string path = qkv::fuzz::scratch_file("pairs.tsv", text);
  for (bool replace : {false, true})
    qkv::fuzz::expect_clean([&] {
      std::vector<int64_t> lines;
      std::vector<std::string> categories;
      auto pairs = qkv::read_parallel_tsv(
          path, {.replace_invalid_utf8 = replace, .line_numbers = &lines, .categories = &categories});
      if (lines.size() != pairs.size() || categories.size() != pairs.size()) std::abort();
      for (const std::string& c : categories)
        if (c.find('\t') != std::string::npos) std::abort();
      for (auto& [src, tgt] : pairs)
        if (src.empty() || tgt.empty() || qkv::invalid_utf8_offset(src) != std::string::npos) std::abort();
    });
  return 0;
}
