#include "src/core/strided.h"

#include <cstring>

namespace qkv {

// Walks all indices of `shape` in row-major order; the innermost dimension is
// a plain strided loop, so contiguous tensors copy as one memcpy per row.
void strided_copy(const TensorImpl& src, TensorImpl& dst) {
  const size_t es = dtype_size(src.dtype);
  const int64_t n = (int64_t)src.shape.size();
  const char* sbase = static_cast<const char*>(src.storage->data) + src.offset * es;
  char* dbase = static_cast<char*>(dst.storage->data) + dst.offset * es;
  if (n == 0) {
    std::memcpy(dbase, sbase, es);
    return;
  }
  int64_t total = shape_numel(src.shape);
  if (total == 0) return;
  const int64_t inner = src.shape[n - 1];
  const int64_t ss = src.strides[n - 1], ds = dst.strides[n - 1];
  std::vector<int64_t> idx(n, 0);
  for (int64_t row = 0; row < total / inner; ++row) {
    int64_t so = 0, dof = 0;
    for (int64_t k = 0; k < n - 1; ++k) {
      so += idx[k] * src.strides[k];
      dof += idx[k] * dst.strides[k];
    }
    const char* s = sbase + so * (int64_t)es;
    char* d = dbase + dof * (int64_t)es;
    if (ss == 1 && ds == 1) {
      std::memcpy(d, s, inner * es);
    } else if (es == 4) {
      for (int64_t i = 0; i < inner; ++i) std::memcpy(d + i * ds * 4, s + i * ss * 4, 4);
    } else {
      for (int64_t i = 0; i < inner; ++i) std::memcpy(d + i * ds * (int64_t)es, s + i * ss * (int64_t)es, es);
    }
    for (int64_t k = n - 2; k >= 0; --k) {
      if (++idx[k] < src.shape[k]) break;
      idx[k] = 0;
    }
  }
}

}  // namespace qkv
