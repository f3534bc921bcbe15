// The bfloat16 GEMM (kernels.h, GemmBf16Args): C = alpha * A B^T + beta * C
// + bias, A [m, k] and B [n, k] bfloat16, C float32.
//
// Three ways, the first the CPU allows (the avx512 level chooses at run time;
// the lower levels have only the last):
//
//   AMX-BF16 tiles   Sapphire Rapids and later. A tile multiply (TDPBF16PS)
//                    is C[16x16] += A[16x32] B[32x16]: 16K flops in one
//                    instruction. Four C tiles (a 32x32 block of C) stay in
//                    tile registers while the k loop loads two A and two B
//                    tiles per step.
//   AVX512-BF16      Zen 4, Cooper Lake. VDPBF16PS adds the products of 16
//                    pairs of bfloat16 into 16 float32 sums: a block of 8 rows
//                    by 32 columns of C lives in 16 vector registers; each step
//                    broadcasts one pair of A per row against two vectors of B.
//                    Up to 4 rows of A (decoding), on AMX CPUs too, B is read
//                    once: a packed B (b_packed) block by block, one pair of
//                    A broadcast against 16 columns; a B as it lies row by
//                    row, as dot products, with no packing.
//   widened          bfloat16 -> float32 copies (exact: a shift), then the
//                    float32 GEMM; B in panels so the copy stays small.
//
// Both bfloat16 paths read the same packed operands, and packing is where an
// operand given in float32 is rounded and one held transposed is turned
// round (GemmBf16Args; the backward of mixed-precision training needs both),
// so the kernels see one layout. B (what a Linear layer
// keeps) in blocks of 16 columns: for each pair of k, the 16 columns' pairs
// side by side, the layout the tile multiply wants for its B tile (and a
// vector of the AVX512-BF16 path). A in 16 x 32 tiles. Both are zero-padded
// to whole tiles, so the kernels never test an edge; the epilogue writes only
// the part of each block that lies inside C. A caller that keeps B packed (a
// Linear's BF16 weight in inference: GemmBf16Args::b_packed, made by
// gemm_bf16_pack_b) skips B's packing, and may give no B as it lies
// (gemm_bf16_unpack_b gives it back).
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "src/kernels/cpu/float_copies.h"
#include "src/kernels/cpu/gemm_bf16_packed.h"
#include "src/kernels/cpu/gemm_tiles.h"
#include "src/kernels/cpu/scratch.h"
#include "src/kernels/cpu/simd.h"
#include "src/kernels/cpu/vec_math.h"
#include "src/kernels/kernels.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace qkv::cpu::QKV_CPU_NS {
namespace {

// bfloat16 <-> float32 as qkv::bf16_to_float and float_to_bf16 do them
// (rounding as vec_math.h's round_to_bf16), written again here so they
// inline in this level's loops: an inline function shared with the library
// could be kept by the linker in another level's copy.
inline float widen(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t round_bf16(float f) { return (uint16_t)(std::bit_cast<uint32_t>(round_to_bf16(f)) >> 16); }

// One operand's elements as bfloat16, rounding them when it is float32:
// at(r, p) is row r (of A, or of B), element p along k, wherever the
// operand's layout keeps it.
struct Operand {
  const uint16_t* bf16;
  const float* f32;
  int64_t row_stride, k_stride;
  uint16_t at(int64_t r, int64_t p) const {
    const int64_t o = r * row_stride + p * k_stride;
    return f32 ? round_bf16(f32[o]) : bf16[o];
  }
};
inline Operand operand_a(const GemmBf16Args& g) {
  return {g.a, g.a_f32, g.a_transposed ? 1 : g.lda, g.a_transposed ? g.lda : 1};
}
inline Operand operand_b(const GemmBf16Args& g) {
  return {g.b, g.b_f32, g.b_transposed ? 1 : g.ldb, g.b_transposed ? g.ldb : 1};
}

// This level's float32 gemm on widened copies (float_copies.h).
void widened(const GemmBf16Args& g) {
  GemmArgs f;
  f.m = g.m, f.n = g.n, f.k = g.k, f.alpha = g.alpha, f.beta = g.beta, f.c = g.c, f.ldc = g.ldc, f.bias = g.bias;
  const Operand a = operand_a(g), b = operand_b(g);
  gemm_on_float_copies(
      f, [&](int64_t i, float* out) { for (int64_t p = 0; p < g.k; ++p) out[p] = widen(a.at(i, p)); },
      [&](int64_t j, float* out) { for (int64_t p = 0; p < g.k; ++p) out[p] = widen(b.at(j, p)); });
}

// GemmBf16Args::a_sums in a pass of its own, each row's k in order: for the
// paths that do not pack A transposed from float32 (and on every level
// without AVX512-BF16).
void sum_rows_of_a(const GemmBf16Args& g) {
  std::fill(g.a_sums, g.a_sums + g.m, 0.0f);
  for (int64_t p = 0; p < g.k; ++p)
    if (g.a_transposed) {
      const float* row = g.a_f32 + p * g.lda;
#pragma omp simd
      for (int64_t i = 0; i < g.m; ++i) g.a_sums[i] += row[i];
    } else {
      for (int64_t i = 0; i < g.m; ++i) g.a_sums[i] += g.a_f32[i * g.lda + p];
    }
}

// g's product after sum_rows_of_a: the same call without a_sums.
template <class Gemm>
void summed_apart(const GemmBf16Args& g, Gemm&& gemm) {
  sum_rows_of_a(g);
  GemmBf16Args h = g;
  h.a_sums = nullptr;
  gemm(h);
}

// g's product, then GemmBf16Args::act_out in a pass of its own: for the
// paths that finish C element by element (up to 4 rows, k = 0, the widened
// float32 GEMM).
template <class Gemm>
void activated_apart(const GemmBf16Args& g, Gemm&& gemm) {
  GemmBf16Args h = g;
  h.act_out = nullptr;
  gemm(h);
  for (int64_t i = 0; i < g.m; ++i) unary_forward(g.act, g.c + i * g.ldc, g.act_out + i * g.ld_act, g.n);
}

// g with C in bfloat16 (GemmBf16Args::c_bf16) by way of a float32 C, for
// the paths that write C element by element (the GEMV of B as it lies, the
// widened float32 GEMM, k = 0): f(h) computes h, which is g with a float32
// C (C widened first when beta reads it), then g's activation, then rounded
// into g's C.
template <class F>
void through_float32_c(const GemmBf16Args& g, F&& f) {
  Scratch c(g.m * g.n);
  GemmBf16Args h = g;
  h.c = c.data(), h.ldc = g.n, h.c_bf16 = nullptr, h.has_act = false;
  if (g.beta != 0.0f)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) h.c[i * g.n + j] = widen(g.c_bf16[i * g.ldc + j]);
  f(h);
  if (g.has_act) unary_forward(g.act, h.c, h.c, g.m * g.n);
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) g.c_bf16[i * g.ldc + j] = round_bf16(h.c[i * g.n + j]);
}

#ifdef QKV_HAVE_TILES
// In inference on a CPU without AVX512-BF16: up to kMaxTiledRows rows of A
// (decoding steps, a few streams) against a bfloat16 B read where it lies.
// A is rounded and widened as the widened path reads it; B's rows go to
// gemm's register tiles, widened as they are loaded (gemm_tiled_bf16), so
// each output is the float32 gemm's over the widened copies, row by row
// whatever the rows beside it, and B is read once in bfloat16. The widened
// path copied B to float32 and read the copy again: decoding the lm-20m and
// lm-100m shapes with bfloat16 weights ran at 0.2-0.6x of float32 on an
// AVX2-only Zen 3, and at 1.8-2.1x through the tiles (docs/benchmarks.md).
bool tiles_fit(const GemmBf16Args& g) {
  return g.inference && g.b && !g.b_transposed && !g.b_f32 && g.m <= kMaxTiledRows && g.k >= 16 && !g.a_sums &&
         !g.act_out;
}

void tiled(const GemmBf16Args& g) {  // a float32 C
  Scratch a(g.m * g.k);
  const Operand op = operand_a(g);
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t p = 0; p < g.k; ++p) a.data()[i * g.k + p] = widen(op.at(i, p));
  GemmArgs f;
  f.trans_b = true, f.inference = true;
  f.m = g.m, f.n = g.n, f.k = g.k, f.alpha = g.alpha, f.beta = g.beta, f.bias = g.bias;
  f.a = a.data(), f.lda = g.k, f.ldb = g.ldb, f.c = g.c, f.ldc = g.ldc;
  gemm_tiled_bf16(f, g.b);
}

// g by the tiles, where they fit: false when they do not (and nothing was done).
bool by_tiles(const GemmBf16Args& g) {
  if (!tiles_fit(g) || g.m == 0 || g.n == 0) return false;
  if (g.c_bf16)
    through_float32_c(g, [](const GemmBf16Args& h) { tiled(h); });
  else
    tiled(g);
  return true;
}
#else
bool by_tiles(const GemmBf16Args&) { return false; }
#endif

#if defined(__AVX512F__)

// Elements p and p + 1 of row r as a pair (zeros past k).
inline uint32_t pair(const Operand& x, int64_t r, int64_t p, int64_t k) {
  const uint32_t lo = p < k ? x.at(r, p) : 0, hi = p + 1 < k ? x.at(r, p + 1) : 0;
  return lo | hi << 16;
}

// 32 floats -> 32 bfloat16 with VCVTNE2PS2BF16 (to nearest even; it reads
// denormal inputs as zero, which only moves a product below 1e-38).
__attribute__((target("avx512bf16"))) inline void round32(const float* x, uint16_t* out) {
  const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
  _mm512_storeu_si512(out, (__m512i)v);
}

// Elements [k0, k0 + 32) of row i of float32 A (not transposed), rounded to
// bfloat16 into out (zeros past k, and for a row past m); the last, partial
// segment zero-padded, then rounded as a whole one.
__attribute__((target("avx512bf16"))) inline void round_segment(const GemmBf16Args& g, int64_t i, int64_t k0,
                                                                uint16_t* out) {
  if (i >= g.m) return _mm512_storeu_si512(out, _mm512_setzero_si512());
  const float* x = g.a_f32 + i * g.lda + k0;
  if (k0 + 32 <= g.k) return round32(x, out);
  alignas(64) float staged[32] = {};
  std::memcpy(staged, x, sizeof(float) * (g.k - k0));
  round32(staged, out);
}

// Row i of A, elements [k0, k0 + 32), as 32 bfloat16 (zeros past k or m).
// vector_round: A is float32, not transposed, and the CPU has AVX512-BF16.
void pack_a_segment(const GemmBf16Args& g, const Operand& a, int64_t i, int64_t k0, bool vector_round,
                    uint16_t* out) {
  if (vector_round) return round_segment(g, i, k0, out);
  if (i >= g.m) return (void)std::memset(out, 0, 64);
  if (k0 + 32 <= g.k && g.a) return (void)std::memcpy(out, g.a + i * g.lda + k0, 64);
  for (int64_t q = 0; q < 32; ++q) out[q] = k0 + q < g.k ? a.at(i, k0 + q) : 0;
}

// A partial 16 x 32 block of float32 x (rows [r0, r0 + 16), k [k0, k0 + 32),
// element (r, p) at x.f32[r * row_stride + p * k_stride]), zero-padded past
// `rows` and `k` into staged[16][32]: the edge tiles then take the vector
// rounding, not one scalar rounding per element.
void stage_block(const Operand& x, int64_t r0, int64_t rows, int64_t k0, int64_t k, float* staged) {
  std::memset(staged, 0, sizeof(float) * 16 * 32);
  const int64_t re = std::min<int64_t>(16, rows - r0), pe = std::min<int64_t>(32, k - k0);
  for (int64_t r = 0; r < re; ++r)
    for (int64_t p = 0; p < pe; ++p) staged[r * 32 + p] = x.f32[(r0 + r) * x.row_stride + (k0 + p) * x.k_stride];
}

// 16 x 16 words, [16][16] in `in`, turned round into `out` (row stride 16).
inline void transpose_words(const uint32_t* in, uint32_t* out) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) out[c * 16 + r] = in[r * 16 + c];
}

// 16 bfloat16 values (or 16 floats rounded to them) in the low halves of 16 words.
__attribute__((target("avx512bf16"))) inline __m512i in_words(__m256i h) {
  return _mm512_maskz_cvtepu16_epi32(0xffff, h);  // (the maskz forms keep GCC 12 from seeing an undefined source)
}
__attribute__((target("avx512bf16"))) inline __m512i in_words(__m512 f) {
  return in_words((__m256i)_mm512_cvtneps_pbh(f));
}

// Elements [i0, i0 + 16) of row p of a transposed operand (A^T or B^T: each
// of its rows holds one k of 16 neighbouring rows of A or B), as in_words.
__attribute__((target("avx512bf16"))) inline __m512i sixteen(const Operand& x, int64_t p, int64_t i0) {
  const int64_t o = p * x.k_stride + i0;
  return x.f32 ? in_words(_mm512_loadu_ps(x.f32 + o))
               : in_words(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bf16 + o)));
}

// Two k of 16 rows (words as in_words gives them) as 16 pairs: lo in the low half.
__attribute__((target("avx512bf16"))) inline __m512i paired(__m512i lo, __m512i hi) {
  return _mm512_or_si512(lo, _mm512_maskz_slli_epi32(0xffff, hi, 16));
}

// 16 pairs of k (from k0) of the 16 rows r0.. of a transposed operand, the
// pair of row r at out[kk * 16 + r]: two of its rows per step, interleaved.
__attribute__((target("avx512bf16"))) void pairs_of_transposed(const Operand& x, int64_t r0, int64_t k0,
                                                               uint32_t* out) {
  for (int64_t kk = 0; kk < 16; ++kk)
    _mm512_storeu_si512(out + kk * 16, paired(sixteen(x, k0 + 2 * kk, r0), sixteen(x, k0 + 2 * kk + 1, r0)));
}

// pairs_of_transposed of a float32 operand that also sums its 32 k for each
// of the 16 rows, in order of k, into sums[16] (GemmBf16Args::a_sums).
__attribute__((target("avx512bf16"))) void pairs_of_transposed_summing(const Operand& x, int64_t r0, int64_t k0,
                                                                       uint32_t* out, float* sums) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < 16; ++kk) {
    const float* at = x.f32 + (k0 + 2 * kk) * x.k_stride + r0;
    const __m512 lo = _mm512_loadu_ps(at), hi = _mm512_loadu_ps(at + x.k_stride);
    acc = _mm512_add_ps(_mm512_add_ps(acc, lo), hi);
    _mm512_storeu_si512(out + kk * 16, paired(in_words(lo), in_words(hi)));
  }
  _mm512_storeu_ps(sums, acc);
}

// The 16 x 32 tile of A at rows m0, k from k0, when A is held transposed;
// with `sums` (a float32 A on a CPU with AVX512-BF16: gemm_bf16 asks), the
// tile's 16 rows' sums over its k too.
void pack_a_transposed(const GemmBf16Args& g, const Operand& a, int64_t m0, int64_t k0, uint16_t* tile,
                       float* sums = nullptr) {
  if (m0 + 16 <= g.m && k0 + 32 <= g.k && avx512_bf16_usable()) {
    alignas(64) uint32_t by_k[256];
    if (sums)
      pairs_of_transposed_summing(a, m0, k0, by_k, sums);
    else
      pairs_of_transposed(a, m0, k0, by_k);
    return transpose_words(by_k, reinterpret_cast<uint32_t*>(tile));
  }
  if (a.f32 && avx512_bf16_usable()) {  // an edge tile
    alignas(64) float staged[16 * 32];
    stage_block(a, m0, g.m, k0, g.k, staged);
    for (int64_t r = 0; r < 16; ++r) round32(staged + r * 32, tile + r * 32);
    for (int64_t r = 0; sums && r < 16; ++r) {  // the zeros past the edges add nothing
      float s = 0.0f;
      for (int64_t p = 0; p < 32; ++p) s += staged[r * 32 + p];
      sums[r] = s;
    }
    return;
  }
  const int64_t rows = std::clamp<int64_t>(g.m - m0, 0, 16);
  std::memset(tile, 0, 1024);
  for (int64_t q = 0; q < 32 && k0 + q < g.k; ++q)
    for (int64_t r = 0; r < rows; ++r) tile[r * 32 + q] = a.at(m0 + r, k0 + q);
}

// 16 columns of B from j0 by 16 pairs of k from k0, into `out` in the packed
// B layout (the pair of column jj at out[kk * 16 + jj]).
void pack_b_chunk(const GemmBf16Args& g, const Operand& b, int64_t j0, int64_t k0, uint32_t* out) {
  if (j0 + 16 <= g.n && k0 + 32 <= g.k && avx512_bf16_usable()) {
    if (g.b_transposed) return pairs_of_transposed(b, j0, k0, out);
    alignas(64) uint32_t by_column[256];  // each column's 32 k as one packed row, then turned round
    for (int64_t jj = 0; jj < 16; ++jj) {
      uint16_t* row = reinterpret_cast<uint16_t*>(by_column + jj * 16);
      if (g.b) std::memcpy(row, g.b + (j0 + jj) * g.ldb + k0, 64);
      else round32(g.b_f32 + (j0 + jj) * g.ldb + k0, row);
    }
    return transpose_words(by_column, out);
  }
  if (b.f32 && avx512_bf16_usable()) {  // an edge chunk: each column's 32 k zero-padded, rounded, turned round
    alignas(64) float staged[16 * 32];
    alignas(64) uint32_t by_column[256];
    stage_block(b, j0, g.n, k0, g.k, staged);
    for (int64_t jj = 0; jj < 16; ++jj) round32(staged + jj * 32, reinterpret_cast<uint16_t*>(by_column + jj * 16));
    return transpose_words(by_column, out);
  }
  for (int64_t kk = 0; kk < 16; ++kk)
    for (int64_t jj = 0; jj < 16; ++jj) out[kk * 16 + jj] = j0 + jj < g.n ? pair(b, j0 + jj, k0 + 2 * kk, g.k) : 0;
}

// The products large enough to pack with threads (when not inside a parallel region).
bool pack_with_threads(const GemmBf16Args& g) { return !omp_in_parallel() && g.m * g.n * g.k >= (1 << 20); }

}  // namespace

namespace {

// The 16 x 32 tile of g's A at rows m0, k from k0.
void pack_a_tile(const GemmBf16Args& g, const Operand& a, bool vector_round, int64_t m0, int64_t k0, uint16_t* tile) {
  if (g.a_transposed) return pack_a_transposed(g, a, m0, k0, tile);
  for (int64_t r = 0; r < 16; ++r) pack_a_segment(g, a, m0 + r, k0, vector_round, tile + r * 32);
}

bool vector_round_a(const GemmBf16Args& g) { return g.a_f32 && !g.a_transposed && avx512_bf16_usable(); }

// Words from one row of A to the next in a thread's block of rows
// (pack_a_rows): its kb chunks of 16 pairs, and 64 bytes more, so that the 16
// rows of a tile do not all fall into the same few sets of L1.
constexpr int64_t a_row_words(int64_t kb) { return kb * 16 + 16; }

// Rows [i0, i0 + rows) of float32 A as pack_a_rows lays them out.
__attribute__((target("avx512bf16"))) void round_rows(const GemmBf16Args& g, int64_t i0, int64_t rows, int64_t kb,
                                                      uint32_t* out) {
  for (int64_t i = i0; i < i0 + rows; ++i) {
    uint16_t* row = reinterpret_cast<uint16_t*>(out + (i - i0) * a_row_words(kb));
    for (int64_t p = 0; p < kb; ++p) round_segment(g, i, p * 32, row + p * 32);
  }
}

// Rows [i0, i0 + rows) of g's A (not transposed), as bfloat16 rows of
// a_row_words(kb) words each into out, on this thread: rounded when given
// in float32, zeros past k and past m. The kernels read their tiles from
// these rows in place (ATiles), so A costs one pass, row by row.
void pack_a_rows(const GemmBf16Args& g, int64_t i0, int64_t rows, int64_t kb, uint32_t* out) {
  if (vector_round_a(g)) return round_rows(g, i0, rows, kb, out);  // the fast path: its segments inlined
  const Operand a = operand_a(g);
  for (int64_t i = i0; i < i0 + rows; ++i) {
    uint16_t* row = reinterpret_cast<uint16_t*>(out + (i - i0) * a_row_words(kb));
    for (int64_t p = 0; p < kb; ++p) pack_a_segment(g, a, i, p * 32, false, row + p * 32);
  }
}

}  // namespace

// The tiles of a packed operand in the order its source is best read: a
// block's chunks one after another when its rows lie along k, but for an
// operand held transposed (each of its rows one k of all the operand's
// rows) chunk by chunk, each chunk's 32 rows of the source then read from
// end to end by neighbouring tiles. Block after block, a transposed
// operand's tiles read 64 bytes from each of 32 rows kilobytes apart, and
// its packing was 13% of a bf16 training step, most of it waiting for those
// loads. tile(index, block, chunk) packs one tile; index is its place.
template <class Tile>
void for_each_tile(const GemmBf16Args& g, int64_t blocks, bool transposed, Tile&& tile) {
  const int64_t kb = bf16_chunks(g.k);
#pragma omp parallel for schedule(static) if (pack_with_threads(g))
  for (int64_t t = 0; t < blocks * kb; ++t) {
    const int64_t blk = transposed ? t % blocks : t / kb, p = transposed ? t / blocks : t % kb;
    tile(blk * kb + p, blk, p);
  }
}

// Whether pack_bf16_a sums A's rows (GemmBf16Args::a_sums) as it packs: a
// transposed float32 A, on a CPU with AVX512-BF16.
bool sums_while_packing(const GemmBf16Args& g) { return g.a_f32 && g.a_transposed && avx512_bf16_usable(); }

void pack_bf16_a(const GemmBf16Args& g, uint32_t* out) {
  const bool vector_round = vector_round_a(g);
  const Operand a = operand_a(g);
  if (g.a_sums && sums_while_packing(g)) {
    // Each tile's 16 sums apart ([chunk][row]), then the chunks in order.
    const int64_t kb = bf16_chunks(g.k), rows = bf16_blocks(g.m) * 16;
    Scratch partial(kb * rows);
    float* part = partial.data();
    for_each_tile(g, bf16_blocks(g.m), true, [&](int64_t index, int64_t blk, int64_t p) {
      pack_a_transposed(g, a, blk * 16, p * 32, reinterpret_cast<uint16_t*>(out + index * 256),
                        part + p * rows + blk * 16);
    });
    std::copy(part, part + g.m, g.a_sums);
    for (int64_t p = 1; p < kb; ++p)
#pragma omp simd
      for (int64_t i = 0; i < g.m; ++i) g.a_sums[i] += part[p * rows + i];
    return;
  }
  for_each_tile(g, bf16_blocks(g.m), g.a_transposed, [&](int64_t index, int64_t blk, int64_t p) {
    pack_a_tile(g, a, vector_round, blk * 16, p * 32, reinterpret_cast<uint16_t*>(out + index * 256));
  });
}

void pack_bf16_b(const GemmBf16Args& g, uint32_t* out) {  // block nb holds its chunks one after another
  const Operand b = operand_b(g);
  for_each_tile(g, bf16_blocks(g.n), g.b_transposed, [&](int64_t index, int64_t blk, int64_t p) {
    pack_b_chunk(g, b, blk * 16, p * 32, out + index * 256);
  });
}

namespace {

// GemmBf16Args::act_out of 16 values of C (its lanes past `lanes` left as
// they are): GELU in registers (unary_forward's operations, so its bits),
// other activations through unary_forward. Through unary_forward for each
// row of a block, its calls cost more than GELU itself: a bf16 ViT training
// step spent 7% in them, against 3% for the pass over C they replaced.
inline void activate16(const GemmBf16Args& g, __m512 v, float* out, __mmask16 lanes) {
  if (g.act == UnaryOp::Gelu) return _mm512_mask_storeu_ps(out, lanes, gelu_exact(v));
  alignas(64) float staged[16];
  _mm512_store_ps(staged, v);
  unary_forward(g.act, staged, staged, 16);
  _mm512_mask_storeu_ps(out, lanes, _mm512_load_ps(staged));
}

// Writes a block of sums (rows x 16 columns per tile, row stride 16) into C,
// only where it lies inside C: float32 C (and act_out), or C in bfloat16 (c_bf16).
void finish_tile(const GemmBf16Args& g, const float* sums, int64_t i0, int64_t j0, int64_t rows) {
  if (j0 >= g.n) return;
  const int64_t ie = std::min(i0 + rows, g.m);
  const __mmask16 cols = (__mmask16)((1u << std::min<int64_t>(16, g.n - j0)) - 1);
  const __m512 alpha = _mm512_set1_ps(g.alpha), beta = _mm512_set1_ps(g.beta);
  const __m512 bias = g.bias ? _mm512_maskz_loadu_ps(cols, g.bias + j0) : _mm512_setzero_ps();
  if (g.c_bf16) {
    alignas(64) float staged[16];  // a row's values before their rounding, for the activation
    for (int64_t i = i0; i < ie; ++i) {
      uint16_t* c = g.c_bf16 + i * g.ldc + j0;
      __m512 v = _mm512_mul_ps(alpha, _mm512_load_ps(sums + (i - i0) * 16));
      if (g.beta != 0.0f) {
        const __m512i wide = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_maskz_loadu_epi16(cols, c));
        const __m512i old = _mm512_maskz_slli_epi32(0xffff, wide, 16);
        v = _mm512_fmadd_ps(beta, _mm512_castsi512_ps(old), v);
      }
      _mm512_store_ps(staged, _mm512_add_ps(v, bias));
      if (g.has_act) unary_forward(g.act, staged, staged, 16);
      _mm256_mask_storeu_epi16(c, cols, bf16_of(_mm512_load_ps(staged)));
    }
    return;
  }
  for (int64_t i = i0; i < ie; ++i) {
    float* c = g.c + i * g.ldc + j0;
    __m512 v = _mm512_mul_ps(alpha, _mm512_load_ps(sums + (i - i0) * 16));
    if (g.beta != 0.0f) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(cols, c), v);
    v = _mm512_add_ps(v, bias);
    _mm512_mask_storeu_ps(c, cols, v);
    if (g.act_out) activate16(g, v, g.act_out + i * g.ld_act + j0, cols);
  }
}

// Bytes of packed B in a panel: while one block of rows of A (in L1) passes
// every block of a panel of B (in L2: 2 MB on Sapphire Rapids, 1 MB on Zen
// 4), then the next block of rows, B is read from memory (or L3) once per
// panel, not once per block of rows, and C is written in rows of the
// panel's width. (Without panels a vocabulary projection read its 4 MB B
// from L3 once per 32 rows: 955 against 2,100 GFLOP/s on the Xeon's AMX.
// Panels of A instead, each block of B passing a panel of rows, wrote C a
// block's 32 columns at a time and trained 5% slower.)
constexpr int64_t kPanelBytes = 512 << 10;

// The share of the grid of blocks of C that one thread computes: rows of
// blocks [m0, m1) by columns of blocks [n0, n1). A block of C spans rows16
// blocks of 16 rows of A and 32 columns (two blocks of B).
struct BlockRange {
  int64_t m0, m1, n0, n1;
};

// Packed A as a thread's blocks read it: pk's, when the caller packed it
// whole, or else one block of rows at a time, rounded on this thread into
// `buffer` as rows (pack_a_rows) just before its blocks use it (A read once
// from memory, into L1 or L2, not packed whole, written out and read back).
struct RowsOfA {
  const PackedBf16& pk;
  int64_t rows16;
  uint32_t* buffer;
  // Two blocks of rows: amx_range_rounding rounds the next while the tiles multiply one.
  int64_t buffer_words() const { return pk.a ? 0 : 2 * rows16 * 16 * a_row_words(pk.kb); }
};

// Where the kernels find a block of 16 rows of A: the tile of chunk p at
// `at + p * chunk`, each of its 16 rows (16 pairs of k) `row` words after
// the one before, and the next 16 rows `block` words on. Packed A's tiles
// are 1 KB each (chunk 256, row 16); a thread's rows of A lie row by row
// (chunk 16, row a_row_words).
struct ATiles {
  const uint32_t* at;
  int64_t chunk, row, block;
};

// Blocks of 32 columns of C (two blocks of packed B, 2 KB per chunk of k)
// in a panel.
int64_t panel_blocks(int64_t kb) { return std::max<int64_t>(1, kPanelBytes / (2 * kb * 1024)); }

// Whether B fits one panel, so that A can be packed a block of rows at a
// time (with more panels every block of rows would be packed once per panel).
bool b_fits_one_panel(const GemmBf16Args& g) { return bf16_blocks(g.n) / 2 <= panel_blocks(bf16_chunks(g.k)); }

// Whether the kernels can read bfloat16 A where it lies, as rows (ATiles):
// not transposed, k whole chunks (a tile never reads past a row's k), rows
// whole 32-bit words apart (the tiles hold pairs). Then only a block of rows
// reaching past m is copied (into the thread's buffer): a chain of
// bfloat16 activations pays nothing for its A.
bool a_in_place(const GemmBf16Args& g) {
  return g.a && !g.a_transposed && g.k % 32 == 0 && g.lda % 2 == 0 && reinterpret_cast<uintptr_t>(g.a) % 4 == 0;
}

// Calls block(mb, nb, a) for every block of r, with a the block's rows of
// A: per panel of B, one block of rows of A after another, each against
// every block of the panel.
template <class Block>
void in_panels(const GemmBf16Args& g, const RowsOfA& from, const BlockRange& r, Block&& block) {
  const PackedBf16& pk = from.pk;
  const int64_t panel = panel_blocks(pk.kb), rows16 = from.rows16, row = a_row_words(pk.kb);
  for (int64_t n0 = r.n0; n0 < r.n1; n0 += panel) {
    const int64_t n1 = std::min(n0 + panel, r.n1);
    for (int64_t mb = r.m0; mb < r.m1; ++mb) {
      const int64_t i0 = mb * rows16 * 16;
      ATiles a{from.buffer, 16, row, 16 * row};
      if (pk.a)
        a = ATiles{pk.a + mb * rows16 * pk.a_stride, 256, 16, pk.a_stride};
      else if (a_in_place(g) && i0 + rows16 * 16 <= g.m)
        a = ATiles{reinterpret_cast<const uint32_t*>(g.a + i0 * g.lda), 16, g.lda / 2, 8 * g.lda};
      else
        pack_a_rows(g, i0, rows16 * 16, pk.kb, from.buffer);
      for (int64_t nb = n0; nb < n1; ++nb) block(mb, nb, a);
    }
  }
}

// The grid of blocks (of rows16 blocks of 16 rows of A by n_blocks) split
// over the threads (when not already inside a parallel region and the
// product is worth them): by rows of blocks when there are enough to share
// evenly, so that each thread packs only its own rows of A; else by columns.
// range(r, rows) runs on each thread with its share and its own buffer.
template <class Range>
void split_blocks(const GemmBf16Args& g, const PackedBf16& pk, int64_t rows16, int64_t n_blocks, Range&& range) {
  const int64_t m_blocks = ((g.m + 15) / 16 + rows16 - 1) / rows16;
  const bool threads = !omp_in_parallel() && m_blocks * n_blocks > 1 && g.m * g.n * g.k >= (1 << 18);
  const int64_t words = RowsOfA{pk, rows16, nullptr}.buffer_words();
  const auto run = [&](uint32_t* buffers) {
#pragma omp parallel if (threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      BlockRange r{0, m_blocks, 0, n_blocks};
      if (m_blocks >= 4 * nt || m_blocks % nt == 0)
        r.m0 = m_blocks * t / nt, r.m1 = m_blocks * (t + 1) / nt;
      else
        r.n0 = n_blocks * t / nt, r.n1 = n_blocks * (t + 1) / nt;
      if (r.m1 > r.m0 && r.n1 > r.n0) range(r, RowsOfA{pk, rows16, buffers ? buffers + t * words : nullptr});
    }
  };
  // No buffer when A comes packed: flash attention's tile products,
  // thousands per call from every thread, would each take the allocator's
  // lock for one.
  if (words == 0) return run(nullptr);
  Scratch buffers(words * (threads ? omp_get_max_threads() : 1));
  run(reinterpret_cast<uint32_t*>(buffers.data()));
}

// B packed whole (every thread reads all of it; the caller's b_packed when
// it kept one), and A too when B takes more than one panel; else A is left
// to the blocks of rows.
template <class Blocks>
void with_packed(const GemmBf16Args& g, Blocks&& blocks) {
  const int64_t kb = bf16_chunks(g.k);
  // (a transposed A: for_each_tile; one read in place is not packed at all)
  const bool whole_a = g.a_transposed || (!b_fits_one_panel(g) && !a_in_place(g));
  Scratch a(whole_a ? bf16_packed_words(g.m, g.k) : 0), b(g.b_packed ? 0 : bf16_packed_words(g.n, g.k));  // words
  uint32_t* pa = whole_a ? reinterpret_cast<uint32_t*>(a.data()) : nullptr;
  const uint32_t* pb = g.b_packed;
  if (whole_a) pack_bf16_a(g, pa);
  if (!pb) {
    pack_bf16_b(g, reinterpret_cast<uint32_t*>(b.data()));
    pb = reinterpret_cast<const uint32_t*>(b.data());
  }
  blocks(PackedBf16{.kb = kb, .nb = bf16_blocks(g.n), .a = pa, .a_stride = kb * 256, .b = pb, .b_stride = kb * 256});
}

// --- AMX ---

// This thread's tiles as the AMX kernel uses them: 16 rows of 64 bytes each.
__attribute__((target("amx-tile"))) void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;  // every tile 16 rows of 64 bytes
  load_tile_config(cfg);
}

// A bfloat16 C (GemmBf16Args::c_bf16) from the AMX blocks, one block
// behind: a block's four tiles are stored as float32 sums into one of two
// buffers, and its 32 rows finished into C (alpha, beta, bias, rounded)
// a few after each chunk of the next block's products, on the vector units
// beside the tile unit. Finished right after its own tile stores instead,
// a 2048 x 256 x 768 product took 13% longer and a 2048 x 384 x 128 one 25%
// (Xeon with AMX, kernel alone; 2048 x 128 x 384 the same either way).
struct DeferredBf16C {
  const GemmBf16Args& g;
  int64_t per_chunk;  // rows of the pending block finished after each chunk of k
  alignas(64) float sums[2][4][256];
  alignas(64) float staged[32 * 32];  // rows before their activation and rounding (plain_rows_staged, the edges)
  int pending = 0;
  int64_t i0 = 0, j0 = 0, done = 32;  // the pending block's place in C, and its rows finished
  // The common block (all of it inside C, alpha 1, beta 0) in a loop of its
  // own: its C, row by row, and its bias (zeros without one).
  bool plain = false;
  uint16_t* c = nullptr;
  __m512 bias_lo, bias_hi;

  DeferredBf16C(const GemmBf16Args& args, int64_t kb) : g(args), per_chunk((32 + kb - 1) / kb) {}

  // Rows [r0, r1) of the pending block, each from its two tiles (r / 16) *
  // 2 and + 1. A plain block's row of 32 columns is two loads, two adds,
  // one VCVTNE2PS2BF16 for both halves (it reads a denormal sum as zero) and
  // one store of 64 bytes: the vector units have little room beside the tile
  // unit, and a loop that tested alpha, beta and the edges per row took a
  // fifth of the product's time.
  __attribute__((target("avx512bf16"))) void finish_rows(int64_t r0, int64_t r1) {
    const float* s = sums[pending][0];
    if (plain) {
      if (!g.has_act) return plain_rows(r0, r1, [](__m512 v) { return v; });
      if (g.act == UnaryOp::Gelu) return plain_rows(r0, r1, [](__m512 v) { return gelu_exact(v); });
      if (g.act == UnaryOp::Relu)
        return plain_rows(r0, r1, [](__m512 v) { return _mm512_maskz_max_ps(0xffff, v, _mm512_setzero_ps()); });
      return plain_rows_staged(r0, r1);
    }
    for (int64_t r = r0; r < r1 && i0 + r < g.m; ++r)  // an edge, alpha or beta: 16 columns at a time
      for (int64_t half = 0; half < 2 && j0 + 16 * half < g.n; ++half) {
        const int64_t j = j0 + 16 * half;
        const __mmask16 cols = (__mmask16)((1u << std::min<int64_t>(16, g.n - j)) - 1);
        uint16_t* out = g.c_bf16 + (i0 + r) * g.ldc + j;
        __m512 v =
            _mm512_mul_ps(_mm512_set1_ps(g.alpha), _mm512_load_ps(s + (r >> 4) * 512 + half * 256 + (r & 15) * 16));
        if (g.beta != 0.0f) {
          const __m512i wide = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_maskz_loadu_epi16(cols, out));
          v = _mm512_fmadd_ps(_mm512_set1_ps(g.beta), _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, wide, 16)),
                              v);
        }
        if (g.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(cols, g.bias + j));
        if (g.has_act) {
          _mm512_store_ps(staged, v);
          unary_forward(g.act, staged, staged, 16);
          v = _mm512_load_ps(staged);
        }
        _mm256_mask_storeu_epi16(out, cols, bf16_of(v));
      }
  }
  // A plain block's rows [r0, r1), act(sum + bias) for act GELU, ReLU or none
  // (in registers: unary_forward's operations, so the same bits).
  template <class Act>
  __attribute__((target("avx512bf16"))) void plain_rows(int64_t r0, int64_t r1, Act&& act) {
    const float* s = sums[pending][0];
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = s + (r >> 4) * 512 + (r & 15) * 16;
      const __m512 lo = act(_mm512_add_ps(_mm512_load_ps(row), bias_lo));
      const __m512 hi = act(_mm512_add_ps(_mm512_load_ps(row + 256), bias_hi));
      _mm512_storeu_si512(c + r * g.ldc, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
  // A plain block's rows [r0, r1) with another activation (SiLU, the tanh
  // GELU, ...): the rows' sums plus bias staged, one unary_forward over all
  // of them, then rounded. (Staged 16 values at a time, as the edges are, a
  // call per 16 values would cost more than the tiles' products.)
  __attribute__((target("avx512bf16"))) void plain_rows_staged(int64_t r0, int64_t r1) {
    const float* s = sums[pending][0];
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = s + (r >> 4) * 512 + (r & 15) * 16;
      _mm512_store_ps(staged + (r - r0) * 32, _mm512_add_ps(_mm512_load_ps(row), bias_lo));
      _mm512_store_ps(staged + (r - r0) * 32 + 16, _mm512_add_ps(_mm512_load_ps(row + 256), bias_hi));
    }
    unary_forward(g.act, staged, staged, (r1 - r0) * 32);
    for (int64_t r = r0; r < r1; ++r) {
      const float* v = staged + (r - r0) * 32;
      _mm512_storeu_si512(c + r * g.ldc, (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(v + 16), _mm512_load_ps(v)));
    }
  }
  // After each chunk of k: the next few rows of the pending block.
  __attribute__((target("avx512bf16"))) void some() {
    if (done >= 32) return;
    const int64_t end = std::min<int64_t>(32, done + per_chunk);
    finish_rows(done, end);
    done = end;
  }
  __attribute__((target("avx512bf16"))) void flush() {
    if (done < 32) finish_rows(done, 32);
    done = 32;
  }
  // The buffer for the block at (i, j), whose tiles are stored next: the
  // pending block is finished first, then this one becomes it.
  float* take(int64_t i, int64_t j) {
    flush();
    pending ^= 1, i0 = i, j0 = j, done = 0;
    plain = i + 32 <= g.m && j + 32 <= g.n && g.alpha == 1.0f && g.beta == 0.0f;
    c = g.c_bf16 + i * g.ldc + j;
    bias_lo = plain && g.bias ? _mm512_loadu_ps(g.bias + j) : _mm512_setzero_ps();
    bias_hi = plain && g.bias ? _mm512_loadu_ps(g.bias + j + 16) : _mm512_setzero_ps();
    return sums[pending][0];
  }
};

// One 32 x 32 block of C (rows m2 * 32.., columns n2 * 32..) from the rows
// of A at `a` and packed B, in tiles configured by amx_configure. between(p)
// runs after the products of each chunk p of k: work for the core's vector
// units while the tile unit multiplies. With deferred (C in bfloat16) the
// block's sums go to it, and each chunk also finishes rows of the block
// before.
template <class Between>
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_block(const GemmBf16Args& g, const PackedBf16& pk,
                                                                   int64_t m2, int64_t n2, const ATiles& a,
                                                                   Between&& between,
                                                                   DeferredBf16C* deferred = nullptr) {
  const uint32_t *a0 = a.at, *a1 = a.at + a.block;
  const int64_t a_bytes = a.row * 4;
  const uint32_t* b0 = pk.b + (2 * n2) * pk.b_stride;
  const uint32_t* b1 = b0 + pk.b_stride;
  const int64_t i0 = m2 * 32, j0 = n2 * 32;
  float* c = g.c + i0 * g.ldc + j0;
  const int64_t ldc = g.ldc * 4;  // bytes
  // A whole block with alpha 1 and beta 0 or 1 starts its tiles at what C
  // must add to the products (the bias in every row, C itself, or zero)
  // and stores them into C: no pass over the sums after the tiles.
  const bool in_place = !g.c_bf16 && i0 + 32 <= g.m && j0 + 32 <= g.n && g.alpha == 1.0f &&
                        (g.beta == 0.0f || (g.beta == 1.0f && !g.bias));
  if (!in_place || (g.beta == 0.0f && !g.bias)) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else if (g.beta == 1.0f) {
    _tile_loadd(0, c, ldc);
    _tile_loadd(1, c + 16, ldc);
    _tile_loadd(2, c + 16 * g.ldc, ldc);
    _tile_loadd(3, c + 16 * g.ldc + 16, ldc);
  } else {  // the bias, the same 16 values in each of a tile's rows (a row stride of 0)
    _tile_loadd(0, g.bias + j0, 0);
    _tile_loadd(1, g.bias + j0 + 16, 0);
    _tile_loadd(2, g.bias + j0, 0);
    _tile_loadd(3, g.bias + j0 + 16, 0);
  }
  for (int64_t p = 0; p < pk.kb; ++p) {  // each load just before its first use, so loads overlap products
    _tile_loadd(4, a0 + p * a.chunk, a_bytes);
    _tile_loadd(6, b0 + p * 256, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b1 + p * 256, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a1 + p * a.chunk, a_bytes);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    between(p);
    if (deferred) deferred->some();
  }
  if (deferred) {
    float* sums = deferred->take(i0, j0);
    _tile_stored(0, sums, 64);
    _tile_stored(1, sums + 256, 64);
    _tile_stored(2, sums + 512, 64);
    _tile_stored(3, sums + 768, 64);
    return;
  }
  if (in_place) {
    _tile_stored(0, c, ldc);
    _tile_stored(1, c + 16, ldc);
    _tile_stored(2, c + 16 * g.ldc, ldc);
    _tile_stored(3, c + 16 * g.ldc + 16, ldc);
    for (int64_t r = 0; g.act_out && r < 32; ++r) {  // the block's 4 KB still in L1
      float* act = g.act_out + (i0 + r) * g.ld_act + j0;
      activate16(g, _mm512_loadu_ps(c + r * g.ldc), act, kAll);
      activate16(g, _mm512_loadu_ps(c + r * g.ldc + 16), act + 16, kAll);
    }
    return;
  }
  alignas(64) float sums[4][256];
  _tile_stored(0, sums[0], 64);
  _tile_stored(1, sums[1], 64);
  _tile_stored(2, sums[2], 64);
  _tile_stored(3, sums[3], 64);
  finish_tile(g, sums[0], i0, j0, 16);
  finish_tile(g, sums[1], i0, j0 + 16, 16);
  finish_tile(g, sums[2], i0 + 16, j0, 16);
  finish_tile(g, sums[3], i0 + 16, j0 + 16, 16);
}

// The 32 x 32 blocks of r, on this thread. (The target attribute is on the
// thread's body, not on a function holding the OpenMP region: the region's
// outlined function would not inherit it.)
__attribute__((target("amx-tile,amx-bf16"))) void amx_range(const GemmBf16Args& g, const RowsOfA& from,
                                                            const BlockRange& r) {
  amx_configure();
  DeferredBf16C deferred(g, from.pk.kb);
  DeferredBf16C* c_bf16 = g.c_bf16 ? &deferred : nullptr;
  in_panels(
      g, from, r, [&](int64_t m2, int64_t n2, const ATiles& a) __attribute__((target("amx-tile,amx-bf16"))) {
        amx_block(
            g, from.pk, m2, n2, a, [](int64_t) {}, c_bf16);
      });
  deferred.flush();
  _tile_release();
}

// amx_range for a float32 A rounded on this thread (B in one panel): while
// the tiles multiply a block of 32 rows of A by the panel, the vector units
// round the next 32 rows, a few segments of 32 after each chunk's products,
// into the other of two buffers (the tile unit works beside the vector
// units). Rounded first and multiplied after, A's rounding was a quarter of
// the samples of a 2048 x 1024 x 256 product (`perf`, Intel Xeon with AMX);
// spread between the products, that product took 3-8% less time, the other
// bench shapes about the same (docs/benchmarks.md).
__attribute__((target("amx-tile,amx-bf16,avx512bf16"))) void amx_range_rounding(const GemmBf16Args& g,
                                                                                const RowsOfA& from,
                                                                                const BlockRange& r) {
  const PackedBf16& pk = from.pk;
  const int64_t kb = pk.kb, row = a_row_words(kb), segments = 32 * kb;
  const int64_t steps = (r.n1 - r.n0) * kb, per_step = (segments + steps - 1) / steps;
  uint32_t* rows[2] = {from.buffer, from.buffer + 32 * row};
  round_rows(g, r.m0 * 32, 32, kb, rows[0]);
  amx_configure();
  DeferredBf16C deferred(g, kb);
  DeferredBf16C* c_bf16 = g.c_bf16 ? &deferred : nullptr;
  for (int64_t m2 = r.m0; m2 < r.m1; ++m2) {
    const ATiles a{rows[(m2 - r.m0) & 1], 16, row, 16 * row};
    uint32_t* next = rows[(m2 - r.m0 + 1) & 1];
    const int64_t i_next = (m2 + 1) * 32, todo = m2 + 1 < r.m1 ? segments : 0;
    int64_t s = 0;
    const auto round_some = [&](int64_t) __attribute__((target("avx512bf16"))) {
      for (const int64_t end = std::min(todo, s + per_step); s < end; ++s)
        round_segment(g, i_next + s / kb, s % kb * 32, reinterpret_cast<uint16_t*>(next + s / kb * row) + s % kb * 32);
    };
    for (int64_t n2 = r.n0; n2 < r.n1; ++n2) amx_block(g, pk, m2, n2, a, round_some, c_bf16);
  }
  deferred.flush();
  _tile_release();
}

void amx_blocks(const GemmBf16Args& g, const PackedBf16& pk) {
  // (DeferredBf16C rounds with AVX512-BF16, which every CPU with AMX-BF16 has had so far)
  if (g.c_bf16 && !avx512_bf16_usable()) return through_float32_c(g, [&](const GemmBf16Args& h) { amx_blocks(h, pk); });
  const bool rounding = !pk.a && vector_round_a(g);
  split_blocks(g, pk, 2, pk.nb / 2, [&](const BlockRange& r, const RowsOfA& from) {
    if (rounding) return amx_range_rounding(g, from, r);
    amx_range(g, from, r);
  });
}

// --- AVX512-BF16 ---

// The blocks of r (16 rows x 32 columns), on this thread.
__attribute__((target("avx512bf16"))) void dpbf16_range(const GemmBf16Args& g, const RowsOfA& from,
                                                        const BlockRange& blocks) {
  const PackedBf16& pk = from.pk;
  const int64_t kb = pk.kb;
  in_panels(
      g, from, blocks, [&](int64_t mb, int64_t n2, const ATiles& a_block) __attribute__((target("avx512bf16"))) {
        const uint32_t* b0 = pk.b + (2 * n2) * pk.b_stride;
        const uint32_t* b1 = b0 + pk.b_stride;
        alignas(64) float sums[2][256];
        for (int64_t half = 0; half < 2; ++half) {  // rows 0-7, then 8-15, of this 16-row block
          __m512 acc[8][2];
          for (auto& r : acc) r[0] = r[1] = _mm512_setzero_ps();
          for (int64_t p = 0; p < kb; ++p) {
            const uint32_t* a = a_block.at + p * a_block.chunk + half * 8 * a_block.row;
            for (int64_t q = 0; q < 16; ++q) {
              const __m512bh v0 = (__m512bh)_mm512_loadu_si512(b0 + (p * 16 + q) * 16);
              const __m512bh v1 = (__m512bh)_mm512_loadu_si512(b1 + (p * 16 + q) * 16);
#pragma GCC unroll 8
              for (int r = 0; r < 8; ++r) {
                const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[r * a_block.row + q]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, v0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, v1);
              }
            }
          }
          for (int r = 0; r < 8; ++r) {
            _mm512_store_ps(sums[0] + (half * 8 + r) * 16, acc[r][0]);
            _mm512_store_ps(sums[1] + (half * 8 + r) * 16, acc[r][1]);
          }
        }
        finish_tile(g, sums[0], mb * 16, n2 * 32, 16);
        finish_tile(g, sums[1], mb * 16, n2 * 32 + 16, 16);
      });
}

void dpbf16_blocks(const GemmBf16Args& g, const PackedBf16& pk) {
  split_blocks(g, pk, 1, pk.nb / 2, [&](const BlockRange& r, const RowsOfA& from) { dpbf16_range(g, from, r); });
}

// --- AVX512-BF16, a few rows (decoding) ---

// Rows of A up to which gemm_bf16 streams B instead of packing it: a product
// this thin is bound by reading B once, and packing would read it twice.
constexpr int64_t kMaxGemvRows = 4;

// Rows j, j + stride, ..., j + (NR-1) stride of B against the M rows of a
// (bfloat16, row stride k): each row of B read once, in order, straight from
// where it lies; two accumulators per output so that no single chain of
// dependent adds sets the pace (M and NR are constants so that they stay in
// registers), the same for every NR.
template <int M, int NR>
__attribute__((target("avx512bf16"))) void gemv_rows(const GemmBf16Args& g, const uint16_t* a, int64_t j,
                                                     int64_t stride) {
  const int64_t k = g.k, full = k / 32 * 32;
  const __mmask32 tail = (__mmask32)(k > full ? (1ull << (k - full)) - 1 : 0);
  const uint16_t* w[NR];
  for (int r = 0; r < NR; ++r) w[r] = g.b + (j + r * stride) * g.ldb;
  __m512 acc[M][NR][2];
  for (auto& i : acc)
    for (auto& r : i) r[0] = r[1] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 64 <= full; p += 64)
    for (int r = 0; r < NR; ++r) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w[r] + p), w1 = (__m512bh)_mm512_loadu_si512(w[r] + p + 32);
      for (int64_t i = 0; i < M; ++i) {
        acc[i][r][0] = _mm512_dpbf16_ps(acc[i][r][0], (__m512bh)_mm512_loadu_si512(a + i * k + p), w0);
        acc[i][r][1] = _mm512_dpbf16_ps(acc[i][r][1], (__m512bh)_mm512_loadu_si512(a + i * k + p + 32), w1);
      }
    }
  for (; p < full; p += 32)
    for (int r = 0; r < NR; ++r) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w[r] + p);
      for (int64_t i = 0; i < M; ++i)
        acc[i][r][0] = _mm512_dpbf16_ps(acc[i][r][0], (__m512bh)_mm512_loadu_si512(a + i * k + p), w0);
    }
  if (tail)
    for (int r = 0; r < NR; ++r) {
      const __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(tail, w[r] + full);
      for (int64_t i = 0; i < M; ++i)
        acc[i][r][1] =
            _mm512_dpbf16_ps(acc[i][r][1], (__m512bh)_mm512_maskz_loadu_epi16(tail, a + i * k + full), w0);
    }
  for (int r = 0; r < NR; ++r)
    for (int64_t i = 0; i < M; ++i) finish(g, i, j + r * stride, hsum(_mm512_add_ps(acc[i][r][0], acc[i][r][1])));
}

// Rows [j0, j1) of B: in quarters (halves for 3 or 4 rows of A, whose
// accumulators would not fit the registers four times) read side by side
// (side_by_side), the rows left over one at a time.
template <int M>
void gemv_parts(const GemmBf16Args& g, const uint16_t* a, int64_t j0, int64_t j1) {
  constexpr int kParts = M <= 2 ? 4 : 2;
  side_by_side<kParts>(
      j0, j1, [&](int64_t j, int64_t q) { gemv_rows<M, kParts>(g, a, j, q); },
      [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) gemv_rows<M, 1>(g, a, j, 0);
      });
}

// f.template operator()<M>() with M = g.m, a constant (gemm_bf16 sends at
// most kMaxGemvRows), so that a GEMV's sums per row stay in registers.
template <class F>
void with_row_count(const GemmBf16Args& g, F&& f) {
  switch (g.m) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    default: return f.template operator()<4>();
  }
}

// range(i0, i1) over [0, count) of a GEMV's units (columns, or blocks of
// them), split evenly between the threads when B is large enough to be
// worth them.
template <class Range>
void over_threads(const GemmBf16Args& g, int64_t count, Range&& range) {
  if (g.n * g.k < (1 << 16) || omp_get_max_threads() == 1 || omp_in_parallel()) return range(0, count);
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    range(count * t / nt, count * (t + 1) / nt);
  }
}

void gemv(const GemmBf16Args& g) {
  Scratch buffer((g.m * g.k + 1) / 2);  // A as bfloat16, rounded once
  uint16_t* a = reinterpret_cast<uint16_t*>(buffer.data());
  const Operand from = operand_a(g);
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t p = 0; p < g.k; ++p) a[i * g.k + p] = from.at(i, p);
  over_threads(g, g.n,
               [&](int64_t j0, int64_t j1) { with_row_count(g, [&]<int M>() { gemv_parts<M>(g, a, j0, j1); }); });
}

// The same few rows against B as packed (GemmBf16Args::b_packed), for a
// Linear that keeps only its packed weight: a block of 16 columns is all of
// k in order, 16 pairs of k per chunk, each pair's 16 columns one vector, so
// that one pair of a row of A, broadcast, meets a whole vector of B. Each
// output is its lane's sum over the pairs in order, one accumulator, whatever
// the other rows and blocks. NB blocks, `stride` blocks apart, go side by
// side: see gemv_packed.
template <int M, int NB>
__attribute__((target("avx512bf16"))) void gemv_packed_blocks(const GemmBf16Args& g, const uint32_t* a_pairs,
                                                              int64_t pairs, int64_t b, int64_t stride) {
  const int64_t block_words = bf16_chunks(g.k) * 256;
  const uint32_t* w[NB];
  for (int j = 0; j < NB; ++j) w[j] = g.b_packed + (b + j * stride) * block_words;
  __m512 acc[M][NB];
  for (auto& r : acc)
    for (auto& v : r) v = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(w[j] + p * 16);
    for (int64_t i = 0; i < M; ++i) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a_pairs[i * pairs + p]);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], x, wv[j]);
    }
  }
  alignas(64) float sums[M * 16];
  for (int j = 0; j < NB; ++j) {
    for (int64_t i = 0; i < M; ++i) _mm512_store_ps(sums + i * 16, acc[i][j]);
    finish_tile(g, sums, 0, (b + j * stride) * 16, M);
  }
}

// Blocks [b0, b1) of B: four quarters swept side by side, a block of each at
// a time (side_by_side); the blocks left over one at a time.
template <int M>
void gemv_packed_rows(const GemmBf16Args& g, const uint32_t* a_pairs, int64_t pairs, int64_t b0, int64_t b1) {
  side_by_side<4>(
      b0, b1, [&](int64_t b, int64_t q) { gemv_packed_blocks<M, 4>(g, a_pairs, pairs, b, q); },
      [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) gemv_packed_blocks<M, 1>(g, a_pairs, pairs, b, 0);
      });
}

void gemv_packed(const GemmBf16Args& g) {
  const int64_t pairs = bf16_chunks(g.k) * 16, blocks = (g.n + 15) / 16;
  Scratch buffer(g.m * pairs);  // A's rows as pairs of bfloat16, rounded once, zero past k as B is
  uint32_t* a = reinterpret_cast<uint32_t*>(buffer.data());
  const Operand from = operand_a(g);
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t q = 0; q < pairs; ++q) {
      const int64_t p = 2 * q;
      const uint32_t lo = p < g.k ? from.at(i, p) : 0, hi = p + 1 < g.k ? from.at(i, p + 1) : 0;
      a[i * pairs + q] = lo | hi << 16;
    }
  over_threads(g, blocks, [&](int64_t b0, int64_t b1) {
    with_row_count(g, [&]<int M>() { gemv_packed_rows<M>(g, a, pairs, b0, b1); });
  });
}

#endif  // __AVX512F__

}  // namespace

#if defined(__AVX512F__)

// Linux hands the tile data state (8 KB per thread) only to a process that
// asks for it: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
bool amx_tile_state_granted() {
  static const bool granted = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
    return has_feature("amx_tile") && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
  }();
  return granted;
}
bool amx_bf16_usable() {
  static const bool usable = has_feature("amx_bf16") && amx_tile_state_granted();
  return usable;
}
bool avx512_bf16_usable() {
  static const bool usable = has_feature("avx512_bf16");
  return usable;
}

// The k = 0 product (C = beta C + bias), in either C.
void empty_sum(const GemmBf16Args& g) {
  if (g.c_bf16) return through_float32_c(g, [](const GemmBf16Args& h) { scale_only(h); });
  scale_only(g);
}

void gemm_bf16_amx(const GemmBf16Args& g) {
  if (g.k == 0) return empty_sum(g);
  with_packed(g, [&](const PackedBf16& pk) { amx_blocks(g, pk); });
}
void gemm_bf16_avx512_bf16(const GemmBf16Args& g) {
  if (g.k == 0) return empty_sum(g);
  if (g.m <= kMaxGemvRows && g.b && !g.b_transposed) {  // B bfloat16, its rows in place
    if (g.c_bf16) return through_float32_c(g, [](const GemmBf16Args& h) { gemv(h); });
    return gemv(g);
  }
  with_packed(g, [&](const PackedBf16& pk) { dpbf16_blocks(g, pk); });
}
bool bf16_packed_usable() { return amx_bf16_usable() || avx512_bf16_usable(); }

void gemm_bf16_packed(const GemmBf16Args& g, const PackedBf16& pk) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return empty_sum(g);
  if (amx_bf16_usable() && g.m > kMaxGemvRows) return amx_blocks(g, pk);
  dpbf16_blocks(g, pk);
}

void gemm_bf16_widened(const GemmBf16Args& g) {
  if (g.c_bf16) return through_float32_c(g, [](const GemmBf16Args& h) { gemm_bf16_widened(h); });
  if (g.k == 0) return scale_only(g);
  widened(g);
}

void gemm_bf16(const GemmBf16Args& g) {
  // a_sums from the packing where it packs a transposed float32 A whole
  // (with_packed, for more than kMaxGemvRows rows), else apart
  if (g.a_sums && !(sums_while_packing(g) && g.m > kMaxGemvRows && g.n > 0 && g.k > 0 && !g.b_packed))
    return summed_apart(g, [](const GemmBf16Args& h) { gemm_bf16(h); });
  // act_out from the blocks' stores (AMX or AVX512-BF16, more than kMaxGemvRows rows), else apart
  if (g.act_out && !(!g.c_bf16 && g.m > kMaxGemvRows && g.n > 0 && g.k > 0 && bf16_packed_usable()))
    return activated_apart(g, [](const GemmBf16Args& h) { gemm_bf16(h); });
  if (g.m == 0 || g.n == 0) return;
  if (g.b_packed && g.m <= kMaxGemvRows && avx512_bf16_usable()) return g.k == 0 ? empty_sum(g) : gemv_packed(g);
  if (amx_bf16_usable() && (g.m > kMaxGemvRows || !g.b)) return gemm_bf16_amx(g);  // (!g.b: B packed only)
  if (avx512_bf16_usable()) return gemm_bf16_avx512_bf16(g);
  if (by_tiles(g)) return;
  gemm_bf16_widened(g);
}

const char* gemm_bf16_path() {
  if (amx_bf16_usable()) return "AMX-BF16 tiles (AVX512-BF16 for up to 4 rows)";
  if (avx512_bf16_usable()) return "AVX512-BF16";
  return "register tiles widening B for 1 to 64 rows in inference, the float32 GEMM on widened inputs above";
}

int64_t gemm_bf16_packed_b_words(int64_t n, int64_t k) { return bf16_packed_usable() ? bf16_packed_words(n, k) : 0; }
void gemm_bf16_pack_b(const GemmBf16Args& g, uint32_t* out) {
  if (!bf16_packed_usable() || g.b_f32 || g.b_transposed) std::abort();  // callers ask for the words first
  GemmBf16Args whole = g;
  whole.m = std::max<int64_t>(g.m, 64);  // a whole weight at once: worth the threads (pack_with_threads reads m)
  pack_bf16_b(whole, out);
}
void gemm_bf16_unpack_b(int64_t n, int64_t k, const uint32_t* packed, uint16_t* out) {
  const int64_t chunks = bf16_chunks(k);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t p = 0; p < k; ++p) {  // block j / 16, chunk p / 32, pair (p % 32) / 2, lane j % 16
      const uint32_t word = packed[((j / 16 * chunks + p / 32) * 16 + p % 32 / 2) * 16 + j % 16];
      out[j * k + p] = (uint16_t)(p % 2 ? word >> 16 : word & 0xFFFF);
    }
}

#else

bool bf16_packed_usable() { return false; }
void pack_bf16_a(const GemmBf16Args&, uint32_t*) { std::abort(); }  // callers ask bf16_packed_usable() first
void pack_bf16_b(const GemmBf16Args&, uint32_t*) { std::abort(); }
void gemm_bf16_packed(const GemmBf16Args&, const PackedBf16&) { std::abort(); }

void gemm_bf16(const GemmBf16Args& g) {
  if (g.a_sums) return summed_apart(g, [](const GemmBf16Args& h) { gemm_bf16(h); });
  if (g.act_out) return activated_apart(g, [](const GemmBf16Args& h) { gemm_bf16(h); });
  if (g.m == 0 || g.n == 0) return;
  if (by_tiles(g)) return;
  if (g.c_bf16) return through_float32_c(g, [](const GemmBf16Args& h) { gemm_bf16(h); });
  if (g.k == 0) return scale_only(g);
  widened(g);
}

const char* gemm_bf16_path() {
#ifdef QKV_HAVE_TILES
  return "register tiles widening B for 1 to 64 rows in inference, the float32 GEMM on widened inputs above";
#else
  return "the float32 GEMM on widened inputs";
#endif
}

int64_t gemm_bf16_packed_b_words(int64_t, int64_t) { return 0; }  // widened copies: nothing packed
void gemm_bf16_pack_b(const GemmBf16Args&, uint32_t*) { std::abort(); }
void gemm_bf16_unpack_b(int64_t, int64_t, const uint32_t*, uint16_t*) { std::abort(); }

#endif

}  // namespace qkv::cpu::QKV_CPU_NS
