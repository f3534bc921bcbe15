// Sinusoidal encodings (1-D and 2-D) and rotary position embedding.
#include "qkv/position.h"

#include <cmath>

#include "src/ops/dispatch.h"

namespace qkv {

// The sine and cosine of angle i: channels 2i and 2i+1, or i and D/2+i (halves).
static Tensor sinusoids(int64_t length, int64_t dim, int64_t offset, bool halves) {
  QKV_CHECK(dim > 0 && dim % 2 == 0, "sinusoidal_encoding: dim must be even and positive, got ", dim);
  QKV_CHECK(length >= 0 && offset >= 0, "sinusoidal_encoding: negative length or offset");
  Tensor pe = Tensor::empty({length, dim});
  float* p = pe.data<float>();
  for (int64_t t = 0; t < length; ++t)
    for (int64_t i = 0; i < dim / 2; ++i) {
      double angle = (double)(t + offset) / std::pow(10000.0, 2.0 * i / dim);
      p[t * dim + (halves ? i : 2 * i)] = (float)std::sin(angle);
      p[t * dim + (halves ? dim / 2 + i : 2 * i + 1)] = (float)std::cos(angle);
    }
  return pe;
}

Tensor sinusoidal_encoding(int64_t length, int64_t dim, int64_t offset) {
  return sinusoids(length, dim, offset, false);
}

Tensor sinusoidal_encoding_halves(int64_t length, int64_t dim, int64_t offset) {
  return sinusoids(length, dim, offset, true);
}

Tensor sinusoidal_encoding_2d(int64_t grid_h, int64_t grid_w, int64_t dim) {
  QKV_CHECK(dim > 0 && dim % 4 == 0, "sinusoidal_encoding_2d: dim must be a positive multiple of 4, got ", dim);
  Tensor rows = sinusoidal_encoding(grid_h, dim / 2), cols = sinusoidal_encoding(grid_w, dim / 2);
  Tensor pe = Tensor::empty({grid_h * grid_w, dim});
  for (int64_t r = 0; r < grid_h; ++r)
    for (int64_t c = 0; c < grid_w; ++c) {
      float* dst = pe.data<float>() + (r * grid_w + c) * dim;
      std::copy_n(rows.data<float>() + r * dim / 2, dim / 2, dst);
      std::copy_n(cols.data<float>() + c * dim / 2, dim / 2, dst + dim / 2);
    }
  return pe;
}

std::vector<double> rope_frequencies(int64_t dh, float theta, const RopeScaling& s, int64_t seq_len) {
  QKV_CHECK(dh >= 0 && dh % 2 == 0, "rope: the head dimension must be even, got ", dh);
  QKV_CHECK(theta > 0.0f, "rope: theta must be positive, got ", theta);
  double base = theta;
  if (s.active() && s.kind == RopeScalingKind::Dynamic) {
    QKV_CHECK(s.factor > 0.0f && s.original_context > 0 && dh > 2,
              "rope: dynamic scaling needs factor > 0, original_context > 0 and a head dimension above 2");
    const double n = (double)std::max(seq_len, s.original_context), L = (double)s.original_context;
    base *= std::pow(s.factor * n / L - (s.factor - 1.0), (double)dh / (double)(dh - 2));
  }
  std::vector<double> f(dh / 2);
  for (int64_t i = 0; i < dh / 2; ++i) f[i] = std::pow(base, -2.0 * (double)i / (double)dh);
  if (!s.active() || s.kind == RopeScalingKind::Dynamic) return f;
  if (s.kind == RopeScalingKind::Linear) {
    QKV_CHECK(s.factor > 0.0f, "rope: linear scaling needs factor > 0");
    for (double& fi : f) fi /= s.factor;
    return f;
  }
  if (s.kind == RopeScalingKind::Yarn) {
    QKV_CHECK(s.factor > 0.0f && s.original_context > 0 && s.beta_fast > 0.0f && s.beta_slow > 0.0f,
              "rope: yarn scaling needs factor, original_context, beta_fast and beta_slow > 0");
    const double pi = 3.14159265358979323846, L = (double)s.original_context;
    auto pair_of_turns = [&](double turns) { return dh * std::log(L / (turns * 2 * pi)) / (2 * std::log((double)theta)); };
    double lo = pair_of_turns(s.beta_fast), hi = pair_of_turns(s.beta_slow);
    if (s.truncate) lo = std::floor(lo), hi = std::ceil(hi);
    lo = std::max(lo, 0.0), hi = std::min(hi, (double)dh - 1);
    if (lo == hi) hi += 0.001;  // one pair at the boundary: a step, not 0 / 0
    for (int64_t i = 0; i < dh / 2; ++i) {
      const double w = std::clamp(((double)i - lo) / (hi - lo), 0.0, 1.0);  // 0: kept, 1: divided by the factor
      f[i] = (1 - w) * f[i] + w * f[i] / s.factor;
    }
    return f;
  }
  QKV_CHECK(s.factor > 0.0f && s.original_context > 0 && s.low_freq_factor < s.high_freq_factor,
            "rope: scaling needs factor > 0, original_context > 0 and low_freq_factor < high_freq_factor");
  const double L = (double)s.original_context, pi = 3.14159265358979323846;
  for (double& fi : f) {
    const double wavelength = 2.0 * pi / fi;
    if (wavelength > L / s.low_freq_factor) {
      fi /= s.factor;
    } else if (wavelength >= L / s.high_freq_factor) {
      const double smooth = (L / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      fi = (1.0 - smooth) * fi / s.factor + smooth * fi;
    }
  }
  return f;
}

Tensor rope(const Tensor& x_in, RopeOptions o) {
  require_f32(x_in, "rope", "x");
  QKV_CHECK(x_in.dim() >= 2 && x_in.size(-1) % 2 == 0, "rope: x must be [..., T, Dh] with Dh even, got ",
            shape_str(x_in.shape()));
  QKV_CHECK(o.offset >= 0, "rope: negative offset ", o.offset);
  Tensor x = contiguous_values(x_in);
  const int64_t dh = x.size(-1), t_len = x.size(-2), rows = x.numel() / std::max<int64_t>(dh * t_len, 1);
  auto freq = std::make_shared<const std::vector<double>>(rope_frequencies(dh, o.theta, o.scaling, o.offset + t_len));
  // YaRN's attention factor multiplies the rotated vector (q and k: the scores by its square).
  const float gain = o.scaling.active() && o.scaling.kind == RopeScalingKind::Yarn ? o.scaling.attention_factor : 1.0f;
  auto times_gain = [gain](Tensor& t) {
    if (gain != 1.0f) QKV_KERNEL(scale_spans)({{t.data<float>(), t.numel()}}, gain);
  };
  Tensor y = Tensor::empty(x.shape());
  QKV_KERNEL(rope)(x.data<float>(), y.data<float>(), rows, t_len, dh, o.offset, freq->data(), 1.0f);
  times_gain(y);
  record_op(y, "rope", {x_in}, [o, rows, t_len, dh, freq, times_gain](const BackwardArgs& a) -> std::vector<Tensor> {
    Tensor g = a.grad_out.contiguous();
    Tensor dx = Tensor::empty(g.shape());
    QKV_KERNEL(rope)(g.data<float>(), dx.data<float>(), rows, t_len, dh, o.offset, freq->data(), -1.0f);  // R^T = R(-a)
    times_gain(dx);
    return {dx};
  });
  return y;
}

}  // namespace qkv
