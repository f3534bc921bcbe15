#include "qkv/utf8.h"

#include "qkv/error.h"

namespace qkv {

// The well-formed bytes from s[i] (Unicode's Table 3-7: no overlongs, no
// surrogates, nothing past U+10FFFF), at least 1, and whether they are a whole
// character. When not, they are a sequence cut short (its "maximal subpart")
// or a byte that starts none: one U+FFFD replaces them.
static size_t scan(const std::string& s, size_t i, bool* whole) {
  const unsigned char c = (unsigned char)s[i];
  const size_t len = c < 0x80                ? 1
                     : c >= 0xC2 && c <= 0xDF ? 2
                     : c >= 0xE0 && c <= 0xEF ? 3
                     : c >= 0xF0 && c <= 0xF4 ? 4
                                              : 0;
  size_t k = 1;
  for (; k < len && i + k < s.size(); ++k) {
    const unsigned char cc = (unsigned char)s[i + k];
    // The second byte's range depends on the first.
    const unsigned char lo = k > 1 ? 0x80 : c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = k > 1 ? 0xBF : c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    if (cc < lo || cc > hi) break;
  }
  *whole = k == len;
  return k;
}

// Length of the valid sequence starting at s[i], or 0 if it is invalid.
static int sequence_length(const std::string& s, size_t i) {
  bool whole;
  const size_t k = scan(s, i, &whole);
  return whole ? (int)k : 0;
}

char32_t utf8_code_point(const std::string& s, size_t i, int* len) {
  const unsigned char c = (unsigned char)s[i];
  *len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  char32_t cp = *len == 1 ? c : *len == 2 ? (c & 0x1F) : *len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < *len; ++k) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
  return cp;
}

size_t invalid_utf8_offset(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    int len = sequence_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string::npos;
}

std::string replace_invalid_utf8(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    bool whole;
    const size_t k = scan(s, i, &whole);
    if (whole) out.append(s, i, k);
    else out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    int len = sequence_length(s, i);
    QKV_CHECK(len > 0, "invalid UTF-8 at byte ", i);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t marker_begins_at_end(std::string_view text, std::string_view marker) {
  if (marker.empty()) return 0;
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace qkv
