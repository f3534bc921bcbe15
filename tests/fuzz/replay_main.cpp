// Runs a fuzz harness once on each file of the folders or files given: the
// seed corpus under CTest (a regression test), or a crash file to debug.
#include <cstdio>
#include <filesystem>
#include <vector>

#include "qkv/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (std::filesystem::is_directory(argv[i])) {
      for (auto& e : std::filesystem::directory_iterator(argv[i]))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else {
      inputs.emplace_back(argv[i]);
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...: no inputs\n", argv[0]);
    return 2;
  }
  for (auto& p : inputs) {
    const std::string bytes = qkv::read_file(p.string());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%zu inputs, no failure\n", inputs.size());
  return 0;
}
