// qkv/base64.h — standard base64 (RFC 4648: A-Z a-z 0-9 + /), for the
// server's embeddings and images and for binary fields of JSON files (a
// tokenizer.json's precompiled_charsmap).
#pragma once

#include <string>
#include <string_view>

namespace qkv {

// Bytes as base64 text, padded with '=' to a multiple of 4 characters.
std::string base64_encode(std::string_view bytes);

// Base64 text (padding optional) as bytes into *out. False, with *error
// saying why ("character 17 is outside its alphabet", "its length is impossible"),
// for anything else.
bool base64_decode(std::string_view text, std::string* out, std::string* error);

}  // namespace qkv
