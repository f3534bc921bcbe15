// The optimizers' element loops (AdamW, SGD, gradient clipping), each over
// every parameter in one OpenMP region: each thread takes its share of every
// tensor, so no thread waits at a barrier between tensors (most of a model's
// tensors are too small to be worth a parallel region of their own).
#include <omp.h>

#include <cmath>

#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {
namespace {

// Runs f(i, begin, end, thread) on every span i's elements [0, size(i)) with
// thread < omp_get_max_threads(); serial below 65536 elements in all.
template <class Spans, class F>
void for_each_share(const Spans& spans, F f) {
  int64_t total = 0;
  for (const auto& s : spans) total += s.n;
  if (total < 65536 || omp_get_max_threads() == 1 || omp_in_parallel()) {
    for (size_t i = 0; i < spans.size(); ++i) f(i, 0, spans[i].n, 0);
    return;
  }
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    for (size_t i = 0; i < spans.size(); ++i) f(i, spans[i].n * t / nt, spans[i].n * (t + 1) / nt, t);
  }
}

}  // namespace

// The steps' constants are copied into locals: read through `s`, they could
// alias the parameters the loop writes, and GCC reloaded them every element
// and left the loop scalar (AdamW was 5% of a bf16 ViT training step).
void adamw_step(const AdamWStep& s, const std::vector<ParamSpan>& params) {
  const AdamWStep c = s;
  for_each_share(params, [&](size_t i, int64_t begin, int64_t end, int64_t) {
    float* p = params[i].p;
    float* m = params[i].m;
    float* v = params[i].v;
    const float* d = params[i].grad;
#pragma omp simd
    for (int64_t j = begin; j < end; ++j) {
      p[j] *= c.decay;
      m[j] = c.beta1 * m[j] + (1.0f - c.beta1) * d[j];
      v[j] = c.beta2 * v[j] + (1.0f - c.beta2) * d[j] * d[j];
      p[j] -= c.step_size * m[j] / (std::sqrt(v[j]) / c.bc2_sqrt + c.eps);
    }
  });
}

void sgd_step(const SgdStep& s, const std::vector<ParamSpan>& params) {
  const SgdStep c = s;
  for_each_share(params, [&](size_t i, int64_t begin, int64_t end, int64_t) {
    float* p = params[i].p;
    float* m = params[i].m;
    const float* d = params[i].grad;
#pragma omp simd
    for (int64_t j = begin; j < end; ++j) {
      const float g = d[j] + c.weight_decay * p[j];
      m[j] = c.momentum * m[j] + g;
      p[j] -= c.lr * (c.momentum != 0.0f ? m[j] : g);
    }
  });
}

// Per-thread partial sums, added in thread order: the same total every run
// with the same thread count. Each thread's sum runs in vector lanes (one
// chain of dependent double adds was 2% of a bf16 ViT training step).
double sum_of_squares(const std::vector<FloatSpan>& spans) {
  constexpr int kMaxThreads = 1024;
  double partial[kMaxThreads] = {};
  const bool split = omp_get_max_threads() <= kMaxThreads;
  if (!split) {
    double s = 0;
    for (const FloatSpan& x : spans)
      for (int64_t j = 0; j < x.n; ++j) s += (double)x.data[j] * x.data[j];
    return s;
  }
  for_each_share(spans, [&](size_t i, int64_t begin, int64_t end, int64_t thread) {
    const float* d = spans[i].data;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = begin; j < end; ++j) s += (double)d[j] * d[j];
    partial[thread] += s;
  });
  double total = 0;
  for (int t = 0; t < kMaxThreads; ++t) total += partial[t];
  return total;
}

void scale_spans(const std::vector<FloatSpan>& spans, float s) {
  for_each_share(spans, [&](size_t i, int64_t begin, int64_t end, int64_t) {
    float* d = spans[i].data;
#pragma omp simd
    for (int64_t j = begin; j < end; ++j) d[j] *= s;
  });
}

}  // namespace qkv::cpu::QKV_CPU_NS
