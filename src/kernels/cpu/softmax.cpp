// Fast softmax and log-softmax over the last axis: rows in parallel, float math.
#include <algorithm>
#include <cmath>

#include "src/kernels/cpu/vec_math.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {

void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float mx = max_of(xr, cols);
    if (mx == -INFINITY) {  // fully masked row: zeros, never NaN
      std::fill(yr, yr + cols, 0.0f);
      continue;
    }
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < cols; ++j) {
      yr[j] = fast_exp(xr[j] - mx);
      s += yr[j];
    }
    float inv = 1.0f / s;
    for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;
  }
}

void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < cols; ++j) dot += dyr[j] * yr[j];
    for (int64_t j = 0; j < cols; ++j) dx[r * cols + j] = yr[j] * (dyr[j] - dot);
  }
}

void log_softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float mx = max_of(xr, cols);
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < cols; ++j) s += fast_exp(xr[j] - mx);
    float lse = mx + std::log(s);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = xr[j] - lse;
  }
}

void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < cols; ++j) s += dyr[j];
    for (int64_t j = 0; j < cols; ++j) dx[r * cols + j] = dyr[j] - fast_exp(y[r * cols + j]) * s;
  }
}

}  // namespace qkv::cpu::QKV_CPU_NS
