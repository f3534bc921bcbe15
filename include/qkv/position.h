// qkv/position.h — positional information: attention itself is blind to
// order, so position enters through the inputs (absolute encodings added to
// the embeddings) or through q and k (rotary).
#pragma once

#include <vector>

#include "qkv/tensor.h"

namespace qkv {

// How a model learns where each token is: added sinusoids, a learned table,
// rotated q and k (RoPE), or a 2-D sinusoidal grid of image patches.
enum class PositionKind { Sinusoidal, Learned, Rope, Sinusoidal2d, SinusoidalHalves };

// Vaswani et al. 2017:  PE[p, 2i] = sin(p / 10000^{2i/D}),  PE[p, 2i+1] = cos(p / 10000^{2i/D}),
// for positions offset .. offset+T-1. -> [T, D] (D even).
Tensor sinusoidal_encoding(int64_t length, int64_t dim, int64_t offset = 0);

// The same angles with every sine first, then every cosine (Marian's layout):
// PE[p, i] = sin(p / 10000^{2i/D}),  PE[p, D/2 + i] = cos(p / 10000^{2i/D}).
Tensor sinusoidal_encoding_halves(int64_t length, int64_t dim, int64_t offset = 0);

// 2-D sinusoidal encoding of an H x W grid of patches, row-major: the first
// D/2 channels encode the row with a 1-D sinusoidal encoding of width D/2,
// the last D/2 the column. -> [H*W, D] (D divisible by 4).
Tensor sinusoidal_encoding_2d(int64_t grid_h, int64_t grid_w, int64_t dim);

// Rotary position embedding (Su et al. 2021) on x [B, H, T, Dh] (Dh even):
// channel pairs (i, i + Dh/2) of the token at position p = offset + t are
// rotated by the angle p * theta^{-2i/Dh}:
//   x'_i = x_i cos a - x_{i+Dh/2} sin a,   x'_{i+Dh/2} = x_{i+Dh/2} cos a + x_i sin a
// so q'.k' depends on the positions only through their difference. The
// backward rotates the gradient by -a. `offset` is the cache length when
// decoding token by token.
//
// Llama 3's long-context scaling ("rope_scaling" of type "llama3") changes
// only the frequencies f_i = theta^{-2i/Dh}. With L = original_context, a
// pair whose wavelength 2 pi / f_i exceeds L / low_freq_factor turns factor
// times slower; one shorter than L / high_freq_factor is kept; between the
// two, with s = (L f_i / 2 pi - low_freq_factor) / (high_freq_factor -
// low_freq_factor), f_i becomes (1 - s) f_i / factor + s f_i.
// How the rotary frequencies are scaled for a longer context:
//   llama3  Llama 3.1's bands (below: kept, blended, divided by the factor)
//   linear  every frequency divided by the factor (position interpolation,
//           Chen et al. 2023: position p is rotated as p / factor was)
//   yarn    YaRN (Peng et al. 2023): pair i of Dh/2 makes r_i = L f_i / 2 pi
//           turns over the original context L. Pairs of many turns are kept,
//           pairs of few are divided by the factor, and between them a ramp
//           in i: with lo = d(beta_fast), hi = d(beta_slow), where d(b) =
//           Dh ln(L / (2 pi b)) / (2 ln theta) is the pair that makes b
//           turns (floored and ceiled when truncate), w_i = clamp((i - lo) /
//           (hi - lo), 0, 1) and f_i becomes (1 - w_i) f_i + w_i f_i /
//           factor. The rotated q and k are also multiplied by
//           attention_factor (0.1 ln factor + 1 by default), so the scores
//           by its square.
//   dynamic NTK-aware scaling that follows the sequence (transformers'
//           "dynamic"): while the positions of a call stay within L =
//           original_context the frequencies are plain; past it, with n =
//           the last position of the call + 1, theta becomes theta (factor n
//           / L - (factor - 1))^(Dh / (Dh - 2)). So the keys a KV cache holds
//           keep the rotation of the step that made them, as in transformers.
enum class RopeScalingKind { Llama3, Linear, Yarn, Dynamic };
struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::Llama3;
  float factor = 1.0f;  // 1: no scaling
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_context = 8192;            // llama3, yarn and dynamic
  float beta_fast = 32.0f, beta_slow = 1.0f;  // yarn
  float attention_factor = 1.0f;              // yarn
  bool truncate = true;                       // yarn

  bool active() const { return factor != 1.0f; }
};
struct RopeOptions {
  int64_t offset = 0;
  float theta = 10000.0f;
  RopeScaling scaling;
};
Tensor rope(const Tensor& x, RopeOptions options = {});

// The Dh/2 frequencies f_i the rotation uses, scaling applied (in double),
// for a call whose last position is seq_len - 1 (only dynamic scaling reads it).
std::vector<double> rope_frequencies(int64_t dh, float theta, const RopeScaling& scaling = {}, int64_t seq_len = 0);

}  // namespace qkv
