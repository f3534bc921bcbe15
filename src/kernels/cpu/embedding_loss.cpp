// Fast embedding lookup and fused cross-entropy (log-softmax never materialized).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/kernels/cpu/vec_math.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {

void embedding_forward(const float* weight, const int64_t* ids, float* out, int64_t tokens, int64_t dim) {
#pragma omp parallel for schedule(static) if (tokens * dim >= 65536)
  for (int64_t t = 0; t < tokens; ++t) std::memcpy(out + t * dim, weight + ids[t] * dim, dim * sizeof(float));
}

// Columns split across threads: every thread walks all tokens in order, so
// the sum for a repeated id is formed in the same order for any thread count.
void embedding_backward(const float* dout, const int64_t* ids, float* dweight, int64_t tokens, int64_t dim) {
  const int64_t block = 64, blocks = (dim + block - 1) / block;
#pragma omp parallel for schedule(static) if (tokens * dim >= 65536 && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * block, c1 = std::min(dim, c0 + block);
    for (int64_t t = 0; t < tokens; ++t) {
      float* dst = dweight + ids[t] * dim;
      const float* src = dout + t * dim;
      for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
    }
  }
}

void cross_entropy_forward(const float* logits, const int64_t* targets, float* loss, float* lse, int64_t rows,
                           int64_t vocab, int64_t ignore_index, float smoothing) {
#pragma omp parallel for schedule(static) if (rows * vocab >= 16384 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vocab;
    const float mx = max_of(x, vocab);
    float sum_x = 0;
#pragma omp simd reduction(+ : sum_x)
    for (int64_t j = 0; j < vocab; ++j) sum_x += x[j];
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < vocab; ++j) s += fast_exp(x[j] - mx);
    const float l = mx + std::log(s);
    lse[r] = l;
    if (targets[r] == ignore_index) {
      loss[r] = 0;
      continue;
    }
    // mean_v(-logp_v) = lse - mean_v(x_v)
    loss[r] = (1.0f - smoothing) * (l - x[targets[r]]) + smoothing * (l - sum_x / vocab);
  }
}

void cross_entropy_backward(const float* logits, const int64_t* targets, const float* lse, float scale,
                            float* dlogits, int64_t rows, int64_t vocab, int64_t ignore_index, float smoothing) {
#pragma omp parallel for schedule(static) if (rows * vocab >= 16384 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dlogits + r * vocab;
    if (targets[r] == ignore_index) {
      std::fill(d, d + vocab, 0.0f);
      continue;
    }
    const float* x = logits + r * vocab;
    const float l = lse[r], off = smoothing / vocab;
    for (int64_t j = 0; j < vocab; ++j) d[j] = scale * (fast_exp(x[j] - l) - off);
    d[targets[r]] -= scale * (1.0f - smoothing);
  }
}

}  // namespace qkv::cpu::QKV_CPU_NS
