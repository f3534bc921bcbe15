// Dropout: y = x * m / (1 - p), m_i ~ Bernoulli(1 - p); dy/dx = m / (1 - p).
// The mask is a pure function of (rng seed, counter, element index), so it is
// the same for any number of threads.
#include "qkv/rng.h"
#include "src/ops/dispatch.h"

namespace qkv {

Tensor dropout(const Tensor& x, Rng& rng, DropoutOptions options) {
  require_f32(x, "dropout", "x");
  QKV_CHECK(options.p >= 0.0f && options.p < 1.0f, "dropout: p must be in [0, 1), got ", options.p);
  if (!options.training || options.p == 0.0f) return x;
  const int64_t n = x.numel();
  const uint64_t first = rng.reserve((uint64_t)n);
  const float keep_scale = 1.0f / (1.0f - options.p);
  Tensor mask = Tensor::empty(x.shape());
  float* m = mask.data<float>();
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) m[i] = rng.uniform_at(first + (uint64_t)i) < options.p ? 0.0f : keep_scale;
  return mul(x, mask);
}

}  // namespace qkv
