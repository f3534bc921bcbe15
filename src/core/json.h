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

// j[key] as a T, or `fallback` when absent; a value of the wrong type is an
// error naming the source and the key.
template <class T>
T json_get(const nlohmann::json& j, const char* key, T fallback, const std::string& source) {
  if (!j.contains(key)) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    fail(source, ": '", key, "' has the wrong type (", j.at(key).dump(), ")");
  }
}

// Fails on the first key of object `j` not in `known`:
// "SOURCE: unknown key 'PREFIXkey'SUFFIX".
inline void json_known_keys(const nlohmann::json& j, const std::set<std::string>& known, const std::string& source,
                            const char* prefix = "", const char* suffix = "") {
  for (auto& [k, v] : j.items()) QKV_CHECK(known.count(k), source, ": unknown key '", prefix, k, "'", suffix);
}

}  // namespace qkv
