// The int8-weight GEMM (kernels.h, GemmInt8Args): C = alpha * A W^T + beta * C
// + bias, W [n, k] as int8 values with one float32 scale per row per block of
// 32 along k, A float32, quantized the same way as it is read.
//
// Two ways:
//
//   integer dot products  up to 4 rows of A (decoding), where the product is
//                         bound by reading W once. Each block's sum of int8
//                         products is exact in int32; it is turned into a
//                         float and multiplied by the product of the block's
//                         two scales. With AVX512-VNNI (Zen 4, Ice Lake and
//                         later) VPDPBUSD adds four u8 x s8 products into each
//                         of 16 int32 lanes: 64 weights, two blocks, per
//                         instruction. It wants one operand unsigned, so A
//                         goes in as |q| and its signs move onto W (W never
//                         holds -128, whose negation would not fit). Without
//                         VNNI, the same sums in plain loops.
//   dequantized           more rows (prefill, batches): A and W turned back
//                         into float32 (q times scale), W in panels, and this
//                         level's float32 gemm multiplies them.
//
// Both compute the quantized A times the quantized W; they differ only in the
// order of their float32 roundings (the reference twin, ref/gemm.cpp, sums in
// double).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/kernels/cpu/float_copies.h"
#include "src/kernels/cpu/scratch.h"
#include "src/kernels/cpu/simd.h"
#include "src/kernels/kernels.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace qkv::cpu::QKV_CPU_NS {
namespace {

constexpr int64_t kBlock = kInt8Block;

// Rows of A up to which the integer path runs.
constexpr int64_t kMaxGemvRows = 4;

// qkv::int8_block_scale and int8_quantize (qkv/dtype.h), written again so
// that they inline here (see gemm_bf16.cpp's widen); the arithmetic is the
// same float32 operations, so every path quantizes A to the same values.
inline float block_scale(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax / 127.0f;
}

inline void quantize(const float* x, int64_t n, float scale, int8_t* q) {
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  for (int64_t i = 0; i < n; ++i) q[i] = (int8_t)std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f);
}

inline void finish(const GemmInt8Args& g, int64_t i, int64_t j, float sum) {
  float& c = g.c[i * g.ldc + j];
  c = (g.beta == 0.0f ? g.alpha * sum : g.alpha * sum + g.beta * c) + (g.bias ? g.bias[j] : 0.0f);
}

int64_t blocks_of(int64_t k) { return (k + kBlock - 1) / kBlock; }

// The rows of A quantized: row i's values at q + i * stride (zeros from k to
// stride) and its block scales at d + i * kb.
struct QuantizedA {
  int64_t stride = 0, kb = 0;
  int8_t* q = nullptr;
  float* d = nullptr;
};

void quantize_a(const GemmInt8Args& g, QuantizedA& qa) {
  for_rows(g.m, g.k, [&](int64_t i) {
    int8_t* q = qa.q + i * qa.stride;
    std::memset(q, 0, qa.stride);
    for (int64_t b = 0; b < qa.kb; ++b) {
      const int64_t p0 = b * kBlock, len = std::min(kBlock, g.k - p0);
      const float* x = g.a + i * g.lda + p0;
      qa.d[i * qa.kb + b] = block_scale(x, len);
      quantize(x, len, qa.d[i * qa.kb + b], q + p0);
    }
  });
}

// Calls body(j0, j1) over [0, n), split between threads when the product is
// large enough to pay for them.
template <class Body>
void split_rows(const GemmInt8Args& g, Body&& body) {
  if (g.n * g.k < (1 << 16) || omp_get_max_threads() == 1 || omp_in_parallel()) return body(0, g.n);
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    body(g.n * t / nt, g.n * (t + 1) / nt);
  }
}

// The integer path in plain loops (what the compiler makes of them at this level).
void integer_rows(const GemmInt8Args& g, const QuantizedA& qa, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const int8_t* w = g.b + j * g.ldb;
    const float* s = g.scales + j * g.ld_scale;
    for (int64_t i = 0; i < g.m; ++i) {
      const int8_t* a = qa.q + i * qa.stride;
      float acc = 0.0f;
      for (int64_t b = 0; b < qa.kb; ++b) {
        const int64_t p0 = b * kBlock, p1 = std::min(p0 + kBlock, g.k);
        int32_t sum = 0;
        for (int64_t p = p0; p < p1; ++p) sum += (int32_t)a[p] * w[p];
        acc += (float)sum * (qa.d[i * qa.kb + b] * s[b]);
      }
      finish(g, i, j, acc);
    }
  }
}

// Runs body(qa) with A quantized into scratch (rows padded to a multiple of 64).
template <class Body>
void with_quantized_a(const GemmInt8Args& g, Body&& body) {
  QuantizedA qa;
  qa.kb = blocks_of(g.k);
  qa.stride = (g.k + 63) / 64 * 64;
  Scratch q((g.m * qa.stride + 3) / 4), d(g.m * qa.kb);
  qa.q = reinterpret_cast<int8_t*>(q.data());
  qa.d = d.data();
  quantize_a(g, qa);
  body(qa);
}

void integer(const GemmInt8Args& g) {
  with_quantized_a(g, [&](const QuantizedA& qa) {
    split_rows(g, [&](int64_t j0, int64_t j1) { integer_rows(g, qa, j0, j1); });
  });
}

// One row of k values back to float32: q times its block's scale.
inline void dequantize_row(const int8_t* q, const float* scales, int64_t k, float* out) {
  for (int64_t p0 = 0; p0 < k; p0 += kBlock) {
    const int64_t p1 = std::min(p0 + kBlock, k);
    const float s = scales[p0 / kBlock];
    for (int64_t p = p0; p < p1; ++p) out[p] = (float)q[p] * s;
  }
}

// A quantized and dequantized, W dequantized; this level's float32 gemm on
// them (float_copies.h).
void dequantized(const GemmInt8Args& g) {
  with_quantized_a(g, [&](const QuantizedA& qa) {
    GemmArgs f;
    f.m = g.m, f.n = g.n, f.k = g.k, f.alpha = g.alpha, f.beta = g.beta, f.c = g.c, f.ldc = g.ldc, f.bias = g.bias;
    gemm_on_float_copies(
        f, [&](int64_t i, float* out) { dequantize_row(qa.q + i * qa.stride, qa.d + i * qa.kb, g.k, out); },
        [&](int64_t j, float* out) { dequantize_row(g.b + j * g.ldb, g.scales + j * g.ld_scale, g.k, out); });
  });
}

// An empty sum (k == 0): C = beta * C + bias.
void scale_only(const GemmInt8Args& g) {
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) finish(g, i, j, 0.0f);
}

#if defined(__AVX512F__)

// --- AVX512-VNNI ---

// Row i of A as VPDPBUSD wants it, in chunks of 64 values (two blocks):
// the magnitudes |q| (unsigned), a mask of the negative ones, and the two
// blocks' scales spread over a vector (lanes 0-7 the first block's, 8-15 the
// second's, the lanes VPDPBUSD sums that block into).
struct VnniRow {
  const uint8_t* magnitude;  // [chunks * 64]
  const uint64_t* negative;  // [chunks]
  const float* scale;        // [chunks * 16]
};

template <int M>
__attribute__((target("avx512vnni"))) void vnni_rows(const GemmInt8Args& g, const VnniRow* rows, int64_t j0,
                                                     int64_t j1) {
  const int64_t kb = blocks_of(g.k), chunks = (g.k + 63) / 64, full = g.k / 64;
  const __mmask64 tail = (__mmask64)(g.k > full * 64 ? (~0ull >> (64 - (g.k - full * 64))) : 0);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t j = j0; j < j1; ++j) {
    const int8_t* w = g.b + j * g.ldb;
    const float* s = g.scales + j * g.ld_scale;
    __m512 acc[M];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512i wv = c < full ? _mm512_loadu_si512(w + c * 64) : _mm512_maskz_loadu_epi8(tail, w + c * 64);
      const float s1 = 2 * c + 1 < kb ? s[2 * c + 1] : 0.0f;
      const __m512 ws = _mm512_insertf32x8(_mm512_set1_ps(s[2 * c]), _mm256_set1_ps(s1), 1);
      for (int i = 0; i < M; ++i) {
        const __m512i signed_w = _mm512_mask_sub_epi8(wv, (__mmask64)rows[i].negative[c], zero, wv);
        const __m512i sum = _mm512_dpbusd_epi32(zero, _mm512_loadu_si512(rows[i].magnitude + c * 64), signed_w);
        // (the masked conversion: GCC 12 warns falsely on the plain one's undefined source)
        const __m512 scale = _mm512_mul_ps(ws, _mm512_loadu_ps(rows[i].scale + c * 16));
        acc[i] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, sum), scale, acc[i]);
      }
    }
    for (int i = 0; i < M; ++i) finish(g, i, j, hsum(acc[i]));
  }
}

void vnni_range(const GemmInt8Args& g, const VnniRow* rows, int64_t j0, int64_t j1) {
  switch (g.m) {
    case 1: return vnni_rows<1>(g, rows, j0, j1);
    case 2: return vnni_rows<2>(g, rows, j0, j1);
    case 3: return vnni_rows<3>(g, rows, j0, j1);
    default: return vnni_rows<4>(g, rows, j0, j1);  // at most kMaxGemvRows
  }
}

void vnni(const GemmInt8Args& g) {
  with_quantized_a(g, [&](const QuantizedA& qa) {
    const int64_t chunks = qa.stride / 64;
    Scratch magnitude((g.m * qa.stride + 3) / 4), negative(g.m * chunks * 2), scale(g.m * chunks * 16);
    VnniRow rows[kMaxGemvRows];
    for (int64_t i = 0; i < g.m; ++i) {
      const int8_t* q = qa.q + i * qa.stride;
      uint8_t* mag = reinterpret_cast<uint8_t*>(magnitude.data()) + i * qa.stride;
      uint64_t* neg = reinterpret_cast<uint64_t*>(negative.data()) + i * chunks;
      float* sc = scale.data() + i * chunks * 16;
      for (int64_t c = 0; c < chunks; ++c) {
        uint64_t bits = 0;
        for (int64_t p = 0; p < 64; ++p) {
          const int8_t v = q[c * 64 + p];
          mag[c * 64 + p] = (uint8_t)(v < 0 ? -v : v);
          bits |= (uint64_t)(v < 0) << p;
        }
        neg[c] = bits;
        for (int64_t l = 0; l < 16; ++l) {
          const int64_t b = 2 * c + l / 8;
          sc[c * 16 + l] = b < qa.kb ? qa.d[i * qa.kb + b] : 0.0f;
        }
      }
      rows[i] = {mag, neg, sc};
    }
    split_rows(g, [&](int64_t j0, int64_t j1) { vnni_range(g, rows, j0, j1); });
  });
}

#endif  // __AVX512F__

}  // namespace

#if defined(__AVX512F__)

bool avx512_vnni_usable() {
  static const bool usable = has_feature("avx512_vnni");
  return usable;
}

void gemm_int8_vnni(const GemmInt8Args& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return scale_only(g);
  if (g.m > kMaxGemvRows) return dequantized(g);
  vnni(g);
}

void gemm_int8_dequantized(const GemmInt8Args& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return scale_only(g);
  dequantized(g);
}

#endif

void gemm_int8(const GemmInt8Args& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return scale_only(g);
  if (g.m > kMaxGemvRows) return dequantized(g);
#if defined(__AVX512F__)
  if (avx512_vnni_usable()) return vnni(g);
#endif
  integer(g);
}

const char* gemm_int8_path() {
#if defined(__AVX512F__)
  if (avx512_vnni_usable()) return "AVX512-VNNI for up to 4 rows, float32 BLAS on dequantized weights above";
#endif
  return "int32 loops for up to 4 rows, float32 BLAS on dequantized weights above";
}

}  // namespace qkv::cpu::QKV_CPU_NS
