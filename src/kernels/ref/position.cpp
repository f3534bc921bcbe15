// Reference rotary position embedding, in double.
#include <cmath>

#include "src/kernels/kernels.h"

namespace qkv::ref {

void rope(const float* x, float* y, int64_t rows, int64_t t_len, int64_t dh, int64_t offset, const double* freq,
          float sign) {
  const int64_t half = dh / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < t_len; ++t) {
      const float* a = x + (r * t_len + t) * dh;
      float* b = y + (r * t_len + t) * dh;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = (double)(offset + t) * freq[i];
        const double c = std::cos(angle), s = sign * std::sin(angle);
        b[i] = (float)(a[i] * c - a[i + half] * s);
        b[i + half] = (float)(a[i + half] * c + a[i] * s);
      }
    }
}

}  // namespace qkv::ref
