// Reference LayerNorm and RMSNorm over the last axis, in double.
#include <cmath>

#include "src/kernels/kernels.h"

namespace qkv::ref {

// y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps), var biased.
void layer_norm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    double m = 0;
    for (int64_t j = 0; j < cols; ++j) m += xr[j];
    m /= cols;
    double v = 0;
    for (int64_t j = 0; j < cols; ++j) v += (xr[j] - m) * (xr[j] - m);
    v /= cols;
    double rs = 1.0 / std::sqrt(v + eps);
    mean[r] = (float)m;
    rstd[r] = (float)rs;
    for (int64_t j = 0; j < cols; ++j) {
      double h = (xr[j] - m) * rs;
      y[r * cols + j] = (float)(h * (w ? w[j] : 1.0) + (b ? b[j] : 0.0));
    }
  }
}

// With xhat = (x - mean) rstd and g = dy * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum_rows dy * xhat,  db = sum_rows dy
void layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                         float* dx, float* dw, float* db, int64_t rows, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) {
    if (dw) dw[j] = 0;
    if (db) db[j] = 0;
  }
  for (int64_t r = 0; r < rows; ++r) {
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < cols; ++j) {
      double xhat = (x[r * cols + j] - mean[r]) * (double)rstd[r];
      double g = dy[r * cols + j] * (w ? w[j] : 1.0);
      mg += g;
      mgx += g * xhat;
      if (dw) dw[j] += (float)(dy[r * cols + j] * xhat);
      if (db) db[j] += dy[r * cols + j];
    }
    mg /= cols;
    mgx /= cols;
    if (!dx) continue;
    for (int64_t j = 0; j < cols; ++j) {
      double xhat = (x[r * cols + j] - mean[r]) * (double)rstd[r];
      double g = dy[r * cols + j] * (w ? w[j] : 1.0);
      dx[r * cols + j] = (float)(rstd[r] * (g - mg - xhat * mgx));
    }
  }
}

// y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps)
void rms_norm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < cols; ++j) ms += (double)x[r * cols + j] * x[r * cols + j];
    double rs = 1.0 / std::sqrt(ms / cols + eps);
    rstd[r] = (float)rs;
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = (float)(x[r * cols + j] * rs * (w ? w[j] : 1.0));
  }
}

// With g = dy * w:  dx = rstd * (g - x * rstd^2 * mean(g * x)),  dw = sum_rows dy * x * rstd
void rms_norm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                       int64_t rows, int64_t cols) {
  if (dw)
    for (int64_t j = 0; j < cols; ++j) dw[j] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double rs = rstd[r], mgx = 0;
    for (int64_t j = 0; j < cols; ++j) {
      mgx += dy[r * cols + j] * (w ? w[j] : 1.0) * x[r * cols + j];
      if (dw) dw[j] += (float)(dy[r * cols + j] * x[r * cols + j] * rs);
    }
    mgx /= cols;
    if (!dx) continue;
    for (int64_t j = 0; j < cols; ++j) {
      double g = dy[r * cols + j] * (w ? w[j] : 1.0);
      dx[r * cols + j] = (float)(rs * (g - x[r * cols + j] * rs * rs * mgx));
    }
  }
}

}  // namespace qkv::ref
