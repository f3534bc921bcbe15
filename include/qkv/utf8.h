// qkv/utf8.h — UTF-8 validation and splitting (strict: no overlongs, no
// surrogates, nothing above U+10FFFF), and what a text stream holds back.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace qkv {

// Byte offset of the first invalid sequence, or std::string::npos.
size_t invalid_utf8_offset(const std::string& s);
// Each invalid part replaced by one U+FFFD: a sequence cut short (its longest
// valid start) or a byte that starts none, as Python's errors="replace" and
// Rust's from_utf8_lossy do (Unicode's "maximal subpart" practice).
std::string replace_invalid_utf8(const std::string& s);
// The code point of the character of valid UTF-8 text that starts at s[i],
// and its length in bytes.
char32_t utf8_code_point(const std::string& s, size_t i, int* len);
// The code points of valid UTF-8 text, each as its own string.
std::vector<std::string> utf8_chars(const std::string& s);

// How many bytes at the end of `text` begin `marker` without being all of
// it: text that may yet become the marker (a stop sequence, an end of turn,
// a <tool_call>), which a stream holds back until it knows. 0 for an empty
// marker.
size_t marker_begins_at_end(std::string_view text, std::string_view marker);

}  // namespace qkv
