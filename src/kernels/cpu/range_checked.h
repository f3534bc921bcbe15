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
// bits), `ld` elements apart, from p.
#ifdef QKV_ASAN_RANGES
template <class T>
[[gnu::noinline]] void check_rows(Access access, const T* p, int64_t rows, int64_t width, int64_t ld) {
  if (width <= 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    void* row = const_cast<T*>(p + r * ld);
    if (void* bad = __asan_region_is_poisoned(row, sizeof(T) * width))
      __asan_report_error(__builtin_return_address(0), __builtin_frame_address(0), __builtin_frame_address(0), bad,
                          access == Access::Write, sizeof(T) * width);
  }
}
#else
template <class T>
inline void check_rows(Access, const T*, int64_t, int64_t, int64_t) {}
#endif

}  // namespace qkv::cpu::QKV_CPU_NS
