// The int8-weight GEMM (kernels.h, GemmInt8Args): C = alpha * A W^T + beta * C
// + bias, W [n, k] as int8 values with one float32 scale per row per block of
// 32 along k, A float32, quantized the same way as it is read.
//
// The ways:
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
//                         holds -128, whose negation would not fit). On the
//                         generic level, the same sums in plain loops.
//   pair sums             up to 64 rows of A with AVX2 and no VNNI (Zen 3,
//                         Haswell to Skylake): the same integer block sums
//                         from VPMADDUBSW's pairs of u8 x s8 products, W read
//                         once in place (below).
//   AMX-INT8 tiles        24 rows and more (prefill) where the CPU has
//                         AMX-INT8 (Sapphire Rapids and later): the same
//                         integer block sums as tile products, scaled by
//                         AVX-512 block by block (below).
//   VNNI tiles            more rows (prefill, batches) with AVX512-VNNI: the
//                         same integer block sums, A offset to unsigned, W
//                         packed in panels, tiles of C in registers (below).
//   dequantized           more rows without VNNI (above 64 with AVX2, above
//                         4 on the generic level): A and W turned back
//                         into float32 (q times scale), W in panels, and this
//                         level's float32 gemm multiplies them.
//
// All compute the quantized A times the quantized W; they differ only in the
// order of their float32 roundings (the reference twin, ref/gemm.cpp, sums in
// double).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/kernels/cpu/float_copies.h"
#include "src/kernels/cpu/gemm_bf16_packed.h"
#include "src/kernels/cpu/scratch.h"
#include "src/kernels/cpu/simd.h"
#include "src/kernels/kernels.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace qkv::cpu::QKV_CPU_NS {
namespace {

constexpr int64_t kBlock = kInt8Block;

// Rows of A up to which the integer path runs (VNNI, plain loops).
[[maybe_unused]] constexpr int64_t kMaxGemvRows = 4;  // (not read on the avx2 level)
// Rows of A up to which the pair sums run (AVX2 without VNNI).
[[maybe_unused]] constexpr int64_t kMaxPairRows = 64;
// Rows of A from which AMX tiles run (a block of them is 32 rows). GFLOP/s
// on the Intel Xeon (family 6 model 167), AMX against the VNNI tiles: 16 x
// 512 x 1408 378 / 442, 24 x 512 x 1536 518 / 492, 32 x 256 x 1024 524 / 393.
[[maybe_unused]] constexpr int64_t kMinAmxRows = 24;  // read by the AVX-512 level alone

// qkv::int8_block_scale and int8_quantize (qkv/dtype.h), written again so
// that they inline here (see gemm_bf16.cpp's widen); the arithmetic is the
// same float32 operations, so every path quantizes A to the same values.
// The levels below AVX-512 call them.
[[maybe_unused]] inline float block_scale(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax / 127.0f;
}

[[maybe_unused]] inline void quantize(const float* x, int64_t n, float scale, int8_t* q) {
  const float inv = scale >= std::numeric_limits<float>::min() ? 1.0f / scale : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(x[i] * inv);
    q[i] = r == r ? (int8_t)std::clamp(r, -127.0f, 127.0f) : 0;
  }
}

int64_t blocks_of(int64_t k) { return (k + kBlock - 1) / kBlock; }

// The rows of A quantized: row i's values at q + i * stride (zeros from k to
// stride) and its block scales at d + i * kb.
struct QuantizedA {
  int64_t stride = 0, kb = 0;
  int8_t* q = nullptr;
  float* d = nullptr;
};

// One block of len <= 32 values: its scale into *d, its values into q.
inline void quantize_block(const float* x, int64_t len, float* d, int8_t* q) {
#if defined(__AVX512F__)
  // The same float32 operations in vectors: max |x| (a NaN skipped, as
  // std::max skips it), / 127, x * (1 / scale) rounded to nearest even,
  // clamped; the same values as the scalar lines below.
  const __mmask16 m0 = (__mmask16)(len >= 16 ? 0xffff : (1u << len) - 1);
  const __mmask16 m1 = (__mmask16)(len >= 32 ? 0xffff : len > 16 ? (1u << (len - 16)) - 1 : 0);
  const __m512 x0 = _mm512_maskz_loadu_ps(m0, x), x1 = _mm512_maskz_loadu_ps(m1, x + 16);
  // max(|x|, 0): a NaN lane gives 0 (AVX-512's max returns its second operand on NaN)
  const __m512 zero = _mm512_setzero_ps();
  const __m512 a0 = _mm512_maskz_max_ps(kAll, _mm512_abs_ps(x0), zero);
  const __m512 a1 = _mm512_maskz_max_ps(kAll, _mm512_abs_ps(x1), zero);
  const float amax = _mm512_cvtss_f32(max_lanes(_mm512_maskz_max_ps(kAll, a0, a1)));
  const float scale = amax / 127.0f, inv = scale >= std::numeric_limits<float>::min() ? 1.0f / scale : 0.0f;
  *d = scale;
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f), vinv = _mm512_set1_ps(inv);
  auto round = [&](__m512 v) {
    __m512 r = _mm512_maskz_roundscale_ps(kAll, _mm512_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);  // a NaN is 0, as in the scalar lines
    const __m512 c = _mm512_maskz_min_ps(kAll, _mm512_maskz_max_ps(kAll, r, lo), hi);
    return _mm512_maskz_cvtepi32_epi8(kAll, _mm512_maskz_cvtps_epi32(kAll, c));
  };
  _mm_mask_storeu_epi8(q, m0, round(x0));
  _mm_mask_storeu_epi8(q + 16, m1, round(x1));
#else
  *d = block_scale(x, len);
  quantize(x, len, *d, q);
#endif
}

void quantize_a(const GemmInt8Args& g, QuantizedA& qa) {
  for_rows(g.m, g.k, [&](int64_t i) {
    int8_t* q = qa.q + i * qa.stride;
    std::memset(q, 0, qa.stride);
    for (int64_t b = 0; b < qa.kb; ++b) {
      const int64_t p0 = b * kBlock;
      quantize_block(g.a + i * g.lda + p0, std::min(kBlock, g.k - p0), qa.d + i * qa.kb + b, q + p0);
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

// The integer path in plain loops (what the compiler makes of them at this
// level): the generic level's.
[[maybe_unused]] void integer_rows(const GemmInt8Args& g, const QuantizedA& qa, int64_t j0, int64_t j1) {
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

// Runs body(qa) with A quantized into scratch (rows padded to a multiple of
// 64 values; with row_multiple > 1, zero rows after the last up to a multiple
// of it, values and scales).
template <class Body>
void with_quantized_a(const GemmInt8Args& g, Body&& body, int64_t row_multiple = 1) {
  QuantizedA qa;
  qa.kb = blocks_of(g.k);
  qa.stride = (g.k + 63) / 64 * 64;
  const int64_t rows = (g.m + row_multiple - 1) / row_multiple * row_multiple;
  Scratch q((rows * qa.stride + 3) / 4), d(rows * qa.kb);
  qa.q = reinterpret_cast<int8_t*>(q.data());
  qa.d = d.data();
  quantize_a(g, qa);
  std::memset(qa.q + g.m * qa.stride, 0, (rows - g.m) * qa.stride);
  std::memset(qa.d + g.m * qa.kb, 0, sizeof(float) * (rows - g.m) * qa.kb);
  body(qa);
}

[[maybe_unused]] void integer(const GemmInt8Args& g) {
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

#if defined(__AVX2__)

// --- AVX2 without VNNI: pair sums (VPMADDUBSW) ---
//
// One block of 32 k is one 256-bit vector of each side. VPSIGNB makes |a|
// and w with a's sign (0 where a is 0); VPMADDUBSW multiplies them into 16
// int16 sums of two products, at most 2 x 127 x 127 = 32,258, so nothing
// saturates (neither side holds -128); VPMADDWD by ones adds pairs of those
// into 8 int32 lanes, exactly. Those lanes become float32 (exact: far below
// 2^24) and go into 8 float32 accumulators times the product of the block's
// two scales. An output's sum is its blocks in order, in one accumulator,
// its lanes added at the end: the same whatever the rows beside it.

// W's last block at w, len < 32 values: the row's last values with zeros
// after (never read past the row).
inline __m256i w_last_block(const int8_t* w, int64_t len) {
  alignas(32) int8_t lanes[kBlock] = {};
  std::memcpy(lanes, w, len);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
}

// Rows [i0, i0 + MR) of A against rows j, j + stride, ..., j + (NR-1)
// stride of W. A's rows are zero past k (with_quantized_a), so a last
// partial block reads them whole; W's is copied (w_last_block), after the loop
// over the whole blocks.
template <int MR, int NR>
void pairs_tile(const GemmInt8Args& g, const QuantizedA& qa, int64_t i0, int64_t j, int64_t stride) {
  const int8_t* w[NR];
  const float* s[NR];
  for (int r = 0; r < NR; ++r) w[r] = g.b + (j + r * stride) * g.ldb, s[r] = g.scales + (j + r * stride) * g.ld_scale;
  const int8_t* a[MR];
  const float* d[MR];
  for (int i = 0; i < MR; ++i) a[i] = qa.q + (i0 + i) * qa.stride, d[i] = qa.d + (i0 + i) * qa.kb;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NR];
  for (auto& row : acc)
    for (auto& v : row) v = _mm256_setzero_ps();
  // Block b of every pair, wv(r) giving W's vector, each loaded as it is
  // used. (With all NR loaded first, or as here, GCC keeps the accumulators
  // in registers but also stores some of them on every block; the two ran
  // at the same speed within the noise.)
  auto block = [&](int64_t b, auto&& wv) __attribute__((always_inline)) {
    __m256i av[MR], magnitude[MR];
    __m256 da[MR];
    for (int i = 0; i < MR; ++i) {
      av[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i] + b * kBlock));
      magnitude[i] = _mm256_sign_epi8(av[i], av[i]);
      da[i] = _mm256_broadcast_ss(d[i] + b);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m256i w_r = wv(r);
      const __m256 ws = _mm256_broadcast_ss(s[r] + b);
#pragma GCC unroll 2
      for (int i = 0; i < MR; ++i) {
        const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude[i], _mm256_sign_epi8(w_r, av[i])), ones);
        acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(da[i], ws), acc[i][r]);
      }
    }
  };
  const int64_t whole = g.k / kBlock;
  for (int64_t b = 0; b < whole; ++b)
    block(b, [&](int r) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + b * kBlock)); });
  if (whole < qa.kb) {
    const int64_t p0 = whole * kBlock;
    block(whole, [&](int r) { return w_last_block(w[r] + p0, g.k - p0); });
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) finish(g, i0 + i, j + r * stride, hsum(acc[i][r]));
}

// All of A's rows against rows j, j + stride, ... (NR) of W: two rows of A
// a tile (its 8 accumulators and A's vectors take most of the 16
// registers), the NR rows of W staying in L1 from one tile to the next.
template <int NR>
void pairs_rows(const GemmInt8Args& g, const QuantizedA& qa, int64_t j, int64_t stride) {
  int64_t i = 0;
  for (; i + 2 <= g.m; i += 2) pairs_tile<2, NR>(g, qa, i, j, stride);
  if (i < g.m) pairs_tile<1, NR>(g, qa, i, j, stride);
}

// Rows [j0, j1) of W: in four quarters read side by side (four streams from
// memory at once), the rows left over one at a time.
void pairs_range(const GemmInt8Args& g, const QuantizedA& qa, int64_t j0, int64_t j1) {
  side_by_side<4>(
      j0, j1, [&](int64_t j, int64_t q) { pairs_rows<4>(g, qa, j, q); },
      [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) pairs_rows<1>(g, qa, j, 0);
      });
}

void pairs(const GemmInt8Args& g) {
  with_quantized_a(
      g, [&](const QuantizedA& qa) { split_rows(g, [&](int64_t j0, int64_t j1) { pairs_range(g, qa, j0, j1); }); });
}

// Without VNNI: the pair sums up to kMaxPairRows rows, dequantized above.
void without_vnni(const GemmInt8Args& g) {
  if (g.m > kMaxPairRows) return dequantized(g);
  pairs(g);
}

#endif  // __AVX2__

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

// Rows j, j + stride, ..., j + (NR-1) stride of W against the M rows of A,
// each row of W read once; an output's sum is over its chunks in order, one
// accumulator, whatever NR.
template <int M, int NR>
__attribute__((target("avx512vnni"))) void vnni_rows(const GemmInt8Args& g, const VnniRow* rows, int64_t j,
                                                     int64_t stride) {
  const int64_t kb = blocks_of(g.k), chunks = (g.k + 63) / 64, full = g.k / 64;
  const __mmask64 tail = (__mmask64)(g.k > full * 64 ? (~0ull >> (64 - (g.k - full * 64))) : 0);
  const __m512i zero = _mm512_setzero_si512();
  const int8_t* w[NR];
  const float* s[NR];
  for (int r = 0; r < NR; ++r) w[r] = g.b + (j + r * stride) * g.ldb, s[r] = g.scales + (j + r * stride) * g.ld_scale;
  __m512 acc[M][NR];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    for (int r = 0; r < NR; ++r) {
      const __m512i wv = c < full ? _mm512_loadu_si512(w[r] + c * 64) : _mm512_maskz_loadu_epi8(tail, w[r] + c * 64);
      const float s1 = 2 * c + 1 < kb ? s[r][2 * c + 1] : 0.0f;
      const __m512 ws = _mm512_insertf32x8(_mm512_set1_ps(s[r][2 * c]), _mm256_set1_ps(s1), 1);
      for (int i = 0; i < M; ++i) {
        const __m512i signed_w = _mm512_mask_sub_epi8(wv, (__mmask64)rows[i].negative[c], zero, wv);
        const __m512i sum = _mm512_dpbusd_epi32(zero, _mm512_loadu_si512(rows[i].magnitude + c * 64), signed_w);
        // (the masked conversion: GCC 12 warns falsely on the plain one's undefined source)
        const __m512 scale = _mm512_mul_ps(ws, _mm512_loadu_ps(rows[i].scale + c * 16));
        acc[i][r] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, sum), scale, acc[i][r]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < M; ++i) finish(g, i, j + r * stride, hsum(acc[i][r]));
}

// Rows [j0, j1) of W: in four quarters read side by side (side_by_side:
// four streams from memory at once, and four independent sums per row of
// A), the rows left over one at a time. One row of the 100M Llama in int8
// stepped 1.4-1.6x faster than with one row of W at a time
// (docs/low-precision.md).
template <int M>
void vnni_quarters(const GemmInt8Args& g, const VnniRow* rows, int64_t j0, int64_t j1) {
  side_by_side<4>(
      j0, j1, [&](int64_t j, int64_t q) { vnni_rows<M, 4>(g, rows, j, q); },
      [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) vnni_rows<M, 1>(g, rows, j, 0);
      });
}

void vnni_range(const GemmInt8Args& g, const VnniRow* rows, int64_t j0, int64_t j1) {
  switch (g.m) {
    case 1: return vnni_quarters<1>(g, rows, j0, j1);
    case 2: return vnni_quarters<2>(g, rows, j0, j1);
    case 3: return vnni_quarters<3>(g, rows, j0, j1);
    default: return vnni_quarters<4>(g, rows, j0, j1);  // at most kMaxGemvRows
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

// --- AVX512-VNNI, more rows (prefill): a register-blocked GEMM ---
//
// With many rows of A, A's signs can no longer move onto W (each row has its
// own), so A goes in offset instead: u = q + 128, in [1, 255], and
//   sum_p q_p w_p = sum_p u_p w_p - 128 sum_p w_p,
// the second sum a constant of W's block (its "compensation", as oneDNN
// calls it), which starts each block's int32 sum. W is packed per thread in
// panels of 32 columns; a tile of up to 4 rows by those 32 columns keeps 8
// int32 sums (one block's) and 8 float32 ones (all blocks') in registers.

constexpr int64_t kPanel = 32;  // columns of W per panel: two vectors of 16

// A panel of W as VPDPBUSD reads it, for block b of 32 k: 8 groups of 4
// consecutive k, each as two vectors (columns 0-15, 16-31) whose lane l holds
// that column's 4 values; then per block the 32 columns' compensation
// (-128 times the block's sum of w) and scales. Columns past n are zeros.
struct WPanel {
  int8_t* w = nullptr;        // [kb][8][2][64]
  int32_t* comp = nullptr;    // [kb][32]
  float* scale = nullptr;     // [kb][32]
  static int64_t floats(int64_t kb) { return kb * (8 * 2 * 64 / 4 + 32 + 32); }
  WPanel(float* at, int64_t kb)
      : w(reinterpret_cast<int8_t*>(at)), comp(reinterpret_cast<int32_t*>(at + kb * 256)),
        scale(at + kb * 256 + kb * 32) {}
};

// Packs columns [j0, j0 + 32) of W. Each column's block is 8 words of 4
// values; the word for group t of column c goes to lane c % 16 of vector
// c / 16 of group t.
// Block b of the panel, one column at a time (any panel, any block).
void pack_block(const GemmInt8Args& g, int64_t j0, int64_t b, const WPanel& p) {
  const int64_t p0 = b * kBlock, len = std::min(kBlock, g.k - p0);
  uint32_t* words = reinterpret_cast<uint32_t*>(p.w + b * 1024);  // [8 groups][32 columns]
  for (int64_t c = 0; c < kPanel; ++c) {
    const int64_t j = j0 + c;
    alignas(4) int8_t v[kBlock] = {};
    if (j < g.n) std::memcpy(v, g.b + j * g.ldb + p0, len);
    int32_t sum = 0;
    for (int64_t t = 0; t < kBlock; ++t) sum += v[t];
    for (int64_t t = 0; t < 8; ++t) std::memcpy(words + t * kPanel + c, v + 4 * t, 4);
    p.comp[b * kPanel + c] = -128 * sum;
    p.scale[b * kPanel + c] = j < g.n ? g.scales[j * g.ld_scale + b] : 0.0f;
  }
}

// Block b of a panel of 32 whole columns, a whole block of k: each group of
// 4 k of 16 columns is one gather (a word from each column's row), its
// bytes summed into the compensation by VPDPBUSD against ones. The same
// words and sums as pack_block; it was 72% of a 16-row product and 38% of a
// 128-row one on AMX.
__attribute__((target("avx512vnni"))) void pack_whole_block(const GemmInt8Args& g, int64_t j0, int64_t b,
                                                            const WPanel& p) {
  const __m512i offsets = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32((int32_t)g.ldb));
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t h = 0; h < 2; ++h) {
    const int8_t* column = g.b + (j0 + 16 * h) * g.ldb + b * kBlock;
    __m512i sum = _mm512_setzero_si512();
    for (int64_t t = 0; t < 8; ++t) {
      const __m512i w = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), kAll, offsets, column + 4 * t, 1);
      _mm512_storeu_si512(p.w + b * 1024 + t * 128 + h * 64, w);
      sum = _mm512_dpbusd_epi32(sum, ones, w);
    }
    _mm512_storeu_si512(p.comp + b * kPanel + 16 * h, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-128)));
  }
  for (int64_t c = 0; c < kPanel; ++c) p.scale[b * kPanel + c] = g.scales[(j0 + c) * g.ld_scale + b];
}

// Packs columns [j0, j0 + 32) of W.
void pack_panel(const GemmInt8Args& g, int64_t j0, const WPanel& p) {
  const int64_t kb = blocks_of(g.k);
  // Gathers where the panel is whole and its offsets fit 32 bits (VNNI: every caller's CPU has it).
  const bool whole = j0 + kPanel <= g.n && 16 * g.ldb < (int64_t{1} << 31);
  for (int64_t b = 0; b < kb; ++b) {
    if (whole && (b + 1) * kBlock <= g.k)
      pack_whole_block(g, j0, b, p);
    else
      pack_block(g, j0, b, p);
  }
}

// Rows [i0, i0 + R) of C at columns j0..j0 + 32 from the panel; `u` holds A
// offset by 128 (row stride `stride`), `da` A's block scales ([m][kb]).
template <int R>
__attribute__((target("avx512vnni"))) void vnni_tile(const GemmInt8Args& g, const uint8_t* u, int64_t stride,
                                                     const float* da, int64_t i0, const WPanel& p, int64_t j0) {
  const int64_t kb = blocks_of(g.k);
  __m512 acc[R][2];
  for (auto& r : acc) r[0] = r[1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const __m512i c0 = _mm512_loadu_si512(p.comp + b * kPanel), c1 = _mm512_loadu_si512(p.comp + b * kPanel + 16);
    __m512i sum[R][2];
    for (auto& r : sum) r[0] = c0, r[1] = c1;
    const int8_t* w = p.w + b * 1024;
#pragma GCC unroll 8
    for (int64_t t = 0; t < 8; ++t) {
      const __m512i w0 = _mm512_loadu_si512(w + t * 128), w1 = _mm512_loadu_si512(w + t * 128 + 64);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, u + (i0 + r) * stride + b * kBlock + 4 * t, 4);
        const __m512i x = _mm512_set1_epi32(four);
        sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], x, w0);
        sum[r][1] = _mm512_dpbusd_epi32(sum[r][1], x, w1);
      }
    }
    const __m512 s0 = _mm512_loadu_ps(p.scale + b * kPanel), s1 = _mm512_loadu_ps(p.scale + b * kPanel + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_set1_ps(da[(i0 + r) * kb + b]);
      // (the masked conversion: GCC 12 warns falsely on the plain one's undefined source)
      acc[r][0] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, sum[r][0]), _mm512_mul_ps(s0, d), acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, sum[r][1]), _mm512_mul_ps(s1, d), acc[r][1]);
    }
  }
  const __m512 alpha = _mm512_set1_ps(g.alpha), beta = _mm512_set1_ps(g.beta);
  for (int half = 0; half < 2; ++half) {
    const int64_t j = j0 + 16 * half;
    if (j >= g.n) break;
    const __mmask16 cols = (__mmask16)((1u << std::min<int64_t>(16, g.n - j)) - 1);
    const __m512 bias = g.bias ? _mm512_maskz_loadu_ps(cols, g.bias + j) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      float* c = g.c + (i0 + r) * g.ldc + j;
      __m512 v = _mm512_mul_ps(alpha, acc[r][half]);
      if (g.beta != 0.0f) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(cols, c), v);
      _mm512_mask_storeu_ps(c, cols, _mm512_add_ps(v, bias));
    }
  }
}

void vnni_packed(const GemmInt8Args& g) {
  with_quantized_a(g, [&](const QuantizedA& qa) {
    Scratch offset((g.m * qa.stride + 3) / 4);  // A + 128, as unsigned bytes (zeros past k stay 128 x 0 = 0)
    uint8_t* u = reinterpret_cast<uint8_t*>(offset.data());
    for_rows(g.m, qa.stride, [&](int64_t i) {
      for (int64_t p = 0; p < qa.stride; ++p) u[i * qa.stride + p] = (uint8_t)(qa.q[i * qa.stride + p] + 128);
    });
    const int64_t panels = (g.n + kPanel - 1) / kPanel, per_panel = WPanel::floats(qa.kb);
    const bool threads = !omp_in_parallel() && panels > 1 && g.m * g.n * g.k >= (1 << 18);
    const int64_t nt = threads ? omp_get_max_threads() : 1;
    Scratch buffers(nt * per_panel);
#pragma omp parallel num_threads(nt) if (threads)
    {
      const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
      const WPanel panel(buffers.data() + t * per_panel, qa.kb);
      for (int64_t pi = panels * t / team; pi < panels * (t + 1) / team; ++pi) {
        pack_panel(g, pi * kPanel, panel);
        int64_t i = 0;
        for (; i + 4 <= g.m; i += 4) vnni_tile<4>(g, u, qa.stride, qa.d, i, panel, pi * kPanel);
        switch (g.m - i) {
          case 3: vnni_tile<3>(g, u, qa.stride, qa.d, i, panel, pi * kPanel); break;
          case 2: vnni_tile<2>(g, u, qa.stride, qa.d, i, panel, pi * kPanel); break;
          case 1: vnni_tile<1>(g, u, qa.stride, qa.d, i, panel, pi * kPanel); break;
          default: break;
        }
      }
    }
  });
}

// --- AMX-INT8, more rows (prefill) ---
//
// TDPBSSD adds into each int32 of a 16 x 16 tile the dot products of a row
// of an A tile (signed bytes) with a column of a B tile (signed bytes, 4
// consecutive k in each 32-bit word): here one block of 32 k per product, A
// as quantized (row stride as it lies, no packing) and B the VNNI panel
// above (8 rows of 64 bytes per half, row stride 128), so A needs no offset
// and W no compensation. Each block's sums must be scaled by their two
// scales before the next block adds in, so a 32 x 32 block of C takes four
// products per block of k, stores the four int32 tiles, and AVX-512 adds
// them, converted and scaled, into float32 sums kept in L1.
//
// That scaling, not the tiles, sets the pace: one tile store and three
// vector operations per 16 sums per block of 32 k. On the Intel Xeon (family
// 6 model 167, 2 threads) 2048 x 256 x 768 ran at 1,000-1,270 GFLOP/s with
// the scaling left out and 710-780 with it, against 550-600 for the VNNI
// tiles and 1,800-1,900 for the bfloat16 AMX product (which scales nothing).
// Multiplying bfloat16 copies of A and the dequantized W instead would run
// at about the bfloat16 rate, but it would no longer compute the quantized A
// that every other path computes.

// Rows [i0, i0 + 32) of C (those below m) at columns [j0, j0 + 32) from
// the packed panel. The four products of block b + 1 are issued before the
// scaling of block b's stored sums, so the tile unit multiplies while the
// vector unit scales (their sums in two buffers, taken in turn).
__attribute__((target("amx-tile,amx-int8,avx512f"))) void amx_block(const GemmInt8Args& g, const QuantizedA& qa,
                                                                    int64_t i0, const WPanel& p, int64_t j0) {
  alignas(64) int32_t sums[2][4][256];
  alignas(64) float acc[32][32] = {};
  const int64_t kb = qa.kb;
  const int8_t* a0 = qa.q + i0 * qa.stride;
  const int8_t* a1 = a0 + 16 * qa.stride;
  auto multiply = [&](int64_t b) __attribute__((target("amx-tile,amx-int8"))) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a0 + b * kBlock, qa.stride);
    _tile_loadd(6, p.w + b * 1024, 128);
    _tile_dpbssd(0, 4, 6);
    _tile_loadd(7, p.w + b * 1024 + 64, 128);
    _tile_dpbssd(1, 4, 7);
    _tile_loadd(5, a1 + b * kBlock, qa.stride);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  };
  auto store = [&](int32_t(*to)[256]) __attribute__((target("amx-tile,amx-int8"))) {
    _tile_stored(0, to[0], 64);
    _tile_stored(1, to[1], 64);
    _tile_stored(2, to[2], 64);
    _tile_stored(3, to[3], 64);
  };
  auto scale_in = [&](int64_t b, const int32_t(*from)[256]) __attribute__((target("avx512f"))) {
    const __m512 s0 = _mm512_loadu_ps(p.scale + b * kPanel), s1 = _mm512_loadu_ps(p.scale + b * kPanel + 16);
    for (int r = 0; r < 32; ++r) {
      const __m512 d = _mm512_set1_ps(qa.d[(i0 + r) * kb + b]);
      const int32_t* row = from[2 * (r / 16)] + (r % 16) * 16;
      // (the masked conversion: GCC 12 warns falsely on the plain one's undefined source)
      const __m512 x0 = _mm512_maskz_cvtepi32_ps(0xffff, _mm512_load_si512(row));
      const __m512 x1 = _mm512_maskz_cvtepi32_ps(0xffff, _mm512_load_si512(row + 256));
      _mm512_store_ps(acc[r], _mm512_fmadd_ps(x0, _mm512_mul_ps(s0, d), _mm512_load_ps(acc[r])));
      _mm512_store_ps(acc[r] + 16, _mm512_fmadd_ps(x1, _mm512_mul_ps(s1, d), _mm512_load_ps(acc[r] + 16)));
    }
  };
  multiply(0);
  store(sums[0]);
  for (int64_t b = 0; b < kb; ++b) {
    if (b + 1 < kb) multiply(b + 1);
    scale_in(b, sums[b & 1]);
    if (b + 1 < kb) store(sums[(b + 1) & 1]);
  }
  const int64_t rows = std::min<int64_t>(32, g.m - i0), cols = std::min<int64_t>(32, g.n - j0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) finish(g, i0 + r, j0 + c, acc[r][c]);
}

// Panels of W a thread packs before multiplying: about 256 KB of them, in
// L2 while every 32-row block of A passes them, so each block's rows of C
// are written across the group's columns at once.
constexpr int64_t kGroupBytes = 256 << 10;

// Panels [p0, p1) of W times all of A, on this thread.
__attribute__((target("amx-tile,amx-int8"))) void amx_panels(const GemmInt8Args& g, const QuantizedA& qa, float* buffer,
                                                             int64_t group, int64_t p0, int64_t p1) {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;  // C: 16 x 16 int32
  for (int t = 4; t < 6; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 32;  // A: 16 rows of 32 k
  for (int t = 6; t < 8; ++t) cfg.rows[t] = 8, cfg.colsb[t] = 64;   // B: 8 groups of 4 k by 16 columns
  load_tile_config(cfg);
  const int64_t per_panel = WPanel::floats(qa.kb);
  for (int64_t g0 = p0; g0 < p1; g0 += group) {
    const int64_t g1 = std::min(p1, g0 + group);
    for (int64_t pi = g0; pi < g1; ++pi) pack_panel(g, pi * kPanel, WPanel(buffer + (pi - g0) * per_panel, qa.kb));
    for (int64_t i = 0; i < g.m; i += 32)
      for (int64_t pi = g0; pi < g1; ++pi)
        amx_block(g, qa, i, WPanel(buffer + (pi - g0) * per_panel, qa.kb), pi * kPanel);
  }
  _tile_release();
}

void amx_packed(const GemmInt8Args& g) {
  with_quantized_a(
      g,
      [&](const QuantizedA& qa) {
        const int64_t panels = (g.n + kPanel - 1) / kPanel, per_panel = WPanel::floats(qa.kb);
        const bool threads = !omp_in_parallel() && panels > 1 && g.m * g.n * g.k >= (1 << 18);
        const int64_t nt = threads ? omp_get_max_threads() : 1;
        const int64_t group = std::clamp<int64_t>(kGroupBytes / (4 * per_panel), 1, (panels + nt - 1) / nt);
        Scratch buffers(nt * group * per_panel);
#pragma omp parallel num_threads(nt) if (threads)
        {
          const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
          amx_panels(g, qa, buffers.data() + t * group * per_panel, group, panels * t / team, panels * (t + 1) / team);
        }
      },
      32);
}

#endif  // __AVX512F__

}  // namespace

#if defined(__AVX512F__)

bool avx512_vnni_usable() {
  static const bool usable = has_feature("avx512_vnni");
  return usable;
}
bool amx_int8_usable() {
  static const bool usable = has_feature("amx_int8") && amx_tile_state_granted() && avx512_vnni_usable();
  return usable;
}

void gemm_int8_amx(const GemmInt8Args& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return scale_only(g);
  if (g.m >= kMinAmxRows) return amx_packed(g);
  if (g.m > kMaxGemvRows) return vnni_packed(g);
  vnni(g);
}

void gemm_int8_vnni(const GemmInt8Args& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return scale_only(g);
  if (g.m > kMaxGemvRows) return vnni_packed(g);
  vnni(g);
}

void gemm_int8_dequantized(const GemmInt8Args& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return scale_only(g);
  dequantized(g);
}

void gemm_int8_pairs(const GemmInt8Args& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return scale_only(g);
  without_vnni(g);
}

#endif

void gemm_int8(const GemmInt8Args& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return scale_only(g);
#if defined(__AVX512F__)
  if (amx_int8_usable()) return gemm_int8_amx(g);
  if (avx512_vnni_usable()) return gemm_int8_vnni(g);
#endif
#if defined(__AVX2__)
  return without_vnni(g);
#else
  if (g.m > kMaxGemvRows) return dequantized(g);
  integer(g);
#endif
}

const char* gemm_int8_path() {
#if defined(__AVX512F__)
  if (amx_int8_usable()) return "AMX-INT8 tiles from 24 rows (AVX512-VNNI below)";
  if (avx512_vnni_usable()) return "AVX512-VNNI (rows streamed up to 4, register-blocked tiles above)";
#endif
#if defined(__AVX2__)
  return "AVX2 pair sums (VPMADDUBSW) for up to 64 rows, the float32 GEMM on dequantized weights above";
#else
  return "int32 loops for up to 4 rows, the float32 GEMM on dequantized weights above";
#endif
}

}  // namespace qkv::cpu::QKV_CPU_NS
