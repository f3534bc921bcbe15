// Internal: parsing JSON text with errors that name where it came from.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "qkv/error.h"
#include "qkv/utf8.h"

namespace qkv {

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
