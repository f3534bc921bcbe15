// Fast rotary position embedding: the cos and sin of each (position, pair)
// are computed once per call (t_len x dh/2 of them, in double), not once per
// row; the rows then run across threads with a vectorizable inner loop.
#include <cmath>

#include "src/kernels/cpu/scratch.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {

void rope(const float* x, float* y, int64_t rows, int64_t t_len, int64_t dh, int64_t offset, const double* freq,
          float sign) {
  const int64_t half = dh / 2;
  Scratch table(2 * t_len * half);
  float* cos_t = table.data();
  float* sin_t = table.data() + t_len * half;
  for (int64_t t = 0; t < t_len; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = (double)(offset + t) * freq[i];
      cos_t[t * half + i] = (float)std::cos(angle);
      sin_t[t * half + i] = sign * (float)std::sin(angle);
    }
#pragma omp parallel for schedule(static) if (rows * t_len * dh >= 32768)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < t_len; ++t) {
      const float* a = x + (r * t_len + t) * dh;
      float* b = y + (r * t_len + t) * dh;
      const float* c = cos_t + t * half;
      const float* s = sin_t + t * half;
      for (int64_t i = 0; i < half; ++i) {
        const float lo = a[i], hi = a[i + half];
        b[i] = lo * c[i] - hi * s[i];
        b[i + half] = hi * c[i] + lo * s[i];
      }
    }
}

}  // namespace qkv::cpu::QKV_CPU_NS
