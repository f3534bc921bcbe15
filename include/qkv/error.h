// qkv/error.h — the one exception type and the check macro.
//
// Every error qkv reports is a qkv::Error whose message is one line that says
// what was expected and what was found, e.g.
//   "matmul: inner dimensions differ: a is [4,3], b is [5,2]".
// The constructor keeps it one line whatever it quotes (control characters
// become escapes).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace qkv {

namespace detail {
// `text` with its control characters written as escapes (a newline as \n,
// others as \xHH): a name or value quoted from a file can never break an
// error message into two lines or send a terminal escape sequence.
inline std::string one_line(const std::string& text) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += (char)c;
    }
  }
  return out;
}
}  // namespace detail

class Error : public std::runtime_error {
public:
  explicit Error(const std::string& what) : std::runtime_error(detail::one_line(what)) {}
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Throw qkv::Error with the streamed message parts.
template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

}  // namespace qkv

#define QKV_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) ::qkv::fail(__VA_ARGS__);   \
  } while (0)
