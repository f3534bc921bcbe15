// Reference optimizer updates and gradient-norm sums: one parameter, one
// element at a time, the formulas of src/kernels/kernels.h as written.
#include <cmath>

#include "src/kernels/kernels.h"

namespace qkv::ref {

void adamw_step(const AdamWStep& s, const std::vector<ParamSpan>& params) {
  for (const ParamSpan& x : params) {
    for (int64_t j = 0; j < x.n; ++j) {
      x.p[j] *= s.decay;
      x.m[j] = s.beta1 * x.m[j] + (1.0f - s.beta1) * x.grad[j];
      x.v[j] = s.beta2 * x.v[j] + (1.0f - s.beta2) * x.grad[j] * x.grad[j];
      x.p[j] -= s.step_size * x.m[j] / (std::sqrt(x.v[j]) / s.bc2_sqrt + s.eps);
    }
  }
}

void sgd_step(const SgdStep& s, const std::vector<ParamSpan>& params) {
  for (const ParamSpan& x : params) {
    for (int64_t j = 0; j < x.n; ++j) {
      const float g = x.grad[j] + s.weight_decay * x.p[j];
      x.m[j] = s.momentum * x.m[j] + g;
      x.p[j] -= s.lr * (s.momentum != 0.0f ? x.m[j] : g);
    }
  }
}

double sum_of_squares(const std::vector<FloatSpan>& spans) {
  double s = 0;
  for (const FloatSpan& x : spans)
    for (int64_t j = 0; j < x.n; ++j) s += (double)x.data[j] * x.data[j];
  return s;
}

void scale_spans(const std::vector<FloatSpan>& spans, float s) {
  for (const FloatSpan& x : spans)
    for (int64_t j = 0; j < x.n; ++j) x.data[j] *= s;
}

}  // namespace qkv::ref
