// Branch-free float math the compiler vectorizes at every level (SSE2, AVX2,
// AVX-512), for the fast kernels. The variants are compiled with
// -fno-trapping-math: with FP exceptions observable, GCC will not evaluate
// both sides of a select such as `x < -87.3f ? 0 : p * scale` unless the
// level has masked instructions (AVX-512), and on AVX2 every loop calling
// these stayed scalar (softmax and GELU 2-7x slower on a Zen 3). Each is
// checked against the standard library through the reference kernels in
// tests/test_ops.cpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

// Each kernel variant compiles these for its own instruction set, so they
// live in its namespace: inline functions shared by name between variants
// would let the linker keep one copy (say the AVX-512 one) for all of them.
#ifndef QKV_CPU_NS
#error "vec_math.h belongs to a kernel variant: define QKV_CPU_NS (CMake does for src/kernels/cpu)"
#endif

namespace qkv::cpu::QKV_CPU_NS {

// max_j x[j] (-inf for n = 0; a NaN is passed over). Sixteen running maxima
// side by side: GCC will not vectorize a max reduction written as one
// `m = std::max(m, x[j])` (not even under `omp simd reduction(max)`), and that
// scalar chain was 40% of the flash forward's own time; lane by lane it
// becomes one vector max per 16 elements at every level.
inline float max_of(const float* x, int64_t n) {
  float lane[16];
  for (float& l : lane) l = -INFINITY;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  float m = -INFINITY;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  for (float l : lane) m = l > m ? l : m;
  return m;
}

// x rounded to the nearest bfloat16 (ties to even; a NaN stays NaN, made
// quiet so that its top 16 bits are one too), as a float, as
// qkv::float_to_bf16 rounds: gemm_bf16 packs its operands with it, and the
// float32 kernels that multiply rounded copies instead (products of bfloat16
// values are exact in float32) make them with it. Integer operations only,
// so loops of it vectorize.
inline float round_to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return std::bit_cast<float>((u & 0x7fffffffu) > 0x7f800000u ? u | 0x00400000u : r);
}

// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2]
// (ln 2 split in two parts so r stays exact), exp(r) by its Taylor series to
// r^7 (relative error below 2e-7 on that interval). exp(x < -87.3) = 0.
inline float fast_exp(float x) {
  const float clamped = std::min(std::max(x, -87.3f), 88.3f);
  // Round to nearest by adding and subtracting 1.5 * 2^23 (exact for |x| < 2^22):
  // it vectorizes with SSE2 alone, where std::nearbyint needs SSE4.1.
  const float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (clamped - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n from n's bits. A NaN x leaves n NaN (and p, so the result is NaN), but
  // converting NaN to an integer is undefined: the exponent is taken from n
  // clamped with NaN going to 128 (std::min keeps its first argument then).
  const float e = std::max(-127.0f, std::min(128.0f, n));
  const float scale = std::bit_cast<float>((int32_t)(e + 127.0f) << 23);
  return x < -87.3f ? 0.0f : p * scale;
}

inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

// tanh(x) = 1 - 2 / (exp(2x) + 1); near 0 its odd Taylor series instead,
// which keeps the relative error small where the subtraction would cancel.
inline float fast_tanh(float x) {
  const float a = std::fabs(x);
  const float big = 1.0f - 2.0f / (fast_exp(2.0f * a) + 1.0f);
  const float a2 = a * a;
  const float small = a * (1.0f + a2 * (-1.0f / 3 + a2 * (2.0f / 15 + a2 * (-17.0f / 315))));
  return std::copysign(a < 0.125f ? small : big, x);
}

// x clamped to [lo, hi], a NaN kept: for a float, and for a GCC vector of
// floats lane by lane (a comparison of vectors gives a mask that ?: selects
// with).
inline float clamp_to(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }
template <class V>
inline V clamp_to(V x, float lo, float hi) {
  x = x < lo ? V{} + lo : x;
  return x > hi ? V{} + hi : x;
}

// erf(x) = x P(x^2) / Q(x^2) on |x| <= 3.92 (erf(3.92) = 1 - 3e-8; beyond it
// the clamp gives that value), P and Q of degrees 12 and 8 in x, fitted for
// this project (scripts/fit_erf.py: minimax of the error, the leading
// coefficient held at 2/sqrt(pi) so small x keep their relative accuracy).
// Error 6e-8 in exact arithmetic; in float, with the rounding of its 14
// operations, 3.3e-7 with FMA and 4.1e-7 without (a scratch sweep of every
// 7th float in [1e-7, 6]). One division and ten multiply-adds: half the
// time of the exp-based Abramowitz & Stegun 7.1.26 used before, which made
// GELU 9% of a ViT training step.
//
// Written once for a float and for a GCC vector of floats (the level's Vec,
// for the panels' epilogue, which applies GELU to a tile in registers):
// both forms run the same operations in the same order.
template <class T>
inline T erf_rational(T x) {
  const T c = clamp_to(x, -3.92f, 3.92f);
  const T u = c * c;
  T p = u * 1.976584962e-08f - 1.970695414e-06f;
  p = p * u + 1.461158461e-04f;
  p = p * u + 3.883939181e-03f;
  p = p * u + 5.115656612e-02f;
  p = p * u + 2.042105587e-01f;
  p = p * u + 1.1283791670955126f;  // 2 / sqrt(pi)
  T q = u * 9.997934755e-04f + 1.472606084e-02f;
  q = q * u + 1.167833111e-01f;
  q = q * u + 5.143083323e-01f;
  q = q * u + 1.0f;
  return c * p / q;
}

inline float fast_erf(float x) { return erf_rational(x); }

// GELU(x) = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2, for a float or a vector.
template <class T>
inline T gelu_exact(T x) {
  return 0.5f * x * (1.0f + erf_rational(x * 0.7071067811865476f));
}

// GELU'(x) = Phi(x) + x phi(x) (Phi, phi: the standard normal's CDF and
// density), as 1/2 + x P(x^2) / Q(x^2) on |x| <= 5.8 (GELU'(5.8) = 1 - 1.1e-7),
// fitted like fast_erf (scripts/fit_erf.py --function gelu-grad --p 8 --q 6
// --clamp 5.8). Error 6e-8 in exact arithmetic, 2.6e-7 in float with FMA
// and 3.3e-7 without (every 7th float in [1e-7, 8]). GELU's backward took it as
// 0.5 (1 + erf(x / sqrt 2)) + x e^{-x^2/2} / sqrt(2 pi): an erf and an exp,
// twice this one's time.
inline float fast_gelu_grad(float x) {
  const float c = clamp_to(x, -5.8f, 5.8f);
  const float u = c * c;
  float p = -1.871830620e-11f;
  p = p * u + 3.360213892e-09f;
  p = p * u - 1.562615947e-07f;
  p = p * u + 3.268350275e-05f;
  p = p * u - 1.813628604e-04f;
  p = p * u + 1.460172656e-02f;
  p = p * u - 4.355552587e-02f;
  p = p * u + 0.7978845608028654f;  // 2 / sqrt(2 pi)
  float q = 4.988018225e-06f;
  q = q * u + 1.425678323e-04f;
  q = q * u + 2.846606511e-03f;
  q = q * u + 3.621261534e-02f;
  q = q * u + 2.787453250e-01f;
  q = q * u + 1.0f;
  return 0.5f + c * p / q;
}

}  // namespace qkv::cpu::QKV_CPU_NS
