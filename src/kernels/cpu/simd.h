// Internal to the CPU kernel variants: small helpers over the vector
// registers of the level being compiled (AVX-512, and AVX2 where a kernel
// has an AVX2 loop), and the order in which decoding's products read W. In
// the variant's namespace, like vec_math.h.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifndef QKV_CPU_NS
#error "simd.h belongs to a kernel variant: define QKV_CPU_NS (CMake does for src/kernels/cpu)"
#endif

namespace qkv::cpu::QKV_CPU_NS {

// [j0, j1) of a decoding product's rows of W (or blocks of them) in Parts
// equal parts read side by side: part(j, q) takes j, j + q, ..., j + (Parts -
// 1) q for each j of the first part, then rest(begin, end) the few left
// over. A core then has Parts streams from memory in flight where one
// sequential sweep gives it one: one 2-thread read of 400 MB ran at 25 GB/s
// on the Intel Xeon (family 6 model 167), four to eight streams a thread at
// 29-31, and decoding one row 1.1-1.6x faster (docs/low-precision.md).
template <int Parts, class Part, class Rest>
inline void side_by_side(int64_t j0, int64_t j1, Part&& part, Rest&& rest) {
  const int64_t q = (j1 - j0) / Parts;
  for (int64_t j = j0; j < j0 + q; ++j) part(j, q);
  if (j0 + Parts * q < j1) rest(j0 + Parts * q, j1);
}

#if defined(__AVX512F__)
// All 16 lanes, for the maskz forms of intrinsics: their plain forms make
// GCC 12 warn of an undefined source.
constexpr __mmask16 kAll = 0xffff;

// 16 floats rounded to bfloat16 as vec_math.h's round_to_bf16 rounds them
// (to nearest, ties to even; a NaN made quiet), bit for bit, in AVX-512F
// integer operations. (VCVTNEPS2BF16 would read denormals as zero, and
// needs AVX512-BF16.)
inline __m256i bf16_of(__m512 v) {
  const __m512i u = _mm512_castps_si512(v), one = _mm512_set1_epi32(1);
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, u, 16), one);
  const __m512i up = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i r = _mm512_mask_or_epi32(_mm512_add_epi32(u, up), nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_maskz_cvtepi32_epi16(kAll, _mm512_maskz_srli_epi32(kAll, r, 16));
}

// The largest of 16 lanes, in every lane.
inline __m512 max_lanes(__m512 v) {
  v = _mm512_maskz_max_ps(kAll, v, _mm512_maskz_shuffle_f32x4(kAll, v, v, 0x4e));  // 256-bit halves
  v = _mm512_maskz_max_ps(kAll, v, _mm512_maskz_shuffle_f32x4(kAll, v, v, 0xb1));  // 128-bit quarters
  v = _mm512_maskz_max_ps(kAll, v, _mm512_maskz_permute_ps(kAll, v, 0x4e));        // pairs
  return _mm512_maskz_max_ps(kAll, v, _mm512_maskz_permute_ps(kAll, v, 0xb1));
}

// The first min(16, max(n, 0)) lanes.
inline __mmask16 lanes_of(int64_t n) { return (__mmask16)((1u << std::clamp<int64_t>(n, 0, 16)) - 1); }

// One vector whose lane i is the sum of r[i]'s 16 lanes: within each
// 128-bit lane the vectors are paired up and added (unpacks, four vectors
// to one), then the four 128-bit lanes of each sum are added across
// (45 shuffles and adds for the 16 sums, where one sum at a time takes 4
// shuffles and 4 adds in a chain).
inline __m512 lane_sums16(const __m512* r) {  // (the maskz forms: GCC 12 warns on the plain ones)
  __m512 q[4];  // q[g], per 128-bit lane L: [lane L's part of r[4g], r[4g + 1], r[4g + 2], r[4g + 3]]
  for (int g = 0; g < 4; ++g) {
    const __m512* x = r + 4 * g;
    const __m512d ab = _mm512_castps_pd(
        _mm512_add_ps(_mm512_maskz_unpacklo_ps(kAll, x[0], x[1]), _mm512_maskz_unpackhi_ps(kAll, x[0], x[1])));
    const __m512d cd = _mm512_castps_pd(
        _mm512_add_ps(_mm512_maskz_unpacklo_ps(kAll, x[2], x[3]), _mm512_maskz_unpackhi_ps(kAll, x[2], x[3])));
    q[g] = _mm512_add_ps(_mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xff, ab, cd)),
                         _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xff, ab, cd)));
  }
  const auto halves = [](__m512 a, __m512 b) {  // [a0 + a1, a2 + a3, b0 + b1, b2 + b3] of 128-bit lanes
    return _mm512_add_ps(_mm512_maskz_shuffle_f32x4(kAll, a, b, 0x88), _mm512_maskz_shuffle_f32x4(kAll, a, b, 0xdd));
  };
  return halves(halves(q[0], q[1]), halves(q[2], q[3]));
}

// r[i] <- column i of the 16 x 16 block whose rows were r[0..15].
inline void transpose16(__m512* r) {  // (the maskz forms: GCC 12 warns on the plain ones)
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_ps(kAll, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_ps(kAll, r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
    u[i] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xff, t0, t2));
    u[i + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xff, t0, t2));
    u[i + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xff, t1, t3));
    u[i + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xff, t1, t3));
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_maskz_shuffle_f32x4(kAll, u[h + i], u[h + 4 + i], 0x88);
      t[h + 4 + i] = _mm512_maskz_shuffle_f32x4(kAll, u[h + i], u[h + 4 + i], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_maskz_shuffle_f32x4(kAll, t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_maskz_shuffle_f32x4(kAll, t[i], t[8 + i], 0xdd);
  }
}

// The transpose of a block of at most 16 x 16 floats: `rows` rows of
// `depth` floats at b (row stride ldb; rows past them read as zeros) become
// `depth` rows of 16 floats at out (row stride ldo), in registers. Always
// inlined: called out of line, the flash kernel's backward ran 4% slower.
[[gnu::always_inline]] inline void transpose_block16(const float* b, int64_t ldb, int64_t rows, int64_t depth,
                                                     float* out, int64_t ldo) {
  const __mmask16 steps = lanes_of(depth);
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(steps, b + i * ldb) : _mm512_setzero_ps();
  transpose16(r);
  for (int64_t i = 0; i < std::min<int64_t>(16, depth); ++i) _mm512_storeu_ps(out + i * ldo, r[i]);
}

// The sum of the 16 lanes, through memory: GCC 12 warns on the lane-extract
// intrinsics that a reduction would use.
inline float hsum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0.0f;
  for (float x : t) s += x;
  return s;
}
#endif

// The float vector of the level, for kernels written once for both: 16
// lanes on avx512, 8 on avx2 (with FMA). vload_first / vstore_first read and
// write the first n <= kLanes floats at p (zeros after, on the read).
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset(float x) { return _mm512_set1_ps(x); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vload_first(const float* p, int64_t n) {
  return n == kLanes ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(lanes_of(n), p);
}
inline void vstore_first(float* p, Vec v, int64_t n) {
  if (n == kLanes)
    _mm512_storeu_ps(p, v);
  else
    _mm512_mask_storeu_ps(p, lanes_of(n), v);
}
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset(float x) { return _mm256_set1_ps(x); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline __m256i lanes_of(int64_t n) {  // the first n lanes, as maskload's mask
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline Vec vload_first(const float* p, int64_t n) {
  return n == kLanes ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_of(n));
}
inline void vstore_first(float* p, Vec v, int64_t n) {
  if (n == kLanes)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, lanes_of(n), v);
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)  // (this level's Vec is __m256)
// r[i] <- column i of the 8 x 8 block whose rows were r[0..7]: pairs of rows
// interleaved, then pairs of pairs, then the 128-bit halves swapped across.
inline void transpose8(__m256* r) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// transpose_block16's twin for 8 x 8: `rows` rows of `depth` floats at b
// (rows past them read as zeros) become min(8, depth) rows of 8 at out.
[[gnu::always_inline]] inline void transpose_block8(const float* b, int64_t ldb, int64_t rows, int64_t depth,
                                                    float* out, int64_t ldo) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = i < rows ? vload_first(b + i * ldb, std::min<int64_t>(depth, 8)) : vzero();
  transpose8(r);
  for (int64_t i = 0; i < std::min<int64_t>(8, depth); ++i) _mm256_storeu_ps(out + i * ldo, r[i]);
}
#endif

#if defined(__AVX2__)
inline float hsum(__m256 v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  float s = 0.0f;
  for (float x : t) s += x;
  return s;
}
#endif

// x . w over k floats: four independent accumulators of full vector width, so
// loads, not one chain of dependent adds, set the pace (the decoding GEMV's
// rows of W, flash attention's D = dO . O). One row of W is one
// sequential stream, which the hardware prefetcher follows at full bandwidth
// (measured: interleaving four rows of W ran at 70-80% of it).
inline float dot(const float* x, const float* w, int64_t k) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))  // (this level's Vec)
  Vec a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
  for (; i + 4 * kLanes <= k; i += 4 * kLanes) {
    a0 = vfma(vload(x + i), vload(w + i), a0);
    a1 = vfma(vload(x + i + kLanes), vload(w + i + kLanes), a1);
    a2 = vfma(vload(x + i + 2 * kLanes), vload(w + i + 2 * kLanes), a2);
    a3 = vfma(vload(x + i + 3 * kLanes), vload(w + i + 3 * kLanes), a3);
  }
  for (; i + kLanes <= k; i += kLanes) a0 = vfma(vload(x + i), vload(w + i), a0);
  s = hsum(vadd(vadd(a0, a1), vadd(a2, a3)));
#endif  // (on the generic level: the loop below alone)
  for (; i < k; ++i) s += x[i] * w[i];
  return s;
}

}  // namespace qkv::cpu::QKV_CPU_NS
