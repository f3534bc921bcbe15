// qkv's own float32 GEMM for every product that is not a decoding step's few
// rows (those take the register tiles of gemm_tiles.cpp): the activation-by-weight
// products of training and prefill, their gradients, and the attention's
// tiles. It is built the way BLIS and OpenBLAS build theirs, smaller:
//
//   - B's columns are copied (packed) into panels of kCols columns, each
//     stored [k][kCols], so that one step p of the reduction reads kVecs
//     whole vectors of one panel, side by side in memory, whatever B's layout
//     (a Linear weight [n, k] read transposed, or an activation [k, n]);
//   - a register tile of kRows rows of A by one panel keeps kRows x kVecs
//     accumulators in registers; each step broadcasts one value of A per row
//     and multiplies it into all of the panel's vectors, so every load of B
//     feeds kRows FMAs and every broadcast kVecs. A itself is read in place
//     (row-major, or transposed: its kRows values of a step side by side),
//     except a transposed A of many steps, copied into tiles (pack_a);
//   - the reduction goes in steps of kDepth (a panel's step then stays in
//     L1), B is packed a block of rows and columns at a time (it stays in
//     L2), and a block of A's rows sweeps one panel before the next panel.
//
// Between steps a tile's sums wait in C (or in a buffer, when beta needs C's
// old values); after the last step alpha, beta, the bias, the addend (a
// residual connection) and the activation are applied as the tile is stored,
// while it is still in L1 (no pass of its own over C, no clearing of C
// first). Every output is one chain of FMAs over p = 0, 1, ..., k-1 in a lane
// of its own, so its bits depend neither on the rows or columns beside it nor
// on how gemm splits C between the threads.
//
// Why not OpenBLAS here: on these shapes its kernel spends 10-20% of a
// product packing both operands, and the clearing, bias and activation passes
// over C come on top. Measured on one core of an Intel Xeon with AVX-512
// (family 6 model 167), A [1008, K] W[N, K]^T + bias: 8 x 48 tiles 162-173
// GFLOP/s against OpenBLAS's 126-138 for K 128-1024 and N 96-384
// (docs/benchmarks.md has the whole-model figures).
#include "src/kernels/cpu/gemm_panels.h"

#include <algorithm>

#ifdef QKV_HAVE_PANELS
#include <immintrin.h>

#include "src/kernels/cpu/range_checked.h"
#include "src/kernels/cpu/scratch.h"
#include "src/kernels/cpu/simd.h"
#include "src/kernels/cpu/vec_math.h"
#endif

namespace qkv::cpu::QKV_CPU_NS {
#ifdef QKV_HAVE_PANELS
namespace {

// The tiles, on the level's vectors (Vec, kLanes: simd.h).
#if defined(__AVX512F__)
// 8 x 3 accumulators, 3 vectors of B and one broadcast: 28 of the 32
// registers. (12 x 2 and 14 x 2 ran at 150-157 GFLOP/s where 8 x 3 ran at
// 162-173; 6 x 4 and 4 x 4 lower still.)
constexpr int kRows = 8, kVecs = 3;
#else
// 6 x 2 accumulators, 2 vectors of B and one broadcast: 15 of the 16 registers.
constexpr int kRows = 6, kVecs = 2;
#endif

constexpr int64_t kCols = kVecs * kLanes;
// The reduction in steps of at most kDepth: a panel of kDepth x kCols floats
// (24 KiB on avx512) stays in L1 beside the rows of A that sweep it. B is
// packed up to kPackDepth of its rows and kPackBytes of panels at a time
// (they stay in L2 while every row of A passes them), and A's rows go
// through one panel in blocks of about kRowBlockBytes.
constexpr int64_t kDepth = 128;
constexpr int64_t kPackDepth = 512;
constexpr int64_t kPackBytes = 512 << 10;
constexpr int64_t kRowBlockBytes = 32 << 10;
constexpr int64_t kLocalFloats = 4096;
// A transposed A of at most this many steps is read where it lies, not
// packed (pack_a): its steps' rows all stay in L1 (flash attention's P^T
// and dS^T, whose 64 query rows were copied into tiles for every product:
// a tenth of the float32 backward at 1,024 tokens).
constexpr int64_t kInPlaceDepth = 64;

// One step of the reduction, [p0, p0 + depth), for a block of columns.
struct Step {
  int64_t p0 = 0, depth = 0;
  bool first = true, last = true;  // the sums start at zero / the epilogue follows
  float* sums = nullptr;           // where the sums wait between steps (C itself, or
  int64_t ld_sums = 0;             // a buffer when beta needs C's old values)
};

// Rows [p0, p0 + depth) of columns [j0, j0 + cols) of op(B) as panels
// [depth][kCols], the last one padded with zeros (its columns are computed
// and not stored).
void pack_b(const GemmArgs& g, int64_t j0, int64_t cols, const Step& s, float* out) {
  const int64_t depth = s.depth;
  if (g.trans_b)
    check_rows(Access::Read, g.b + j0 * g.ldb + s.p0, cols, depth, g.ldb);
  else
    check_rows(Access::Read, g.b + s.p0 * g.ldb + j0, depth, cols, g.ldb);
  check_rows(Access::Write, out, 1, (cols + kCols - 1) / kCols * kCols * depth, 0);
  if (!g.trans_b) {  // B stored [k, n]: each row of B read once from end to end, a panel row at a time
    for (int64_t p = 0; p < depth; ++p) {
      const float* src = g.b + (s.p0 + p) * g.ldb + j0;
      for (int64_t q = 0; q < cols; q += kCols) {
        float* row = out + q * depth + p * kCols;  // q / kCols panels of depth * kCols before it
        const int64_t w = std::min(kCols, cols - q);
#pragma GCC unroll 4
        for (int64_t v = 0; v < kCols; v += kLanes)
          vstore(row + v, vload_first(src + q + v, std::clamp<int64_t>(w - v, 0, kLanes)));
      }
    }
    return;
  }
  for (int64_t q = 0; q < cols; q += kCols) {  // B stored [n, k]: column j is row j of the storage
    float* panel = out + q * depth;
    const int64_t w = std::min(kCols, cols - q);
#if defined(__AVX512F__)
    // 16 x 16 blocks transposed in registers (rows past w read as zeros):
    // copied one float at a time the pack took a fifth of a 128-row
    // product's time.
    for (int64_t j = 0; j < kCols; j += kLanes)
      for (int64_t p0 = 0; p0 < depth; p0 += kLanes)
        transpose_block16(g.b + (j0 + q + j) * g.ldb + s.p0 + p0, g.ldb, w - j, depth - p0, panel + p0 * kCols + j,
                          kCols);
#elif defined(__AVX2__)
    // 8 x 8 blocks, the same way: one float at a time, `qkv bench ops` on
    // one thread of an AVX2-only Zen 3 spent 4.8% of its samples packing
    // beside 27% in the tiles; 2.6% in 8 x 8 blocks.
    for (int64_t j = 0; j < kCols; j += kLanes)
      for (int64_t p0 = 0; p0 < depth; p0 += kLanes)
        transpose_block8(g.b + (j0 + q + j) * g.ldb + s.p0 + p0, g.ldb, w - j, depth - p0, panel + p0 * kCols + j,
                         kCols);
#else
    for (int64_t j = 0; j < w; ++j) {
      const float* src = g.b + (j0 + q + j) * g.ldb + s.p0;
      for (int64_t p = 0; p < depth; ++p) panel[p * kCols + j] = src[p];
    }
    if (w < kCols)
      for (int64_t p = 0; p < depth; ++p) std::fill(panel + p * kCols + w, panel + (p + 1) * kCols, 0.0f);
#endif
  }
}

// A transposed ([k, m] storage, as in a weight's gradient dY^T X) is copied
// a block of rows and a step at a time into tiles [depth][kRows]. Read in
// place, each step of a tile took its kRows values from another row of the
// storage, and with rows a multiple of 1 KiB apart they fell into a few of
// L1's sets and pushed each other out: `qkv bench train` spent 21% of its
// time in the transposed tiles, against 34% in all the others. Rows
// [i0, i1) of op(A) at step s.
void pack_a(const GemmArgs& g, int64_t i0, int64_t i1, const Step& s, float* out) {
  check_rows(Access::Read, g.a + s.p0 * g.lda + i0, s.depth, i1 - i0, g.lda);
  check_rows(Access::Write, out, 1, (i1 - i0 + kRows - 1) / kRows * kRows * s.depth, 0);
  int64_t i = i0;
#if defined(__AVX512F__)
  // A tile at a time, its steps written one after another. (A step at a
  // time across all the tiles, each store went to another tile 2 KiB or
  // more from the last, and the copy was a tenth of the float32 flash
  // backward at 1,024 tokens.)
  static_assert(kRows == 8, "a tile's step is one 256-bit vector");
  for (; i + kRows <= i1; i += kRows) {
    float* tile = out + (i - i0) * s.depth;
    const float* src = g.a + s.p0 * g.lda + i;
    for (int64_t p = 0; p < s.depth; ++p) _mm256_storeu_ps(tile + p * kRows, _mm256_loadu_ps(src + p * g.lda));
  }
#endif
  for (; i < i1; i += kRows)
    for (int64_t p = 0; p < s.depth; ++p) {
      const float* src = g.a + (s.p0 + p) * g.lda;
      for (int64_t r = 0; r < std::min<int64_t>(kRows, i1 - i); ++r)
        out[(i - i0) * s.depth + p * kRows + r] = src[i + r];
    }
}

// Where a tile reads A, from its row i0 and step p0 on: value (r, p) at
// a[r * ld + p] for A as it lies; for A transposed (each step's values
// side by side) at a[p * ld + r], ld kRows in a packed tile or A^T's row
// stride where it lies (kInPlaceDepth).
struct Rows {
  const float* a;
  int64_t ld;
};

// C's rows [i0, i0 + R) x columns [j0, j0 + cols) from one panel, V vectors
// of it (cols <= V * kLanes), over one step of the reduction; after the last
// step, the epilogue.
// Under the sanitizers, every range it reads and writes is checked first
// (range_checked.h), not its loads one by one.
template <int R, int V, bool Packed>
[[gnu::noinline]] void tile(const GemmArgs& g, Rows rows, int64_t i0, const float* panel, int64_t j0, int64_t cols,
                            const Step& s) {
  if (s.depth > 0) {
    check_rows(Access::Read, panel, 1, (s.depth - 1) * kCols + V * kLanes, 0);
    if (Packed)
      check_rows(Access::Read, rows.a, s.depth, R, rows.ld);
    else
      check_rows(Access::Read, rows.a, R, s.depth, rows.ld);
  }
  if (!s.first) check_rows(Access::Read, s.sums + i0 * s.ld_sums + j0, R, cols, s.ld_sums);
  if (!s.last) check_rows(Access::Write, s.sums + i0 * s.ld_sums + j0, R, cols, s.ld_sums);
  if (s.last) {
    if (g.beta != 0.0f) check_rows(Access::Read, g.c + i0 * g.ldc + j0, R, cols, g.ldc);
    check_rows(Access::Write, g.c + i0 * g.ldc + j0, R, cols, g.ldc);
    if (g.act_out) check_rows(Access::Write, g.act_out + i0 * g.ld_act + j0, R, cols, g.ld_act);
    if (g.bias) check_rows(Access::Read, g.bias + j0, 1, cols, 0);
    if (g.addend) check_rows(Access::Read, g.addend + i0 * g.ld_addend + j0, R, cols, g.ld_addend);
  }
  Vec acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = vzero();
  if (!s.first)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[r][v] =
            vload_first(s.sums + (i0 + r) * s.ld_sums + j0 + v * kLanes, std::min<int64_t>(kLanes, cols - v * kLanes));
  // The addend's part of this tile, asked for now so that it is in L1 when
  // the epilogue reads it after the last step.
  if (s.last && g.addend)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(g.addend + (i0 + r) * g.ld_addend + j0 + v * kLanes), _MM_HINT_T0);
  // A's R values of step p: side by side in a packed tile, one per row of A
  // otherwise.
  const float* a = rows.a;
  const int64_t row_step = Packed ? 1 : rows.ld, p_step = Packed ? rows.ld : 1;
#pragma GCC unroll 4
  for (int64_t p = 0; p < s.depth; ++p) {
    Vec b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) b[v] = vload(panel + p * kCols + v * kLanes);
    const float* ap = a + p * p_step;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec x = vset(ap[r * row_step]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = vfma(x, b[v], acc[r][v]);
    }
  }
  if (!s.last) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        vstore_first(s.sums + (i0 + r) * s.ld_sums + j0 + v * kLanes, acc[r][v],
                     std::min<int64_t>(kLanes, cols - v * kLanes));
    return;
  }
  const Vec alpha = vset(g.alpha), beta = vset(g.beta);
  // GELU on the tile in registers (the same operations as unary_forward's,
  // so the same bits); other activations through unary_forward, a row at a
  // time. Called for each row of 48 values, unary_forward's calls were about
  // a third of GELU's time (ViT inference, where GELU was 6% of the time:
  // +2% without them).
  const bool gelu = g.act_out && g.act == UnaryOp::Gelu;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* c = g.c + (i0 + r) * g.ldc + j0;
    float* act = g.act_out ? g.act_out + (i0 + r) * g.ld_act + j0 : nullptr;
    const float* addend = g.addend ? g.addend + (i0 + r) * g.ld_addend + j0 : nullptr;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const int64_t n = std::min<int64_t>(kLanes, cols - v * kLanes);
      Vec y = vmul(acc[r][v], alpha);
      if (g.beta != 0.0f) y = vfma(beta, vload_first(c + v * kLanes, n), y);  // beta 0 ignores C, NaN included
      if (g.bias) y = vadd(y, vload_first(g.bias + j0 + v * kLanes, n));
      if (addend) y = vadd(y, vload_first(addend + v * kLanes, n));
      vstore_first(c + v * kLanes, y, n);
      if (gelu) vstore_first(act + v * kLanes, gelu_exact(y), n);
    }
    if (act && !gelu) unary_forward(g.act, c, act, cols);
  }
}

// The tile for a panel's 1 to kCols columns.
template <int R, bool Packed>
void tile_cols(const GemmArgs& g, Rows rows, int64_t i0, const float* panel, int64_t j0, int64_t cols, const Step& s) {
  const int64_t vecs = (cols + kLanes - 1) / kLanes;
  if constexpr (kVecs == 3)
    if (vecs == 2) return tile<R, 2, Packed>(g, rows, i0, panel, j0, cols, s);
  if (vecs == 1) return tile<R, 1, Packed>(g, rows, i0, panel, j0, cols, s);
  tile<R, kVecs, Packed>(g, rows, i0, panel, j0, cols, s);
}

// The tile for the last 1 to kRows rows.
template <int R = kRows>
void tile_rows(const GemmArgs& g, Rows a, int64_t i0, int64_t rows, const float* panel, int64_t j0, int64_t cols,
               const Step& s) {
  if constexpr (R > 1)
    if (rows < R) return tile_rows<R - 1>(g, a, i0, rows, panel, j0, cols, s);
  if (g.trans_a) return tile_cols<R, true>(g, a, i0, panel, j0, cols, s);
  tile_cols<R, false>(g, a, i0, panel, j0, cols, s);
}

static_assert(kPanelWork == 1 << 18, "panels_path names it");
#if defined(__AVX512F__)
static_assert(kRows == 8 && kCols == 48 && kDepth == 128, "panels_path names them");
#else
static_assert(kRows == 6 && kCols == 16 && kDepth == 128, "panels_path names them");
#endif

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

const char* panels_path() {
#if defined(__AVX512F__)
  return "own panels: 8 x 48 register tiles of 16 lanes, k in steps of 128, bias, residual and activation fused; "
         "BLAS below 2^18 multiply-adds";
#else
  return "own panels: 6 x 16 register tiles of 8 lanes, k in steps of 128, bias, residual and activation fused; "
         "BLAS below 2^18 multiply-adds";
#endif
}

namespace {

// The blocking of one product, and the buffers its steps share: the sums
// between steps (own_sums: C's old values are still to be added after the
// last step) and A's packed tiles (A transposed).
struct Plan {
  int64_t depth, block_rows;
  bool own_sums;
  Scratch held, a_tiles;
  explicit Plan(const GemmArgs& g)
      : depth(std::max<int64_t>(1, std::min(g.k, kDepth))),
        block_rows(std::max<int64_t>(kRows, kRowBlockBytes / (4 * depth) / kRows * kRows)),
        own_sums(g.k > depth && g.beta != 0.0f) {
    if (own_sums) held.take(g.m * g.n);
    if (packs_a(g)) a_tiles.take(round_up(std::min(block_rows, g.m), kRows) * depth);
  }
  static bool packs_a(const GemmArgs& g) { return g.trans_a && g.k > kInPlaceDepth; }
  Step step(const GemmArgs& g, int64_t p0) const {
    Step s;
    s.p0 = p0, s.depth = std::min(depth, g.k - p0), s.first = p0 == 0, s.last = p0 + s.depth >= g.k;
    s.sums = own_sums ? held.data() : g.c, s.ld_sums = own_sums ? g.n : g.ldc;
    return s;
  }
};

// C's columns [jc, jc + cols) over the reduction's rows [pc, pe) (at least
// one step, also with k 0: C = beta C + bias), B's panels for them packed
// at `packed`, step p0's from (p0 - pc) * padded: each block of A's rows
// goes through the whole part, a step at a time, before the next block.
void sweep(const GemmArgs& g, const Plan& plan, const float* packed, int64_t padded, int64_t jc, int64_t cols,
           int64_t pc, int64_t pe) {
  const bool packed_a = Plan::packs_a(g);
  for (int64_t ic = 0; ic < g.m; ic += plan.block_rows) {
    const int64_t ie = std::min(g.m, ic + plan.block_rows);
    int64_t p0 = pc;
    do {
      const Step s = plan.step(g, p0);
      const float* panels = packed + (p0 - pc) * padded;
      if (packed_a) pack_a(g, ic, ie, s, plan.a_tiles.data());
      for (int64_t q = 0; q < cols; q += kCols)
        for (int64_t i = ic; i < ie; i += kRows) {
          const Rows a = !g.trans_a ? Rows{g.a + i * g.lda + s.p0, g.lda}
                         : packed_a ? Rows{plan.a_tiles.data() + (i - ic) * s.depth, kRows}
                                    : Rows{g.a + s.p0 * g.lda + i, g.lda};
          tile_rows(g, a, i, std::min<int64_t>(kRows, ie - i), panels + q * s.depth, jc + q, std::min(kCols, cols - q),
                    s);
        }
      p0 += s.depth;
    } while (p0 < pe);
  }
}

}  // namespace

void gemm_panels(const GemmArgs& g) {
  const Plan plan(g);
  const int64_t k = g.k, depth = plan.depth;
  // B is packed kPackDepth of its rows by block_cols of its columns at a
  // time; each block of A's rows then goes through that part of the
  // reduction, a step of kDepth at a time, before the next block, so the sums
  // waiting between steps stay in L2 with the packed panels, and A is read
  // once per block of columns (a long k, such as a vocabulary projection's
  // gradient, no longer shrinks the blocks of columns).
  const int64_t pack_depth = std::max<int64_t>(1, std::min(k, kPackDepth));
  const int64_t block_cols = std::max(kCols, kPackBytes / (4 * pack_depth * kCols) * kCols);
  const int64_t padded = std::min(block_cols, round_up(g.n, kCols));
  // Small products pack B on the stack: the allocator's lock would cost more
  // than their products.
  alignas(64) float local[kLocalFloats];
  Scratch heap;
  float* const packed = padded * pack_depth <= kLocalFloats ? local : heap.take(padded * pack_depth);
  for (int64_t jc = 0; jc < g.n; jc += block_cols) {
    const int64_t cols = std::min(block_cols, g.n - jc);
    int64_t pc = 0;
    do {  // once at least: with k 0, C = beta C + bias
      const int64_t pe = std::min(k, pc + pack_depth);
      // Step p0's panels start at (p0 - pc) * padded.
      for (int64_t p0 = pc; p0 < pe; p0 += depth) pack_b(g, jc, cols, plan.step(g, p0), packed + (p0 - pc) * padded);
      sweep(g, plan, packed, padded, jc, cols, pc, pe);
      pc = pe;
    } while (pc < k);
  }
}

int64_t panels_b_floats(int64_t n, int64_t k) {
  return round_up(std::max<int64_t>(n, 1), kCols) * std::max<int64_t>(k, 1);
}

void panels_pack_b(const GemmArgs& g, float* out) {
  const Plan plan(g);
  const int64_t padded = round_up(std::max<int64_t>(g.n, 1), kCols);
  for (int64_t p0 = 0; p0 < std::max<int64_t>(g.k, 1); p0 += plan.depth)
    pack_b(g, 0, g.n, plan.step(g, p0), out + p0 * padded);
}

void gemm_panels_packed_b(const GemmArgs& g, const float* packed_b) {
  const Plan plan(g);
  sweep(g, plan, packed_b, round_up(std::max<int64_t>(g.n, 1), kCols), 0, g.n, 0, g.k);
}
#endif
}  // namespace qkv::cpu::QKV_CPU_NS
