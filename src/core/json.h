// Internal: parsing JSON text with errors that name where it came from.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "qkv/error.h"
#include "qkv/utf8.h"

namespace qkv {

// Whether JSON text nests its arrays and objects more than `limit` deep ({}
// is 1 deep, [{}] 2), found by scanning the text, strings skipped, before a
// parser sees it. nlohmann parses and frees any depth without recursing, but
// copies and converts a document a call a level, and its ordered_json
// copies an object's earlier members when a later one is added: a request
// nested 100,000 deep overflowed qkv serve's stack in the parse itself
// (under AddressSanitizer), and 60,000 levels ran a copy out of stack.
// Invalid text is left to the parser.
inline bool json_text_nested_deeper_than(std::string_view text, int64_t limit) {
  int64_t depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// How deep a configuration or tokenizer file may nest (theirs nest a few
// levels), and a request to qkv serve (a tool's JSON schema inside it).
constexpr int64_t kMaxFileJsonDepth = 256;
constexpr int64_t kMaxRequestJsonDepth = 100;

// The parsed document; invalid JSON is a qkv::Error "SOURCE: not valid JSON
// (...)". Text that is not UTF-8 is refused first, by line and column, so that
// the parser's message (which quotes what it read) never echoes broken bytes.
inline nlohmann::json parse_json(const std::string& text, const std::string& source) {
  if (size_t at = invalid_utf8_offset(text); at != std::string::npos) {
    const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
    const size_t line = 1 + (size_t)std::count(text.begin(), text.begin() + (ptrdiff_t)at, '\n');
    const size_t column = line_start == std::string::npos || at == 0 ? at + 1 : at - line_start;
    fail(source, ": not valid UTF-8 (a bad byte at line ", line, ", column ", column, ")");
  }
  QKV_CHECK(!json_text_nested_deeper_than(text, kMaxFileJsonDepth), source, ": JSON nested deeper than ",
            kMaxFileJsonDepth, " levels");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": not valid JSON (", e.what(), ")");
  }
}

// Fails on the first key of object `j` not in `known`:
// "SOURCE: unknown key 'PREFIXkey'SUFFIX".
inline void json_known_keys(const nlohmann::json& j, const std::set<std::string>& known, const std::string& source,
                            const char* prefix = "", const char* suffix = "") {
  for (auto& [k, v] : j.items()) QKV_CHECK(known.count(k), source, ": unknown key '", prefix, k, "'", suffix);
}

}  // namespace qkv
