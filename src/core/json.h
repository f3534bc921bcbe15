// Internal: parsing JSON text with errors that name where it came from.
#pragma once

#include <set>
#include <nlohmann/json.hpp>
#include <string>

#include "qkv/error.h"

namespace qkv {

// The parsed document; invalid JSON is a qkv::Error "SOURCE: not valid JSON (...)".
inline nlohmann::json parse_json(const std::string& text, const std::string& source) {
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
