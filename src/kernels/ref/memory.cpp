// Reference copies, accumulation and dropout masks: one element at a time.
#include <cstring>
#include <vector>

#include "src/kernels/kernels.h"

namespace qkv::ref {

void strided_copy(const StridedCopy& c) {
  const size_t n = (size_t)c.rank;
  int64_t total = 1;
  for (size_t k = 0; k < n; ++k) total *= c.shape[k];
  std::vector<int64_t> idx(n, 0);
  for (int64_t e = 0; e < total; ++e) {
    int64_t so = 0, dof = 0;
    for (size_t k = 0; k < n; ++k) so += idx[k] * c.src_strides[k], dof += idx[k] * c.dst_strides[k];
    std::memcpy(static_cast<char*>(c.dst) + dof * (int64_t)c.elem_size,
                static_cast<const char*>(c.src) + so * (int64_t)c.elem_size, c.elem_size);
    for (size_t k = n; k-- > 0;) {  // the next index, row-major
      if (++idx[k] < c.shape[k]) break;
      idx[k] = 0;
    }
  }
}

void accumulate(float* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

void dropout_mask(const Rng& rng, uint64_t first, float p, float* mask, int64_t n) {
  for (int64_t i = 0; i < n; ++i) mask[i] = rng.uniform_at(first + (uint64_t)i) < p ? 0.0f : 1.0f / (1.0f - p);
}

}  // namespace qkv::ref
