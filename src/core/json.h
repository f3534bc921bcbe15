// Internal: parsing JSON text with errors that name where it came from.
#pragma once

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

}  // namespace qkv
