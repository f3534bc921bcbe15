// Shared by the fuzz harnesses (tests/fuzz/fuzz_*.cpp). Each harness defines
// LLVMFuzzerTestOneInput; under `make fuzz` libFuzzer calls it, under CTest
// replay_main.cpp calls it once per file of its seed corpus.
//
// The contract each harness checks: a bad input is a qkv::Error, one line,
// and nothing else. Any other exception escapes and aborts (an "internal
// error" a user would see), as does any memory or undefined-behaviour error
// the sanitizers find.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv::fuzz {

// Runs `f`, accepting a qkv::Error whose message is one line.
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    if (std::string(e.what()).find('\n') != std::string::npos) std::abort();
  }
}

// A file of this process under /tmp holding `bytes`, for readers that take
// paths. Written plainly (no fsync): it is rewritten for every input.
inline std::string scratch_file(const std::string& name, const std::string& bytes) {
  static const std::string dir = [] {
    static std::string d = "/tmp/qkv-fuzz-" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(d, ignored);
    });
    return d;
  }();
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace qkv::fuzz
