// Fast GEMM: the single place qkv calls BLAS (OpenBLAS, OpenMP build, loaded
// by src/kernels/blas.cpp), beside qkv's own kernels: the panels for most
// products (below), and register tiles for the case BLAS handles worst: a
// few rows of activations against a weight matrix stored [out, in], as in
// y = x W^T with one token per sequence (decoding). That product is bound by
// reading W once from memory, so the kernels read W's rows exactly once,
// with wide FMA accumulators, and split the rows between the OpenMP threads.
// In inference (on the avx512 and avx2 levels) register tiles take every
// count of rows up to kMaxTiledRows: each output is summed in the same order
// whatever the count, so a sequence decoded beside others (`qkv serve`'s
// streams) gets bit for bit what it gets alone. Training's few-row
// products take a streaming GEMV (up to 4 rows).
//
// Larger products go to qkv's own GEMM on the avx512 and avx2 levels (the
// panels of gemm_panels.cpp, from kPanelWork multiply-adds), to BLAS below
// that and on the generic level. They are split between the threads (C's
// rows, or its columns when it is wider than tall), one single-threaded call
// per thread: for the activation-by-weight shapes of a Transformer
// (thousands of rows, K and N in the hundreds) that ran 5-25% faster in `qkv
// bench vit` than letting OpenBLAS thread each call itself. The epilogue
// (bias, activation) runs on each thread's own part of C while it is still
// in that core's cache: in the panels, on each register tile as it is stored.
#include <algorithm>

#include <omp.h>

#include "src/kernels/blas.h"
#include "src/kernels/cpu/gemm_panels.h"
#include "src/kernels/cpu/simd.h"
#include "src/kernels/kernels.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define QKV_HAVE_GEMV 1  // without wide FMA, BLAS keeps every case
#endif

namespace qkv::cpu::QKV_CPU_NS {
#ifdef QKV_HAVE_GEMV
namespace {

// Rows of A handled by the streaming kernel; more rows reuse W enough that
// BLAS's blocked GEMM wins.
constexpr int64_t kMaxGemvRows = 4;

// x . w over k floats: four independent accumulators of full vector width, so
// loads, not one chain of dependent adds, set the pace. One row of W is one
// sequential stream, which the hardware prefetcher follows at full bandwidth
// (measured: interleaving four rows of W ran at 70-80% of it).
inline float dot(const float* x, const float* w, int64_t k) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX512F__)
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  for (; i + 64 <= k; i += 64) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(w + i + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(w + i + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(w + i + 48), a3);
  }
  for (; i + 16 <= k; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), a0);
  s = hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (; i + 32 <= k; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(w + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(w + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(w + i + 24), a3);
  }
  for (; i + 8 <= k; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
  const __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  for (float e : t) s += e;
#endif  // (QKV_HAVE_GEMV guarantees one of the two)
  for (; i < k; ++i) s += x[i] * w[i];
  return s;
}

inline void store(float* c, float v, float alpha, float beta, float bias) {
  *c = (beta == 0.0f ? alpha * v : alpha * v + beta * *c) + bias;  // beta 0 ignores what c held (NaN included), as BLAS does
}

// Rows [j0, j1) of C[m, n] = alpha * A[m, k] W[n, k]^T + beta * C: each row of
// W is read from memory once, then from L1 for the other rows of A.
void gemv_rows(const GemmArgs& g, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* w = g.b + j * g.ldb;
    const float bias = g.bias ? g.bias[j] : 0.0f;
    for (int64_t i = 0; i < g.m; ++i) store(g.c + i * g.ldc + j, dot(g.a + i * g.lda, w, g.k), g.alpha, g.beta, bias);
  }
}

void gemv(const GemmArgs& g) {
  // Small products (and calls from inside a parallel region, such as the
  // flash kernel's tiles) run on the calling thread without opening a team.
  if (g.n * g.k < (1 << 16) || omp_get_max_threads() == 1 || omp_in_parallel()) return gemv_rows(g, 0, g.n);
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    gemv_rows(g, g.n * t / threads, g.n * (t + 1) / threads);
  }
}

// Up to this many rows of A (a batch of decoding steps: the streams of `qkv
// serve`, the sentences of a greedy batch; GemmArgs::inference), W's rows are
// read in place by register tiles instead of going to BLAS, which first
// copies (packs) all of W on every call: with 16 rows that copy took 40% of a
// serving step. From one row on: with one row the tiles (four rows of W at a
// time, the next block prefetched) were also faster than the GEMV, 2.17-2.23
// against 2.34-2.45 ms a step of `qkv bench streams` on the lm-20m shape, and
// with 3-4 rows twice as fast (Intel Xeon with AMX, 2026-12-05). On the avx2
// level (QKV_ISA=avx2, same machine), against the GEMV up to 4 rows and BLAS
// above: 1 row 2.25-2.28 against 2.51 ms, 4 rows 3.40 against 5.70-6.52, 16
// rows 10.2-10.5 against 11.3-11.8.
constexpr int64_t kMaxTiledRows = 64;
// The block of W's rows a thread's tiles sweep with every row of A before
// moving on, in bytes: it stays in L2 while the next block is fetched into L2
// beside it (64 KiB and 256 KiB measured about the same, 512 KiB slower).
constexpr int64_t kTiledBlockBytes = 128 << 10;
// A's rows that sweep one group of W's rows while it is in L1, in bytes (tiled_cols).
constexpr int64_t kTiledChunkBytes = 16 << 10;

// Rows of A per tile (the level's vectors, Vec and kLanes, are simd.h's): 4 x
// 4 accumulators, 4 vectors of W and one of A fit avx512's 32 registers; on
// the avx2 level's 16, 2 x 4 accumulators do.
#if defined(__AVX512F__)
constexpr int kTileRows = 4;
#else
constexpr int kTileRows = 2;
#endif

#if defined(__AVX512F__)
// The sums of the 16 lanes of a, b, c and d, as [sum a, sum b, sum c, sum d]:
// unpacks pair them up within each 128-bit lane (no lane-crossing shuffle),
// then the four lanes are added.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // (The masked forms: GCC 12 warns falsely on the plain ones' undefined source.)
  const __m512 ab = _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xFFFF, a, b), _mm512_maskz_unpackhi_ps(0xFFFF, a, b));
  const __m512 cd = _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xFFFF, c, d), _mm512_maskz_unpackhi_ps(0xFFFF, c, d));
  const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
  const __m512 abcd = _mm512_add_ps(_mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, abd, cdd)),
                                    _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, abd, cdd)));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, abcd);  // per 128-bit lane: its part of each of the four sums
  return _mm_add_ps(_mm_add_ps(_mm_load_ps(lanes), _mm_load_ps(lanes + 4)),
                    _mm_add_ps(_mm_load_ps(lanes + 8), _mm_load_ps(lanes + 12)));
}
#endif

// The sum of each accumulator's lanes, in an order fixed by NR alone.
template <int NR>
inline void lane_sums(const Vec* acc, float* sums) {
#if defined(__AVX512F__)
  if constexpr (NR == 4) return _mm_storeu_ps(sums, hsum4(acc[0], acc[1], acc[2], acc[3]));
#endif
  for (int j = 0; j < NR; ++j) sums[j] = hsum(acc[j]);
}

// C's NR <= 4 outputs of a row of a tile, NR sums at columns 0, cs, 2 cs, ...
// from c: alpha sum (+ beta c) + bias, the four lanes at once. Output by
// output (`store`) the epilogue took a quarter of a tile's time at k 256
// (32 greedy rows against a [1024, 256] weight). Every tile stores through
// here, so a row gets the same bits whatever the rows beside it.
template <int NR>
inline void store_sums(const GemmArgs& g, float* c, const float* bias, int64_t cs, const float* sums) {
  const bool dense = NR == 4 && cs == 1;  // four neighbouring columns: whole vectors in and out
  auto load = [&](const float* p) {
    if (dense) return _mm_loadu_ps(p);
    alignas(16) float lanes[4] = {0, 0, 0, 0};
    for (int j = 0; j < NR; ++j) lanes[j] = p[j * cs];
    return _mm_load_ps(lanes);
  };
  __m128 y = _mm_mul_ps(_mm_set1_ps(g.alpha), _mm_load_ps(sums));
  if (g.beta != 0.0f) y = _mm_add_ps(y, _mm_mul_ps(_mm_set1_ps(g.beta), load(c)));
  if (bias) y = _mm_add_ps(y, load(bias));
  if (dense) return _mm_storeu_ps(c, y);
  alignas(16) float out[4];
  _mm_store_ps(out, y);
  for (int j = 0; j < NR; ++j) c[j * cs] = out[j];
}

// A part of the next block of W to bring into this core's cache while a tile
// computes from the current one: `lines` cache lines from `at`, a few per step.
struct Prefetch {
  const char* at = nullptr;
  int64_t lines = 0;
};

// C[i0 .. i0+MR) x columns j0, j0 + cs, ..., j0 + (NR-1) cs: MR x NR dot
// products over k in kLanes-lane accumulators (kept in registers: the loops
// unroll), each row of A and of W read once, in place. An output's sum does
// not depend on MR or cs: one accumulator over k, its lanes summed by hsum4
// (avx512) or hsum as the column's group of 4 is whole or not (fixed by n
// alone: the callers give NR < 4 only to the last group).
template <int MR, int NR>
void tile(const GemmArgs& g, int64_t i0, int64_t j0, Prefetch pf, int64_t cs) {
  Vec acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = vzero();
  const float* a = g.a + i0 * g.lda;
  const float* w = g.b + j0 * g.ldb;
  const int64_t lda = g.lda, ldb = g.ldb * cs, k = g.k;
  int64_t p = 0;
  const int64_t steps = std::max<int64_t>(1, k / kLanes);
  const int64_t per_step = pf.lines ? (pf.lines + steps) / steps : 0;
  for (; p + kLanes <= k; p += kLanes) {
    for (int64_t l = 0; l < per_step && pf.lines > 0; ++l, --pf.lines, pf.at += 64) _mm_prefetch(pf.at, _MM_HINT_T1);
    Vec wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = vload(w + j * ldb + p);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const Vec av = vload(a + i * lda + p);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = vfma(av, wv[j], acc[i][j]);
    }
  }
  if (p < k) {
    Vec wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = vload_first(w + j * ldb + p, k - p);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const Vec av = vload_first(a + i * lda + p, k - p);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = vfma(av, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    alignas(16) float sums[4] = {0, 0, 0, 0};
    lane_sums<NR>(acc[i], sums);
    store_sums<NR>(g, g.c + (i0 + i) * g.ldc + j0, g.bias ? g.bias + j0 : nullptr, cs, sums);
  }
}

// The tile of MR rows for the last 1 to 4 columns.
template <int MR>
void tile_cols(const GemmArgs& g, int64_t i0, int64_t j0, int64_t cols, Prefetch pf, int64_t cs) {
  switch (cols) {
    case 1: return tile<MR, 1>(g, i0, j0, pf, cs);
    case 2: return tile<MR, 2>(g, i0, j0, pf, cs);
    case 3: return tile<MR, 3>(g, i0, j0, pf, cs);
    default: return tile<MR, 4>(g, i0, j0, pf, cs);
  }
}

// The tile of the last 1 to MR rows (kTileRows at most: no tile taller than
// the level's registers hold is compiled).
template <int MR = kTileRows>
void tile_rows(const GemmArgs& g, int64_t i0, int64_t j0, int64_t rows, int64_t cols, Prefetch pf, int64_t cs = 1) {
  if constexpr (MR > 1)
    if (rows < MR) return tile_rows<MR - 1>(g, i0, j0, rows, cols, pf, cs);
  tile_cols<MR>(g, i0, j0, cols, pf, cs);
}

// Columns [j0, j1) of C, all its rows: W in blocks of kTiledBlockBytes, each
// swept by every row of A while it is in this core's L2. In a decoding step W
// comes from memory, once; the tiles of one block prefetch the next, so that
// wait overlaps the products instead of following them (`qkv bench ops`,
// "weights streamed", 16 rows on Zen 4: 90-114 GFLOP/s without, 124-160 with;
// a prefetch into L1 instead of L2 gained half as much).
//
// Within a block, A's rows go in chunks of about kTiledChunkBytes: each
// group of 4 rows of W is read from L2 once per chunk and then stays in L1
// for the chunk's tiles. Tile by tile across the block instead, W came from
// L2 again for every 4 rows of A (32 greedy rows: 8 times), about as many
// bytes per multiply-add as L2 delivers. The order of the tiles changes no
// output's sum.
void tiled_cols(const GemmArgs& g, int64_t j0, int64_t j1) {
  const int64_t block = std::max<int64_t>(4, kTiledBlockBytes / (4 * g.k) / 4 * 4);  // whole tiles of 4 rows
  const int64_t chunk = std::max<int64_t>(kTileRows, kTiledChunkBytes / (4 * g.k) / kTileRows * kTileRows);
  for (int64_t jb = j0; jb < j1; jb += block) {
    const int64_t je = std::min(j1, jb + block);
    // The next block's rows of W, [je, next), fetched in equal shares by this block's tiles.
    const int64_t next = std::min(j1, je + block);
    const char* pf_begin = reinterpret_cast<const char*>(g.b + je * g.ldb);
    const char* pf_end = next > je ? reinterpret_cast<const char*>(g.b + (next - 1) * g.ldb + g.k) : pf_begin;
    const int64_t pf_lines = (pf_end - pf_begin + 63) / 64;
    const int64_t tiles = ((g.m + kTileRows - 1) / kTileRows) * ((je - jb + 3) / 4);
    const int64_t share = (pf_lines + tiles - 1) / tiles;
    int64_t t = 0;
    for (int64_t ic = 0; ic < g.m; ic += chunk)
      for (int64_t j = jb; j < je; j += 4)
        for (int64_t i = ic; i < std::min(g.m, ic + chunk); i += kTileRows, ++t) {
          const int64_t rows = std::min<int64_t>(kTileRows, g.m - i);
          const int64_t cols = std::min<int64_t>(4, je - j);
          const Prefetch pf{pf_begin + t * share * 64, std::max<int64_t>(0, std::min(share, pf_lines - t * share))};
          tile_rows(g, i, j, rows, cols, pf);
        }
  }
}

// Columns [j0, j1) of C when all of A's rows fit one tile (a decoding step,
// a few streams): the range in four quarters, each tile taking one column of
// each, so the core reads four long streams of W at once where tiled_cols
// reads one (four rows a few KiB apart, then the next four). With one row
// W comes from memory 10% faster: lm-100m's Llama folder stepped at
// 13.9-14.3 ms against 15.7-16.3 (`qkv bench streams --rows 1`; the same
// weights read at 28 GB/s, where one 2-thread sequential read of 400 MB
// runs at 25 and eight streams a thread at 30; Intel Xeon with AMX,
// 2026-12-05). The outputs are the same bits either way: every tile here has
// 4 columns, and the columns left over are the last group, as in tiled_cols.
// Software prefetches ahead in each stream gained nothing measurable.
void tiled_strided(const GemmArgs& g, int64_t j0, int64_t j1) {
  side_by_side<4>(
      j0, j1, [&](int64_t j, int64_t q) { tile_rows(g, 0, j, g.m, 4, Prefetch{}, q); },
      [&](int64_t begin, int64_t end) { tiled_cols(g, begin, end); });
}

void sweep(const GemmArgs& g, int64_t j0, int64_t j1) {
  if (g.m <= kTileRows)
    tiled_strided(g, j0, j1);
  else
    tiled_cols(g, j0, j1);
}

// C = alpha * A W^T + beta * C + bias, W's columns split between the threads.
void tiled(const GemmArgs& g) {
  if (g.m * g.n * g.k < (1 << 18) || omp_get_max_threads() == 1 || omp_in_parallel()) return sweep(g, 0, g.n);
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    // Whole groups of 4 columns per thread.
    const int64_t groups = (g.n + 3) / 4;
    sweep(g, std::min(g.n, 4 * (groups * t / threads)), std::min(g.n, 4 * (groups * (t + 1) / threads)));
  }
}

}  // namespace
#endif

namespace {
// The epilogue on g's part of C, done by the thread that wrote it. The bias:
void add_bias_rows(const GemmArgs& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    float* c = g.c + i * g.ldc;
    for (int64_t j = 0; j < g.n; ++j) c[j] += g.bias[j];
  }
}

// and then the activation, over all of it at once when C and act_out are
// dense (unary_forward stays on this thread inside the split's parallel region).
void activate_rows(const GemmArgs& g) {
  if (g.ldc == g.n && g.ld_act == g.n) return unary_forward(g.act, g.c, g.act_out, g.m * g.n);
  for (int64_t i = 0; i < g.m; ++i) unary_forward(g.act, g.c + i * g.ldc, g.act_out + i * g.ld_act, g.n);
}

// BLAS, then the epilogue on the rows just written: each thread finishes its
// own part of C while that part is still in its cache. A bias over beta 0 is
// written into C first and the product added to it (beta 1): OpenBLAS clears
// C before a beta-0 product anyway, so the bias then costs no pass of its own.
void blas(const GemmArgs& g) {
  const bool bias_first = g.bias && g.beta == 0.0f;
  if (bias_first)
    for (int64_t i = 0; i < g.m; ++i) std::copy_n(g.bias, g.n, g.c + i * g.ldc);
  blas::sgemm()(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
                (blasint)g.m, (blasint)g.n, (blasint)g.k, g.alpha, g.a, (blasint)g.lda, g.b, (blasint)g.ldb,
                bias_first ? 1.0f : g.beta, g.c, (blasint)g.ldc);
  if (g.bias && !bias_first) add_bias_rows(g);
  if (g.act_out) activate_rows(g);
}

// One thread's product: the panels where this level has them, BLAS for the
// small ones (sending the panels products down to 2^12 multiply-adds, the
// flash kernel's short-sequence tiles among them, ran `qkv bench vit` 1-4%
// slower).
void one_thread(const GemmArgs& g) {
#ifdef QKV_HAVE_PANELS
  if (g.m * g.n * g.k >= kPanelWork) return gemm_panels(g);
#endif
  blas(g);
}
}  // namespace

void gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
#ifdef QKV_HAVE_GEMV
  if (g.inference && !g.trans_a && g.trans_b && g.m <= kMaxTiledRows && g.k >= 16) {
    tiled(g);  // bias included
    if (g.act_out) activate_rows(g);
    return;
  }
  if (!g.trans_a && g.trans_b && g.m <= kMaxGemvRows && g.k >= 16) {
    gemv(g);  // bias included
    if (g.act_out) activate_rows(g);
    return;
  }
#endif
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
#ifdef QKV_HAVE_PANELS
  const int64_t least_side = 16;  // the panels run on one thread each: every product worth a team is split
#else
  const int64_t least_side = 64;
#endif
  if (threads > 1 && std::max(g.m, g.n) >= least_side * threads && g.m * g.n * g.k >= (1 << 20)) {
    // C split along its longer side between the threads, one single-threaded
    // BLAS call each; each thread packs all of the operand it shares.
    const bool by_rows = g.m >= g.n;
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads(), len = by_rows ? g.m : g.n;
      const int64_t i0 = len * t / nt, i1 = len * (t + 1) / nt;
      GemmArgs p = g;
      if (by_rows) {
        p.m = i1 - i0;
        p.a = g.trans_a ? g.a + i0 : g.a + i0 * g.lda;  // A is stored [k, m] when transposed
        p.c = g.c + i0 * g.ldc;
        if (g.act_out) p.act_out = g.act_out + i0 * g.ld_act;
      } else {
        p.n = i1 - i0;
        p.b = g.trans_b ? g.b + i0 * g.ldb : g.b + i0;  // B is stored [n, k] when transposed
        p.c = g.c + i0;
        if (g.bias) p.bias = g.bias + i0;
        if (g.act_out) p.act_out = g.act_out + i0;
      }
      if (i1 > i0) one_thread(p);
    }
    return;
  }
  one_thread(g);
}

const char* gemm_f32_path() {
#if defined(QKV_HAVE_PANELS)
  return panels_path();
#else
  return "BLAS (the generic level has no kernel of its own)";
#endif
}

const char* gemm_decode_path() {
#if defined(__AVX512F__)
  static_assert(kLanes == 16 && kMaxTiledRows == 64, "the text names them");
  return "register tiles of 16 lanes for 1 to 64 rows in inference, each row summed alike whatever the others";
#elif defined(QKV_HAVE_GEMV)
  static_assert(kLanes == 8 && kMaxTiledRows == 64, "the text names them");
  return "register tiles of 8 lanes for 1 to 64 rows in inference, each row summed alike whatever the others";
#else
  return "BLAS (the generic level has no kernel of its own)";
#endif
}

void gemm_batched(const GemmArgs& g, int64_t batch, const int64_t* a_offsets, const int64_t* b_offsets,
                  int64_t c_stride) {
  auto one = [&](int64_t i) {
    GemmArgs p = g;
    p.a = g.a + a_offsets[i], p.b = g.b + b_offsets[i], p.c = g.c + i * c_stride;
    if (g.k == 0) {
      for (int64_t r = 0; r < g.m; ++r) std::fill_n(p.c + r * g.ldc, g.n, 0.0f);
      return;
    }
    gemm(p);
  };
  // Many small products: one per thread (BLAS runs single-threaded inside a
  // parallel region). Few large ones: let each use the threads.
  if (batch > 1 && g.m * g.n * g.k <= (1 << 18) && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < batch; ++i) one(i);
  } else {
    for (int64_t i = 0; i < batch; ++i) one(i);
  }
}

}  // namespace qkv::cpu::QKV_CPU_NS
