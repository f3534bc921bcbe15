// The register tiles of gemm (gemm.cpp) for products of a few rows of A
// against a weight W stored [out, in] and read in place: decoding steps,
// batches of streams, greedy batches (GemmArgs::inference). A file of their
// own so that the sanitizer builds can compile them without instrumentation
// (range_checked.h).
#include "src/kernels/cpu/gemm_tiles.h"

#ifdef QKV_HAVE_TILES
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "src/kernels/cpu/range_checked.h"
#include "src/kernels/cpu/simd.h"
#endif

namespace qkv::cpu::QKV_CPU_NS {
#ifdef QKV_HAVE_TILES
namespace {

// The block of W's rows a thread's tiles sweep with every row of A before
// moving on, in bytes: it stays in L2 while the next block is fetched into L2
// beside it (64 KiB and 256 KiB measured about the same, 512 KiB slower).
constexpr int64_t kTiledBlockBytes = 128 << 10;
// A's rows that sweep one group of W's rows while it is in L1, in bytes (tiled_cols).
constexpr int64_t kTiledChunkBytes = 16 << 10;
// Up to this many rows of A, tiled_strided; above, tiled_cols.
constexpr int64_t kStridedRows = 8;

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

// The formats W may have, each with the element type a row holds and how a
// vector of W is loaded as float32: as it lies, or 16-bit values widened
// (exactly), so that a 16-bit weight is read in half the bytes and each
// output is the same chain of float32 FMAs as over its widened copy.
struct F32Weight {  // float32
  using Elem = float;
  static Vec load(const float* p) { return vload(p); }
};
struct Bf16Weight {  // bfloat16 bits: a zero-extend and a shift left by 16
  using Elem = uint16_t;
#if defined(__AVX512F__)
  static Vec load(const uint16_t* p) {  // (the maskz forms: GCC 12 warns on the plain ones)
    const __m512i u = _mm512_maskz_cvtepu16_epi32(kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, u, 16));
  }
#else
  static Vec load(const uint16_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
#endif
};
struct F16Weight {  // IEEE half bits: F16C's VCVTPH2PS (the avx2 and avx512 levels both have it)
  using Elem = uint16_t;
#if defined(__AVX512F__)
  static Vec load(const uint16_t* p) {
    return _mm512_maskz_cvtph_ps(kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
#else
  static Vec load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif
};

// A row's last n < kLanes values of W as a vector, zeros after.
template <class W>
inline Vec load_first(const typename W::Elem* p, int64_t n) {
  if constexpr (std::is_same_v<W, F32Weight>) {
    return vload_first(p, n);
  } else {
    alignas(64) uint16_t lanes[kLanes] = {};
    for (int64_t i = 0; i < n; ++i) lanes[i] = p[i];
    return W::load(lanes);
  }
}

// C's NR <= 4 outputs of a row of a tile, NR sums at columns 0, cs, 2 cs, ...
// from c: alpha sum (+ beta c) + bias, the four lanes at once. Output by
// output (gemm.cpp's `store`) the epilogue took a quarter of a tile's time
// at k 256 (32 greedy rows against a [1024, 256] weight). Every tile stores
// through here, so a row gets the same bits whatever the rows beside it.
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
//
// W is b, in format W (F32Weight, Bf16Weight, F16Weight), its rows g.ldb
// apart; g.b is not read.
// Under the sanitizers, the rows of A and W and the outputs it reads and
// writes are checked first (range_checked.h), not its loads one by one.
template <int MR, int NR, class W>
void tile(const GemmArgs& g, const typename W::Elem* b, int64_t i0, int64_t j0, Prefetch pf, int64_t cs) {
  check_rows(Access::Read, g.a + i0 * g.lda, MR, g.k, g.lda);
  check_rows(Access::Read, b + j0 * g.ldb, NR, g.k, g.ldb * cs);
  for (int i = 0; i < MR; ++i) {
    if (g.beta != 0.0f) check_rows(Access::Read, g.c + (i0 + i) * g.ldc + j0, NR, 1, cs);
    check_rows(Access::Write, g.c + (i0 + i) * g.ldc + j0, NR, 1, cs);
  }
  if (g.bias) check_rows(Access::Read, g.bias + j0, NR, 1, cs);
  Vec acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = vzero();
  const float* a = g.a + i0 * g.lda;
  const typename W::Elem* w = b + j0 * g.ldb;
  const int64_t lda = g.lda, ldb = g.ldb * cs, k = g.k;
  int64_t p = 0;
  const int64_t steps = std::max<int64_t>(1, k / kLanes);
  const int64_t per_step = pf.lines ? (pf.lines + steps) / steps : 0;
  for (; p + kLanes <= k; p += kLanes) {
    for (int64_t l = 0; l < per_step && pf.lines > 0; ++l, --pf.lines, pf.at += 64) _mm_prefetch(pf.at, _MM_HINT_T1);
    Vec wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = W::load(w + j * ldb + p);
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
    for (int j = 0; j < NR; ++j) wv[j] = load_first<W>(w + j * ldb + p, k - p);
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
template <int MR, class W>
void tile_cols(const GemmArgs& g, const typename W::Elem* b, int64_t i0, int64_t j0, int64_t cols, Prefetch pf,
               int64_t cs) {
  switch (cols) {
    case 1: return tile<MR, 1, W>(g, b, i0, j0, pf, cs);
    case 2: return tile<MR, 2, W>(g, b, i0, j0, pf, cs);
    case 3: return tile<MR, 3, W>(g, b, i0, j0, pf, cs);
    default: return tile<MR, 4, W>(g, b, i0, j0, pf, cs);
  }
}

// The tile of the last 1 to MR rows (kTileRows at most: no tile taller than
// the level's registers hold is compiled).
template <class W, int MR = kTileRows>
void tile_rows(const GemmArgs& g, const typename W::Elem* b, int64_t i0, int64_t j0, int64_t rows, int64_t cols,
               Prefetch pf, int64_t cs = 1) {
  if constexpr (MR > 1)
    if (rows < MR) return tile_rows<W, MR - 1>(g, b, i0, j0, rows, cols, pf, cs);
  tile_cols<MR, W>(g, b, i0, j0, cols, pf, cs);
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
template <class W>
void tiled_cols(const GemmArgs& g, const typename W::Elem* b, int64_t j0, int64_t j1) {
  const int64_t row_bytes = (int64_t)sizeof(typename W::Elem) * g.k;
  const int64_t block = std::max<int64_t>(4, kTiledBlockBytes / row_bytes / 4 * 4);  // whole tiles of 4 rows
  const int64_t chunk = std::max<int64_t>(kTileRows, kTiledChunkBytes / (4 * g.k) / kTileRows * kTileRows);
  for (int64_t jb = j0; jb < j1; jb += block) {
    const int64_t je = std::min(j1, jb + block);
    // The next block's rows of W, [je, next), fetched in equal shares by this block's tiles.
    const int64_t next = std::min(j1, je + block);
    const char* pf_begin = reinterpret_cast<const char*>(b + je * g.ldb);
    const char* pf_end = next > je ? reinterpret_cast<const char*>(b + (next - 1) * g.ldb + g.k) : pf_begin;
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
          tile_rows<W>(g, b, i, j, rows, cols, pf);
        }
  }
}

// Columns [j0, j1) of C for up to kStridedRows rows of A (a decoding step, a
// few streams): the range in four quarters, each group of tiles taking one
// column of each, so the core reads four long streams of W at once where
// tiled_cols reads one (four rows a few KiB apart, then the next four); the
// group's tiles, one per kTileRows rows of A, find those four rows in L1.
// With one row W comes from memory 10% faster: lm-100m's Llama folder stepped at
// 13.9-14.3 ms against 15.7-16.3 (`qkv bench streams --rows 1`; the same
// weights read at 28 GB/s, where one 2-thread sequential read of 400 MB
// runs at 25 and eight streams a thread at 30; Intel Xeon with AMX,
// 2026-12-05). The outputs are the same bits either way: every tile here has
// 4 columns, and the columns left over are the last group, as in tiled_cols.
// Software prefetches ahead in each stream gained nothing measurable. This
// sweep took only as many rows as one tile (2 on the avx2 level) until
// 2026-12-07; with 3 to 8 rows tiled_cols took 1.2-1.7x as long (`qkv bench
// streams` on lm-20m's Llama folder, float32 weights, two threads, three
// runs of each build interleaved: 3 rows 5.3-6.3 ms a step against 3.8-4.2
// here, 4 rows 5.8-7.1 against 4.1-4.8, 8 rows 8.1-8.5 against 5.6-6.6;
// AVX2-only Zen 3). Whether it gains above 8 rows is not measured.
template <class W>
void tiled_strided(const GemmArgs& g, const typename W::Elem* b, int64_t j0, int64_t j1) {
  side_by_side<4>(
      j0, j1,
      [&](int64_t j, int64_t q) {
        for (int64_t i = 0; i < g.m; i += kTileRows)
          tile_rows<W>(g, b, i, j, std::min<int64_t>(kTileRows, g.m - i), 4, Prefetch{}, q);
      },
      [&](int64_t begin, int64_t end) { tiled_cols<W>(g, b, begin, end); });
}

template <class W>
void sweep(const GemmArgs& g, const typename W::Elem* b, int64_t j0, int64_t j1) {
  if (g.m <= kStridedRows)
    tiled_strided<W>(g, b, j0, j1);
  else
    tiled_cols<W>(g, b, j0, j1);
}

template <class W>
void tiled(const GemmArgs& g, const typename W::Elem* b) {
  if (g.m * g.n * g.k < (1 << 18) || omp_get_max_threads() == 1 || omp_in_parallel()) return sweep<W>(g, b, 0, g.n);
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    // Whole groups of 4 columns per thread.
    const int64_t groups = (g.n + 3) / 4;
    sweep<W>(g, b, std::min(g.n, 4 * (groups * t / threads)), std::min(g.n, 4 * (groups * (t + 1) / threads)));
  }
}

}  // namespace

void gemm_tiled(const GemmArgs& g) { tiled<F32Weight>(g, g.b); }
void gemm_tiled_bf16(const GemmArgs& g, const uint16_t* b) { tiled<Bf16Weight>(g, b); }
void gemm_tiled_f16(const GemmArgs& g, const uint16_t* b) { tiled<F16Weight>(g, b); }
#endif
}  // namespace qkv::cpu::QKV_CPU_NS
