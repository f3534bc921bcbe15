// Internal to the CPU kernel variants: kernels whose memory is checked by
// AddressSanitizer a range at a time, where the sanitizer builds compile
// their file without instrumentation (CMakeLists.txt names the files).
//
// Instrumented load by load, the float32 panels' register tiles (a broadcast
// of A and three vectors of B per step, each with its shadow check and
// UBSan's overflow checks) no longer fit the registers: under
// `make test-asan` they ran about 20x slower than in release and took most of
// the sanitizer suite's time. Such a file instead calls check_rows for every
// range of memory a function reads or writes, before touching it: a byte
// that is not addressable (past an allocation, freed, a stack redzone) gets
// AddressSanitizer's usual report and stops the program. Outside sanitizer
// builds check_rows is nothing.
#pragma once

#include <cstdint>

#ifndef QKV_CPU_NS
#error "range_checked.h belongs to a kernel variant: define QKV_CPU_NS (CMake does for src/kernels/cpu)"
#endif

#if defined(__has_include)
#if __has_include(<sanitizer/asan_interface.h>) && defined(QKV_RANGE_CHECKS)
#include <sanitizer/asan_interface.h>
#define QKV_ASAN_RANGES 1
#endif
#endif

namespace qkv::cpu::QKV_CPU_NS {

enum class Access { Read, Write };

// Rows [0, rows) of `width` elements each (floats, or bfloat16 as raw
// bits), `ld` elements apart, from p. (Overloads, not a template: a template
// instance's name begins with its return type, outside the variant's
// namespace to scripts/check_kernel_variants.sh.)
#ifdef QKV_ASAN_RANGES
[[gnu::noinline]] inline void check_bytes(Access access, const void* p, int64_t rows, int64_t bytes, int64_t ld_bytes,
                                          void* caller) {
  if (bytes <= 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    void* row = const_cast<char*>(static_cast<const char*>(p) + r * ld_bytes);
    if (void* bad = __asan_region_is_poisoned(row, bytes))
      __asan_report_error(caller, __builtin_frame_address(0), __builtin_frame_address(0), bad,
                          access == Access::Write, bytes);
  }
}
[[gnu::noinline]] inline void check_rows(Access access, const float* p, int64_t rows, int64_t width, int64_t ld) {
  check_bytes(access, p, rows, sizeof(float) * width, sizeof(float) * ld, __builtin_return_address(0));
}
[[gnu::noinline]] inline void check_rows(Access access, const uint16_t* p, int64_t rows, int64_t width, int64_t ld) {
  check_bytes(access, p, rows, sizeof(uint16_t) * width, sizeof(uint16_t) * ld, __builtin_return_address(0));
}
#else
inline void check_rows(Access, const float*, int64_t, int64_t, int64_t) {}
inline void check_rows(Access, const uint16_t*, int64_t, int64_t, int64_t) {}
#endif

}  // namespace qkv::cpu::QKV_CPU_NS
