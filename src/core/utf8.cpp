#include "qkv/utf8.h"

#include "qkv/error.h"

namespace qkv {

// Length of the valid sequence starting at s[i], or 0 if it is invalid.
static int sequence_length(const std::string& s, size_t i) {
  unsigned char c = (unsigned char)s[i];
  int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < len; ++k) {
    unsigned char cc = (unsigned char)s[i + k];
    if ((cc >> 6) != 0x2) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
  if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

size_t invalid_utf8_offset(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    int len = sequence_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string::npos;
}

// How many bytes from s[i] begin a valid sequence that is cut short (the
// "maximal subpart" of Unicode's chapter 3), at least 1: they become one U+FFFD.
static size_t invalid_prefix(const std::string& s, size_t i) {
  const unsigned char c = (unsigned char)s[i];
  const int len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  size_t k = 1;
  for (; len && (int)k < len && i + k < s.size(); ++k) {
    const unsigned char cc = (unsigned char)s[i + k];
    // The second byte's range depends on the first (no overlongs, surrogates or code points past U+10FFFF).
    const unsigned char lo = k > 1 ? 0x80 : c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = k > 1 ? 0xBF : c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    if (cc < lo || cc > hi) break;
  }
  return k;
}

std::string replace_invalid_utf8(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    int len = sequence_length(s, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      i += invalid_prefix(s, i);
    } else {
      out.append(s, i, len);
      i += len;
    }
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

}  // namespace qkv
