// Copies, accumulation and dropout masks: the loops over raw elements that
// the tensor core, the tape and the dropout op hand to the kernel table.
#include <omp.h>

#include <cstring>

#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {

namespace {

// Below this many bytes or elements a loop runs on the calling thread: a
// parallel region costs more than it saves.
constexpr size_t kParallelBytes = 1 << 18;
constexpr int64_t kParallelElements = 65536;

bool row_major(const StridedCopy& c, const int64_t* strides) {
  int64_t expect = 1;
  for (int64_t k = c.rank - 1; k >= 0; --k) {
    if (c.shape[k] != 1 && strides[k] != expect) return false;
    expect *= c.shape[k];
  }
  return true;
}

// Rows [first, last) of the copy: the index of the first is decomposed once,
// the rest follow by incrementing it.
void copy_rows(const StridedCopy& c, int64_t first, int64_t last) {
  const int64_t n = c.rank, es = (int64_t)c.elem_size;
  const int64_t inner = c.shape[n - 1], ss = c.src_strides[n - 1], ds = c.dst_strides[n - 1];
  const char* sbase = static_cast<const char*>(c.src);
  char* dbase = static_cast<char*>(c.dst);
  int64_t idx[kMaxCopyRank] = {};
  for (int64_t k = n - 2, r = first; k >= 0; --k) idx[k] = r % c.shape[k], r /= c.shape[k];
  for (int64_t row = first; row < last; ++row) {
    int64_t so = 0, dof = 0;
    for (int64_t k = 0; k < n - 1; ++k) {
      so += idx[k] * c.src_strides[k];
      dof += idx[k] * c.dst_strides[k];
    }
    const char* s = sbase + so * es;
    char* d = dbase + dof * es;
    if (ss == 1 && ds == 1) {
      std::memcpy(d, s, inner * es);
    } else if (es == 4) {
      for (int64_t i = 0; i < inner; ++i) std::memcpy(d + i * ds * 4, s + i * ss * 4, 4);
    } else {
      for (int64_t i = 0; i < inner; ++i) std::memcpy(d + i * ds * es, s + i * ss * es, es);
    }
    for (int64_t k = n - 2; k >= 0; --k) {
      if (++idx[k] < c.shape[k]) break;
      idx[k] = 0;
    }
  }
}

}  // namespace

// One memcpy when both sides are row-major; otherwise row by row. Large
// copies split between the threads (a lone thread copying would leave the
// others waiting at the next op).
void strided_copy(const StridedCopy& c) {
  const int64_t n = c.rank;
  if (n == 0) {
    std::memcpy(c.dst, c.src, c.elem_size);
    return;
  }
  int64_t total = 1;
  for (int64_t k = 0; k < n; ++k) total *= c.shape[k];
  if (total == 0) return;
  const size_t bytes = (size_t)total * c.elem_size;
  const bool serial = bytes < kParallelBytes || omp_in_parallel();
  if (row_major(c, c.src_strides) && row_major(c, c.dst_strides)) {
    if (serial) {
      std::memcpy(c.dst, c.src, bytes);
      return;
    }
#pragma omp parallel
    {
      const size_t threads = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
      const size_t first = bytes * t / threads, last = bytes * (t + 1) / threads;
      std::memcpy(static_cast<char*>(c.dst) + first, static_cast<const char*>(c.src) + first, last - first);
    }
    return;
  }
  const int64_t rows = total / c.shape[n - 1];
  if (serial || rows < 2) {
    copy_rows(c, 0, rows);
    return;
  }
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    copy_rows(c, rows * t / threads, rows * (t + 1) / threads);
  }
}

void accumulate(float* acc, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelElements && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

// Each element's number depends only on (rng, first + i): the same mask for
// any number of threads.
void dropout_mask(const Rng& rng, uint64_t first, float p, float* mask, int64_t n) {
  const float keep_scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (n >= kParallelElements && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i) mask[i] = rng.uniform_at(first + (uint64_t)i) < p ? 0.0f : keep_scale;
}

}  // namespace qkv::cpu::QKV_CPU_NS
