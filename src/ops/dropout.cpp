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
  Tensor mask = Tensor::empty(x.shape());
  QKV_KERNEL(dropout_mask)(rng, first, options.p, mask.data<float>(), n);
  return mul(x, mask);
}

}  // namespace qkv
