// Internal: parsing JSON text with errors that name where it came from.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "qkv/error.h"
#include "qkv/utf8.h"

namespace qkv {

// Whether j's arrays and objects nest more than `limit` deep ({} is 1 deep,
// [{}] 2), counted without recursion. nlohmann parses and frees any depth
// without recursing, but copies, compares, dumps and converts a document one
// call a level: 60,000 levels ran a copy out of stack. Readers of untrusted
// JSON refuse what nests deeper than they can walk before they walk it.
template <class Json>
bool json_nested_deeper_than(const Json& j, int64_t limit) {
  std::vector<std::pair<const Json*, int64_t>> stack = {{&j, 1}};
  while (!stack.empty()) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    if (depth > limit) return true;
    for (const Json& e : *v) stack.emplace_back(&e, depth + 1);
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
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": not valid JSON (", e.what(), ")");
  }
  QKV_CHECK(!json_nested_deeper_than(j, kMaxFileJsonDepth), source, ": JSON nested deeper than ", kMaxFileJsonDepth,
            " levels");
  return j;
}

// Fails on the first key of object `j` not in `known`:
// "SOURCE: unknown key 'PREFIXkey'SUFFIX".
inline void json_known_keys(const nlohmann::json& j, const std::set<std::string>& known, const std::string& source,
                            const char* prefix = "", const char* suffix = "") {
  for (auto& [k, v] : j.items()) QKV_CHECK(known.count(k), source, ": unknown key '", prefix, k, "'", suffix);
}

}  // namespace qkv
