// The test program's main: GoogleTest's, plus the instruction-set level.
//
// CTest runs the kernel tests once more under each level with QKV_ISA set
// (tests/CMakeLists.txt). On a CPU that cannot run the level asked for, the
// program runs nothing and says so in GoogleTest's words ("[  SKIPPED ]"),
// which CTest reports as skipped: a machine without AVX-512 never reports
// the AVX-512 run as passed. The same for the run with AMX, AVX512-BF16 and
// AVX512-VNNI turned off (QKV_CPU_FEATURES_OFF) on a CPU that has none of them.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

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
  // The run with extensions turned off (QKV_CPU_FEATURES_OFF): on a CPU that
  // has none of them it would repeat the plain run, so it is skipped too.
  const char* off = std::getenv("QKV_CPU_FEATURES_OFF");
  if (off && *off && !GTEST_FLAG_GET(list_tests)) {
    try {
      bool any = false;
      for (const std::string& f : qkv::parse_features_off(off)) any = any || qkv::cpu_info().has(f);
      if (!any) {
        std::printf("[  SKIPPED ] every test: QKV_CPU_FEATURES_OFF=%s, and this CPU (%s) has none of them\n", off,
                    qkv::cpu_info().model_name.c_str());
        return 0;
      }
    } catch (const qkv::Error& e) {
      std::fprintf(stderr, "QKV_CPU_FEATURES_OFF: %s\n", e.what());
      return 1;
    }
  }
  testing::AddGlobalTestEnvironment(new RuntimeEnvironment);
  return RUN_ALL_TESTS();
}
