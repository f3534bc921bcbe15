// The test program's main: GoogleTest's, plus the instruction-set level.
//
// CTest runs the kernel tests once more under each level with QKV_ISA set
// (tests/CMakeLists.txt). On a CPU that cannot run the level asked for, the
// program runs nothing and says so in GoogleTest's words ("[  SKIPPED ]"),
// which CTest reports as skipped: a machine without AVX-512 never reports
// the AVX-512 run as passed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "qkv/cpu.h"
#include "qkv/error.h"

namespace {

// Prints what the kernels run on, once, before the first test.
class RuntimeEnvironment : public testing::Environment {
public:
  void SetUp() override { std::printf("%s", qkv::runtime_summary().c_str()); }
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const char* forced = std::getenv("QKV_ISA");
  if (forced && *forced && !GTEST_FLAG_GET(list_tests)) {
    try {
      const qkv::CpuIsa want = qkv::parse_isa(forced);
      if (!qkv::isa_supported(want)) {
        std::printf("[  SKIPPED ] every test: QKV_ISA=%s, and this CPU (%s) runs at most %s\n", forced,
                    qkv::cpu_info().model_name.c_str(), qkv::isa_name(qkv::cpu_info().best));
        return 0;
      }
    } catch (const qkv::Error& e) {
      std::fprintf(stderr, "QKV_ISA: %s\n", e.what());
      return 1;
    }
  }
  testing::AddGlobalTestEnvironment(new RuntimeEnvironment);
  return RUN_ALL_TESTS();
}
