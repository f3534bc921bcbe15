// Fast LayerNorm and RMSNorm: rows in parallel for x and dx; the parameter
// gradients (sums over rows) in parallel over column blocks, so no thread
// shares an accumulator and the order of additions is fixed.
#include <algorithm>
#include <cmath>

#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {

constexpr int64_t kColumnBlock = 64;

void layer_norm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t cols, float eps) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < cols; ++j) s += xr[j];
    float m = s / cols;
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < cols; ++j) v += (xr[j] - m) * (xr[j] - m);
    float rs = 1.0f / std::sqrt(v / cols + eps);
    mean[r] = m;
    rstd[r] = rs;
    if (w && b) {
      for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - m) * rs * w[j] + b[j];
    } else {
      for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - m) * rs * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f);
    }
  }
}

void layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                         float* dx, float* dw, float* db, int64_t rows, int64_t cols) {
  if (dx) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      const float m = mean[r], rs = rstd[r];
      float mg = 0, mgx = 0;
#pragma omp simd reduction(+ : mg, mgx)
      for (int64_t j = 0; j < cols; ++j) {
        float g = dyr[j] * (w ? w[j] : 1.0f);
        mg += g;
        mgx += g * (xr[j] - m) * rs;
      }
      mg /= cols;
      mgx /= cols;
      for (int64_t j = 0; j < cols; ++j) {
        float g = dyr[j] * (w ? w[j] : 1.0f);
        dx[r * cols + j] = rs * (g - mg - (xr[j] - m) * rs * mgx);
      }
    }
  }
  if (!dw && !db) return;
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(cols, c0 + kColumnBlock);
    float accw[kColumnBlock] = {}, accb[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      const float m = mean[r], rs = rstd[r];
      for (int64_t j = c0; j < c1; ++j) {
        accw[j - c0] += dyr[j] * (xr[j] - m) * rs;
        accb[j - c0] += dyr[j];
      }
    }
    for (int64_t j = c0; j < c1; ++j) {
      if (dw) dw[j] = accw[j - c0];
      if (db) db[j] = accb[j - c0];
    }
  }
}

void rms_norm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols, float eps) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < cols; ++j) ss += xr[j] * xr[j];
    float rs = 1.0f / std::sqrt(ss / cols + eps);
    rstd[r] = rs;
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = xr[j] * rs * (w ? w[j] : 1.0f);
  }
}

void rms_norm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                       int64_t rows, int64_t cols) {
  if (dx) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      const float rs = rstd[r];
      float mgx = 0;
#pragma omp simd reduction(+ : mgx)
      for (int64_t j = 0; j < cols; ++j) mgx += dyr[j] * (w ? w[j] : 1.0f) * xr[j];
      mgx /= cols;
      for (int64_t j = 0; j < cols; ++j) dx[r * cols + j] = rs * (dyr[j] * (w ? w[j] : 1.0f) - xr[j] * rs * rs * mgx);
    }
  }
  if (!dw) return;
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(cols, c0 + kColumnBlock);
    float acc[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = c0; j < c1; ++j) acc[j - c0] += dy[r * cols + j] * x[r * cols + j] * rstd[r];
    for (int64_t j = c0; j < c1; ++j) dw[j] = acc[j - c0];
  }
}

}  // namespace qkv::cpu::QKV_CPU_NS
