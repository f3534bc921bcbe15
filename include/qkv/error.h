// qkv/error.h — the one exception type and the check macro.
//
// Every error qkv reports is a qkv::Error whose message is one line that says
// what was expected and what was found, e.g.
//   "matmul: inner dimensions differ: a is [4,3], b is [5,2]".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace qkv {

class Error : public std::runtime_error {
public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
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
