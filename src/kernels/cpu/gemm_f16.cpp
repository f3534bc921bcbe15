// The float16-weight GEMM (kernels.h, GemmF16Args): C = alpha * A W^T +
// beta * C + bias, W [n, k] IEEE half as raw bits, A float32 as it is (not
// rounded: a half weight meets float32 activations).
//
// Three ways:
//
//   tiles      on the avx2 and avx512 levels, 1 to kMaxTiledRows (64) rows
//              of A (decoding steps, a batch of streams), k >= 16: gemm's
//              register tiles (gemm_tiles.cpp) read W in place, widening it
//              with F16C's VCVTPH2PS as they load it. Each output is the
//              float32 tiles' over W's widened copy, so a row's bits do not
//              depend on the rows beside it, and W is read once, in half the
//              bytes of float32.
//   streamed   elsewhere (the generic level; k < 16) up to 4 rows of A:
//              each row of W read in place, widened in plain code and
//              multiplied into float32 sums.
//   widened    more rows (prefill, batches): W copied to float32 (exact) in
//              panels, and this level's float32 GEMM (float_copies.h).
//
// All sum the same float32 products; they differ only in the order of
// their roundings (the reference twin, ref/gemm.cpp, sums in double).
#include <omp.h>

#include <cstring>

#include "qkv/dtype.h"
#include "src/kernels/cpu/float_copies.h"
#include "src/kernels/cpu/gemm_tiles.h"
#include "src/kernels/cpu/simd.h"
#include "src/kernels/kernels.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace qkv::cpu::QKV_CPU_NS {
namespace {

// Rows of A up to which W is streamed.
constexpr int64_t kMaxGemvRows = 4;

// k halves -> k floats (exact).
inline void widen_row(const uint16_t* h, int64_t k, float* out) {
  int64_t p = 0;
#if defined(__AVX512F__)
  for (; p + 16 <= k; p += 16)
    _mm512_storeu_ps(out + p,  // (the masked form: GCC 12 warns falsely on the plain one's undefined source)
                     _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + p))));
#elif defined(__AVX2__)
  for (; p + 8 <= k; p += 8)
    _mm256_storeu_ps(out + p, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + p))));
#endif
  for (; p < k; ++p) out[p] = half_to_float(h[p]);
}

// Rows j, j + stride, ..., j + (NR-1) stride of W against the M rows of A: a
// dot product per pair, each row of W read once for all M, in plain code (on
// the avx2 and avx512 levels only k < 16 comes here: the tiles take the rest).
template <int M, int NR>
void gemv_rows(const GemmF16Args& g, int64_t j, int64_t stride) {
  const uint16_t* w[NR];
  for (int r = 0; r < NR; ++r) w[r] = g.b + (j + r * stride) * g.ldb;
  float sums[M][NR] = {};
  for (int64_t p = 0; p < g.k; ++p)
    for (int r = 0; r < NR; ++r) {
      const float wp = half_to_float(w[r][p]);
      for (int i = 0; i < M; ++i) sums[i][r] += g.a[i * g.lda + p] * wp;
    }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < M; ++i) finish(g, i, j + r * stride, sums[i][r]);
}

// Rows [j0, j1) of W: in four quarters read side by side (side_by_side), the
// rows left over one at a time.
template <int M>
void gemv_quarters(const GemmF16Args& g, int64_t j0, int64_t j1) {
  side_by_side<4>(
      j0, j1, [&](int64_t j, int64_t q) { gemv_rows<M, 4>(g, j, q); },
      [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) gemv_rows<M, 1>(g, j, 0);
      });
}

void gemv_range(const GemmF16Args& g, int64_t j0, int64_t j1) {
  switch (g.m) {
    case 1: return gemv_quarters<1>(g, j0, j1);
    case 2: return gemv_quarters<2>(g, j0, j1);
    case 3: return gemv_quarters<3>(g, j0, j1);
    default: return gemv_quarters<4>(g, j0, j1);  // at most kMaxGemvRows
  }
}

void gemv(const GemmF16Args& g) {
  if (g.n * g.k < (1 << 16) || omp_get_max_threads() == 1 || omp_in_parallel()) return gemv_range(g, 0, g.n);
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    gemv_range(g, g.n * t / nt, g.n * (t + 1) / nt);
  }
}

void widened(const GemmF16Args& g) {
  GemmArgs f;
  f.m = g.m, f.n = g.n, f.k = g.k, f.alpha = g.alpha, f.beta = g.beta, f.c = g.c, f.ldc = g.ldc, f.bias = g.bias;
  gemm_on_float_copies(
      f, [&](int64_t i, float* out) { std::memcpy(out, g.a + i * g.lda, g.k * sizeof(float)); },
      [&](int64_t j, float* out) { widen_row(g.b + j * g.ldb, g.k, out); });
}

#ifdef QKV_HAVE_TILES
// Up to kMaxTiledRows rows, the register tiles. Above 4 rows the widened
// path copied all of W to float32 and read the copy again on every call:
// `qkv bench streams` with float16 weights took 11.65 ms a step at 8 rows
// where float32 weights took 9.08 (AVX2-only Zen 3, 2026-12-07).
bool tiles_fit(const GemmF16Args& g) { return g.m <= kMaxTiledRows && g.k >= 16; }

void tiled(const GemmF16Args& g) {
  GemmArgs f;
  f.trans_b = true, f.inference = true;
  f.m = g.m, f.n = g.n, f.k = g.k, f.alpha = g.alpha, f.beta = g.beta, f.bias = g.bias;
  f.a = g.a, f.lda = g.lda, f.ldb = g.ldb, f.c = g.c, f.ldc = g.ldc;
  gemm_tiled_f16(f, g.b);
}
#endif

}  // namespace

void gemm_f16(const GemmF16Args& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return scale_only(g);
#ifdef QKV_HAVE_TILES
  if (tiles_fit(g)) return tiled(g);
#endif
  if (g.m <= kMaxGemvRows) return gemv(g);
  widened(g);
}

const char* gemm_f16_path() {
#ifdef QKV_HAVE_TILES
  return "register tiles widening W with F16C for 1 to 64 rows (k >= 16), the float32 GEMM on widened copies above";
#else
  return "plain widening (rows streamed up to 4), the float32 GEMM on widened copies above";
#endif
}

}  // namespace qkv::cpu::QKV_CPU_NS
