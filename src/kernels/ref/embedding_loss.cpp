// Reference embedding lookup and cross-entropy, in double.
#include <cmath>

#include "src/kernels/kernels.h"

namespace qkv::ref {

void embedding_forward(const float* weight, const int64_t* ids, float* out, int64_t tokens, int64_t dim) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < dim; ++j) out[t * dim + j] = weight[ids[t] * dim + j];
}

void embedding_backward(const float* dout, const int64_t* ids, float* dweight, int64_t tokens, int64_t dim) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < dim; ++j) dweight[ids[t] * dim + j] += dout[t * dim + j];
}

static double row_lse(const float* x, int64_t n) {
  double mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::fmax(mx, x[j]);
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - mx);
  return mx + std::log(s);
}

void cross_entropy_forward(const float* logits, const int64_t* targets, float* loss, float* lse, int64_t rows,
                           int64_t vocab, int64_t ignore_index, float smoothing) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vocab;
    double l = row_lse(x, vocab);
    lse[r] = (float)l;
    if (targets[r] == ignore_index) {
      loss[r] = 0;
      continue;
    }
    double nll = l - x[targets[r]];
    double mean_nll = 0;
    for (int64_t j = 0; j < vocab; ++j) mean_nll += l - x[j];
    mean_nll /= vocab;
    loss[r] = (float)((1.0 - smoothing) * nll + smoothing * mean_nll);
  }
}

void cross_entropy_backward(const float* logits, const int64_t* targets, const float* lse, float scale,
                            float* dlogits, int64_t rows, int64_t vocab, int64_t ignore_index, float smoothing) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < vocab; ++j) {
      if (targets[r] == ignore_index) {
        dlogits[r * vocab + j] = 0;
        continue;
      }
      double p = std::exp((double)logits[r * vocab + j] - lse[r]);
      double q = smoothing / vocab + (j == targets[r] ? 1.0 - smoothing : 0.0);
      dlogits[r * vocab + j] = (float)(scale * (p - q));
    }
  }
}

}  // namespace qkv::ref
