#include "src/core/strided.h"

#include <omp.h>

#include <cstring>
#include <vector>

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
  auto row_major = [&](const Shape& strides) {
    int64_t expect = 1;
    for (int64_t k = n - 1; k >= 0; --k) {
      if (src.shape[k] != 1 && strides[k] != expect) return false;
      expect *= src.shape[k];
    }
    return true;
  };
  if (row_major(src.strides) && row_major(dst.strides)) {  // one block of bytes
    const size_t bytes = (size_t)total * es;
    if (bytes < (1u << 18) || omp_in_parallel()) {
      std::memcpy(dbase, sbase, bytes);
      return;
    }
#pragma omp parallel
    {
      const size_t threads = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
      const size_t first = bytes * t / threads, last = bytes * (t + 1) / threads;
      std::memcpy(dbase + first, sbase + first, last - first);
    }
    return;
  }
  const int64_t inner = src.shape[n - 1], rows = total / inner;
  const int64_t ss = src.strides[n - 1], ds = dst.strides[n - 1];
  // Rows [first, last): the index of the first is decomposed once, the rest
  // follow by incrementing it. Large copies split the rows between threads
  // (a lone thread copying would leave the others waiting at the next op).
  auto copy_rows = [&](int64_t first, int64_t last) {
    std::vector<int64_t> idx(n, 0);
    for (int64_t k = n - 2, r = first; k >= 0; --k) idx[k] = r % src.shape[k], r /= src.shape[k];
    for (int64_t row = first; row < last; ++row) {
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
  };
  if (total * (int64_t)es < (1 << 18) || rows < 2 || omp_in_parallel()) {
    copy_rows(0, rows);
    return;
  }
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    copy_rows(rows * t / threads, rows * (t + 1) / threads);
  }
}

}  // namespace qkv
