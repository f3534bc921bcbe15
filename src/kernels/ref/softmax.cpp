// Reference softmax and log-softmax over the last axis, in double.
#include <cmath>

#include "src/kernels/kernels.h"

namespace qkv::ref {

// softmax(x)_j = exp(x_j - max x) / sum_k exp(x_k - max x)
void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    double mx = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) mx = std::fmax(mx, xr[j]);
    if (std::isinf(mx) && mx < 0) {  // every entry masked: define the row as zeros
      for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = 0;
      continue;
    }
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(xr[j] - mx);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = (float)(std::exp(xr[j] - mx) / s);
  }
}

// dx_j = y_j (dy_j - sum_k dy_k y_k)
void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (int64_t j = 0; j < cols; ++j) dot += (double)dy[r * cols + j] * y[r * cols + j];
    for (int64_t j = 0; j < cols; ++j) dx[r * cols + j] = (float)(y[r * cols + j] * (dy[r * cols + j] - dot));
  }
}

// log_softmax(x)_j = x_j - log sum_k exp(x_k)
void log_softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    double mx = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) mx = std::fmax(mx, xr[j]);
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(xr[j] - mx);
    double lse = mx + std::log(s);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = (float)(xr[j] - lse);
  }
}

// dx_j = dy_j - exp(y_j) sum_k dy_k
void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += dy[r * cols + j];
    for (int64_t j = 0; j < cols; ++j)
      dx[r * cols + j] = (float)(dy[r * cols + j] - std::exp((double)y[r * cols + j]) * s);
  }
}

}  // namespace qkv::ref
