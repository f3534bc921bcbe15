// Flash attention on the CPU: tiles of kFlashQueryTile queries x kFlashKeyTile
// keys, QK^T and PV as small GEMMs (gemm's panels for full tiles; a short
// sequence's small ones in registers here on the avx512 level, OpenBLAS on
// the others; one thread per tile task), an
// online softmax per query row, and a backward that recomputes each tile's
// probabilities from the saved row log-sum-exp. Scratch memory per thread is
// one tile of scores and one of probabilities' gradients, plus O(T) row
// statistics: no T x S buffer anywhere.
//
// Forward, for a query row with running max m, running sum l, accumulator o:
//   s_j = scale q.k_j;  m' = max(m, max_j s_j);  p_j = exp(s_j - m')
//   l = l e^{m - m'} + sum_j p_j;  o = o e^{m - m'} + sum_j p_j v_j;  m = m'
//   out = o / l,  lse = m + log l
// Backward, with P = exp(S - lse) recomputed and D_i = dout_i . out_i:
//   dV += P^T dO;  dP = dO V^T;  dS = P (dP - D);  dQ += scale dS K;  dK += scale dS^T Q
#include "src/kernels/cpu/flash_attention.h"
#include "src/kernels/cpu/scratch.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "qkv/allocator.h"
#include "src/kernels/cpu/gemm_bf16_packed.h"
#include "src/kernels/cpu/gemm_panels.h"
#include "src/kernels/cpu/simd.h"
#include "src/kernels/cpu/vec_math.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {
namespace {

constexpr int64_t Br = kFlashQueryTile;
constexpr int64_t Bc = kFlashKeyTile;
// Below this many multiply-adds a tile's product is a short sequence's (the
// panels of gemm take the longer ones).
[[maybe_unused]] constexpr int64_t kSmallTile = 1 << 18;  // read by the AVX-512 level alone

// Keys [0, visible_keys(i)) are visible to query row i.
int64_t visible_keys(const FlashShape& f, int64_t b, int64_t i) {
  int64_t hi = f.s;
  if (f.key_lengths) hi = std::clamp<int64_t>(f.key_lengths[b], 0, f.s);
  if (f.causal) hi = std::min(hi, i + f.s - f.t + 1);
  return std::max<int64_t>(hi, 0);
}

// A layout with its zero strides replaced by the contiguous [B, heads, rows, D] ones.
FlashLayout resolved(FlashLayout l, int64_t heads, int64_t rows, int64_t d) {
  if (l.row == 0) l.row = d;
  if (l.head == 0) l.head = rows * l.row;
  if (l.batch == 0) l.batch = heads * l.head;
  return l;
}

struct Layouts {
  FlashLayout q, k, v, o;
  explicit Layouts(const FlashShape& f)
      : q(resolved(f.q, f.heads, f.t, f.dh)),
        k(resolved(f.k, f.kv_heads, f.s, f.dh)),
        v(resolved(f.v, f.kv_heads, f.s, f.dv)),
        o(resolved(f.o, f.heads, f.t, f.dv)) {}
};

// The first row of head h of batch b.
inline int64_t at(const FlashLayout& l, int64_t b, int64_t h) { return b * l.batch + h * l.head; }

// The first key (value) row of key/value head h of batch b: in x, or in the
// batch's own buffer (FlashShape::k_batches).
inline const float* kv_rows(const float* x, const float* const* batches, const FlashLayout& l, int64_t b, int64_t h) {
  return batches ? batches[b] + h * l.head : x + at(l, b, h);
}

// Tasks a thread takes at a time from a loop of `tasks` (schedule(dynamic)):
// about eight grabs a thread, so the tail still balances, and no more. A
// ViT's 512 heads of 16 tokens taken one at a time spent 7% of the
// attention's time in libgomp's shared counter (a locked add whose cache
// line both cores kept taking from each other).
inline int64_t tasks_per_grab(int64_t tasks) {
  return std::clamp<int64_t>(tasks / (8 * std::max(1, omp_get_max_threads())), 1, 64);
}

// One query row against `cols` keys (decoding: a tile of one row): s_j =
// scale q.k_j, and o += sum_j p_j v_j. For one row these beat a GEMM call,
// whose fixed costs (and BLAS's, for p V) outweighed the products.
//
// On the avx512 level, for Dh a multiple of 16 up to 128: q in registers,
// 16 keys at a time, each key's products in a vector of its own, the 16
// summed across their lanes together (lane_sums16); and o in registers over
// all the keys, 64 of its floats at a time. As plain loops (a dot per key,
// its 16 lanes then summed one after another; o loaded and stored for every
// key) this took 11% of greedy translation's time on Zen 4, for under 2%
// of its multiply-adds.
void row_scores_plain(const float* q, const float* k, int64_t ldk, int64_t cols, int64_t dh, float scale, float* s) {
  for (int64_t j = 0; j < cols; ++j) {
    const float* kj = k + j * ldk;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < dh; ++d) dot += q[d] * kj[d];
    s[j] = scale * dot;
  }
}
#if defined(__AVX512F__)
template <int Chunks>  // Dh / 16
void row_scores_lanes(const float* q, const float* k, int64_t ldk, int64_t cols, float scale, float* s) {
  __m512 qv[Chunks];
  for (int c = 0; c < Chunks; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  for (int64_t j0 = 0; j0 < cols; j0 += 16) {
    const int64_t n = std::min<int64_t>(16, cols - j0);
    __m512 dots[16];  // past n: the last key's dot again, not stored (no branch, so the 16 stay in registers)
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) {
      const float* kj = k + (j0 + std::min<int64_t>(t, n - 1)) * ldk;
      dots[t] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
      for (int c = 1; c < Chunks; ++c) dots[t] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kj + 16 * c), dots[t]);
    }
    _mm512_mask_storeu_ps(s + j0, lanes_of(n), _mm512_mul_ps(_mm512_set1_ps(scale), lane_sums16(dots)));
  }
}
#endif
void row_scores(const float* q, const float* k, int64_t ldk, int64_t cols, int64_t dh, float scale, float* s) {
#if defined(__AVX512F__)
  switch (dh) {
    case 16: return row_scores_lanes<1>(q, k, ldk, cols, scale, s);
    case 32: return row_scores_lanes<2>(q, k, ldk, cols, scale, s);
    case 48: return row_scores_lanes<3>(q, k, ldk, cols, scale, s);
    case 64: return row_scores_lanes<4>(q, k, ldk, cols, scale, s);
    case 80: return row_scores_lanes<5>(q, k, ldk, cols, scale, s);
    case 96: return row_scores_lanes<6>(q, k, ldk, cols, scale, s);
    case 112: return row_scores_lanes<7>(q, k, ldk, cols, scale, s);
    case 128: return row_scores_lanes<8>(q, k, ldk, cols, scale, s);
    default: break;
  }
#endif
  row_scores_plain(q, k, ldk, cols, dh, scale, s);
}
void row_values(const float* p, const float* v, int64_t ldv, int64_t cols, int64_t dv, float* o) {
#if defined(__AVX512F__)
  // o[d] + (p_0 v_0[d] + p_2 v_2[d] + ...) + (p_1 v_1[d] + p_3 v_3[d] + ...):
  // the even and the odd keys in accumulators of their own, so that two
  // keys' FMAs are in flight where one chain would wait on each result.
  for (int64_t d0 = 0; d0 < dv; d0 += 64) {
    __mmask16 in[4];
    __m512 even[4], odd[4];
    for (int i = 0; i < 4; ++i) {
      in[i] = lanes_of(dv - d0 - 16 * i);
      even[i] = _mm512_maskz_loadu_ps(in[i], o + d0 + 16 * i), odd[i] = _mm512_setzero_ps();
    }
    int64_t j = 0;
    for (; j + 1 < cols; j += 2) {
      const __m512 pe = _mm512_set1_ps(p[j]), po = _mm512_set1_ps(p[j + 1]);
      const float* ve = v + j * ldv + d0;
      const float* vo = ve + ldv;
      for (int i = 0; i < 4; ++i) {
        even[i] = _mm512_fmadd_ps(pe, _mm512_maskz_loadu_ps(in[i], ve + 16 * i), even[i]);
        odd[i] = _mm512_fmadd_ps(po, _mm512_maskz_loadu_ps(in[i], vo + 16 * i), odd[i]);
      }
    }
    if (j < cols) {
      const __m512 pe = _mm512_set1_ps(p[j]);
      for (int i = 0; i < 4; ++i)
        even[i] = _mm512_fmadd_ps(pe, _mm512_maskz_loadu_ps(in[i], v + j * ldv + d0 + 16 * i), even[i]);
    }
    for (int i = 0; i < 4; ++i) _mm512_mask_storeu_ps(o + d0 + 16 * i, in[i], _mm512_add_ps(even[i], odd[i]));
  }
#else
  for (int64_t j = 0; j < cols; ++j) {
    const float pj = p[j];
    const float* vj = v + j * ldv;
#pragma omp simd
    for (int64_t d = 0; d < dv; ++d) o[d] += pj * vj[d];
  }
#endif
}

#if defined(__AVX512F__)
// The tiles' float32 products of short sequences (a ViT's 16 patches: 16 x
// 16 x 32), in registers. Through gemm they went to OpenBLAS's small-matrix
// kernels, whose fixed costs per call took about 8% of a ViT training step
// for 0.6% of its multiply-adds. R rows of C at a time, its up to kTinyCols
// columns in V 16-lane accumulators each; step p broadcasts A's R values and
// reads row p of op(B) as vectors: B itself, or, when B is given transposed,
// its transpose made on the stack 16 x 16 at a time in registers (a scalar
// transpose there cost as much as the OpenBLAS calls it replaced).
constexpr int64_t kTinyCols = 64, kTinyFloats = 4096;

// out [k][ldo] = B^T for B [n, k] (row stride ldb); ldo a multiple of 16.
// Columns past n are left as they were (the tiles read them masked off). A
// last block of at most kFewColumns columns (the class token of a ViT's 17
// tokens) is copied one float at a time: a whole 16 x 16 transpose for it
// cost as much as one for 16 columns.
constexpr int64_t kFewColumns = 4;
void transpose_b(const float* b, int64_t ldb, int64_t n, int64_t k, float* out, int64_t ldo) {
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    if (n - j0 <= kFewColumns) {
      for (int64_t j = j0; j < n; ++j)
        for (int64_t p = 0; p < k; ++p) out[p * ldo + j] = b[j * ldb + p];
      break;
    }
    for (int64_t p0 = 0; p0 < k; p0 += 16)
      transpose_block16(b + j0 * ldb + p0, ldb, n - j0, k - p0, out + p0 * ldo + j0, ldo);
  }
}

template <int R, int V>
void tiny_tile(int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_p, const float* b,
               int64_t ldb, float beta, float* c, int64_t ldc) {
  __m512 acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  __mmask16 mask[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) mask[v] = lanes_of(n - 16 * v);
  for (int64_t p = 0; p < k; ++p) {
    __m512 bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) bv[v] = _mm512_maskz_loadu_ps(mask[v], b + p * ldb + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * a_row + p * a_p]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      float* out = c + r * ldc + 16 * v;
      __m512 y = _mm512_mul_ps(acc[r][v], va);
      if (beta != 0.0f) y = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[v], out), y);  // beta 0 ignores C
      _mm512_mask_storeu_ps(out, mask[v], y);
    }
}

// The most rows of C a tile of V vectors a row takes: its R x V
// accumulators, V vectors of B and a broadcast of A within avx512's 32
// registers.
template <int V>
constexpr int kTinyRows = V == 1   ? 12
                          : V == 2 ? 9
                          : V == 3 ? 6
                                   : 5;

// tiny_tile for r rows, 1 <= r <= R.
template <int V, int R = kTinyRows<V>>
void tiny_tile_of(int64_t r, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_p,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if constexpr (R > 1)
    if (r < R) return tiny_tile_of<V, R - 1>(r, n, k, alpha, a, a_row, a_p, b, ldb, beta, c, ldc);
  tiny_tile<R, V>(n, k, alpha, a, a_row, a_p, b, ldb, beta, c, ldc);
}

// C's m rows in as few tiles as kTinyRows allows, of balanced heights: a
// sequence of 17 (16 patches and the class token) as 9 + 8 rows. Tiles of
// at most 4 rows made it 4 + 4 + 4 + 4 + 1, each with its fixed costs, the
// last a single chain of dependent FMAs.
template <int V>
void tiny_rows(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_p, const float* b,
               int64_t ldb, float beta, float* c, int64_t ldc) {
  const int64_t tiles = (m + kTinyRows<V> - 1) / kTinyRows<V>;
  for (int64_t t = 0, i = 0; t < tiles; ++t) {
    const int64_t r = (m - i + (tiles - t) - 1) / (tiles - t);
    tiny_tile_of<V>(r, n, k, alpha, a + i * a_row, a_row, a_p, b, ldb, beta, c + i * ldc, ldc);
    i += r;
  }
}
#endif

// C[m,n] (+)= alpha * op(A) op(B) on raw row-major pointers, in float32.
void small_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#if defined(__AVX512F__)
  const int64_t ldt = (n + 15) / 16 * 16;  // B^T's row stride
  if (n > 0 && n <= kTinyCols && m * n * k < kSmallTile && (!tb || k * ldt <= kTinyFloats)) {
    alignas(64) float transposed[kTinyFloats];
    if (tb) {
      transpose_b(b, ldb, n, k, transposed, ldt);
      b = transposed, ldb = ldt;
    }
    const int64_t a_row = ta ? 1 : lda, a_p = ta ? lda : 1;  // A(i, p) at a[i * a_row + p * a_p]
    switch (ldt / 16) {
      case 1: return tiny_rows<1>(m, n, k, alpha, a, a_row, a_p, b, ldb, beta, c, ldc);
      case 2: return tiny_rows<2>(m, n, k, alpha, a, a_row, a_p, b, ldb, beta, c, ldc);
      case 3: return tiny_rows<3>(m, n, k, alpha, a, a_row, a_p, b, ldb, beta, c, ldc);
      default: return tiny_rows<4>(m, n, k, alpha, a, a_row, a_p, b, ldb, beta, c, ldc);
    }
  }
#endif
  GemmArgs g;
  g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k, g.alpha = alpha;
  g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.beta = beta, g.c = c, g.ldc = ldc;
  gemm(g);
}

// op(B) of a float32 tile product: as it lies (b, ldb, trans), or, where
// `panel` is set, packed beforehand for gemm's panels (panels_pack_b).
struct TileB {
  const float* b = nullptr;
  int64_t ldb = 0;
  bool trans = false;
  const float* panel = nullptr;
};

// C[m, n] = alpha op(A) op(B) + beta C over depth k, in float32.
void tile_product(bool ta, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const TileB& b,
                  float beta, float* c, int64_t ldc) {
#ifdef QKV_HAVE_PANELS
  if (b.panel) {
    GemmArgs g;
    g.trans_a = ta, g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.a = a, g.lda = lda, g.beta = beta, g.c = c,
    g.ldc = ldc;
    return gemm_panels_packed_b(g, b.panel);
  }
#endif
  small_gemm(ta, b.trans, m, n, k, alpha, a, lda, b.b, b.ldb, beta, c, ldc);
}

// Float32 tile products of long sequences (a full tile's products as large
// as those gemm gives its panels) take the panels with their B packed once:
// in the forward each K/V head's key tiles, K for the scores and V for p V,
// before the tasks (every query tile of the head meets them); in the
// backward a key tile's K and V once for all the query tiles that pass it,
// and each query head's Q and dO tiles once for all the key tiles. Through
// gemm each product packed its B again: at 4,096 tokens a third of the
// samples were that packing (Intel Xeon, family 6 model 207).
bool on_panels(const FlashShape& f) {
#ifdef QKV_HAVE_PANELS
  return f.t > 1 && std::min(f.t, Br) * std::min(f.s, Bc) * std::min(f.dh, f.dv) >= kPanelWork;
#else
  return false;
#endif
}

// Packs op(B) [k, n], stored as b (row stride ldb; [n, k] when trans), for tile_product.
void pack_panel(float* out, const float* b, int64_t ldb, bool trans, int64_t n, int64_t k) {
#ifdef QKV_HAVE_PANELS
  GemmArgs g;
  g.b = b, g.ldb = ldb, g.trans_b = trans, g.n = n, g.k = k;
  panels_pack_b(g, out);
#endif
}

// Floats of a packed op(B) [k, n] (0 without the panels).
int64_t panel_floats(int64_t n, int64_t k) {
#ifdef QKV_HAVE_PANELS
  return panels_b_floats(n, k);
#else
  return 0;
#endif
}

// The bfloat16 kernels' operands packed once for gemm_bf16's kernels (AMX or
// AVX512-BF16: the avx512 level, where the CPU has either), where small_gemm
// would pack both operands of every tile product again: the forward packs
// each K/V head's K and V^T once per call (bfloat16 copies, O(S D) words in
// all) and each query tile's Q once; the backward packs its K/V head's K,
// K^T and V, and each query head's Q, Q^T, dO and dO^T, once per head. Only
// the tiles made on the way (P, dS and their transposes) are packed per tile.
//
// A packed operand, `rows` by `depth` (its k), as A or as B: a slice of its
// rows from r0 (a multiple of 16), or of its depth from k0 (a multiple of 32).
struct Packed {
  uint32_t* words = nullptr;
  int64_t rows = 0, depth = 0;
  int64_t stride() const { return bf16_chunks(depth) * 256; }
  const uint32_t* rows_from(int64_t r0) const { return words + r0 / 16 * stride(); }
  const uint32_t* depth_from(int64_t k0) const { return words + k0 / 32 * 256; }
};

// Words for packed operands, from the caching allocator.
class PackBuffer {
public:
  explicit PackBuffer(int64_t words) : scratch_(words) {}
  // The next `rows` x `depth` operand's place.
  Packed take(int64_t rows, int64_t depth) {
    Packed p{reinterpret_cast<uint32_t*>(scratch_.data()) + used_, rows, depth};
    used_ += bf16_packed_words(rows, depth);
    return p;
  }

private:
  Scratch scratch_;
  int64_t used_ = 0;
};

// x as operand A (rows x depth) or B (its rows are C's columns): x holds it
// row by row (row stride ld), or, when `transposed`, depth by depth (x is
// [depth, rows]).
void pack_a(const Packed& p, const float* x, int64_t ld, bool transposed) {
  GemmBf16Args g;
  g.m = p.rows, g.n = 1, g.k = p.depth, g.a_f32 = x, g.lda = ld, g.a_transposed = transposed;
  pack_bf16_a(g, p.words);
}
void pack_b(const Packed& p, const float* x, int64_t ld, bool transposed) {
  GemmBf16Args g;
  g.m = 1, g.n = p.rows, g.k = p.depth, g.b_f32 = x, g.ldb = ld, g.b_transposed = transposed;
  pack_bf16_b(g, p.words);
}

// C[m, n] = alpha A B^T + beta C over depth k, A and B given as slices (a
// pointer into a packed operand and that operand's stride).
void packed_product(int64_t m, int64_t n, int64_t k, float alpha, const uint32_t* a, int64_t a_stride,
                    const uint32_t* b, int64_t b_stride, float beta, float* c, int64_t ldc) {
  GemmBf16Args g;
  g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = beta, g.c = c, g.ldc = ldc;
  gemm_bf16_packed(g, {.kb = bf16_chunks(k), .nb = bf16_blocks(n), .a = a, .a_stride = a_stride, .b = b,
                       .b_stride = b_stride});
}

// How the tile products multiply. With f.bf16: Packed where the CPU
// multiplies bfloat16 and the sequences are long enough for packing to pay
// (from one full key tile, 128, of queries and of keys: shorter ones ran
// slower than float32, 1.8x at 32 tokens on Zen 4); otherwise Rounded:
// float32 GEMMs on operands rounded to bfloat16 (copies of q, k, v and dout
// once per call, P and dS per tile), which is gemm_bf16's arithmetic, since a
// product of two bfloat16 values is exact in float32.
enum class Products { F32, Rounded, Packed };

Products products_of(const FlashShape& f) {
  if (!f.bf16) return Products::F32;
  return bf16_packed_usable() && f.t >= kFlashKeyTile && f.s >= kFlashKeyTile ? Products::Packed : Products::Rounded;
}

// x[0, n) rounded to bfloat16, into out (which may be x): a tile's row.
inline void round_row(const float* x, int64_t n, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = round_to_bf16(x[i]);
}

// The same for a whole operand, split between threads when it is large.
void round_all(const float* x, int64_t n, float* out) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1 && !omp_in_parallel())
  for (int64_t c = 0; c < chunks; ++c) round_row(x + c * kChunk, std::min(kChunk, n - c * kChunk), out + c * kChunk);
}

// A rounded copy of an operand, in its own layout: as long as the span its
// rows reach from the first (so any index into x reads the copy the same
// way), with its rows' elements rounded and nothing else. When the rows do
// not tile that span (q, k and v side by side on each row of a packed
// projection: each spans all three), they are rounded row by row, so each
// operand rounds its own third only. The bf16 ViT (16 tokens, so these
// copies, not the packed tiles) spent 12% of its training samples in
// round_all; `qkv bench vit --precision bf16`, three alternating runs:
// inference 14,906-15,397 -> 17,047-17,264 images/s, training unchanged
// within noise (3,364-3,446 against 3,377-3,464; Xeon model 167, 2026-12-05).
// (Since then the op leaves sequences under 128 tokens in float32 under
// autocast, src/ops/attention.cpp, so the ViT no longer comes here.)
class RoundedCopy {
public:
  RoundedCopy(const float* x, const FlashLayout& l, int64_t batch, int64_t heads, int64_t rows, int64_t d)
      : n_(batch * heads * rows == 0 ? 0 : (batch - 1) * l.batch + (heads - 1) * l.head + (rows - 1) * l.row + d),
        data_(n_) {
    float* out = data_.data();
    if (n_ == batch * heads * rows * d) {  // the rows tile the span
      round_all(x, n_, out);
      return;
    }
#pragma omp parallel for collapse(2) schedule(static) if (n_ >= (1 << 16) && !omp_in_parallel())
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t at = b * l.batch + h * l.head + r * l.row;
          round_row(x + at, d, out + at);
        }
  }
  const float* data() const { return data_.data(); }

private:
  int64_t n_;
  Scratch data_;
};

#if defined(__AVX512F__)
// (Max, min, shuffles and permutes in their maskz forms, all lanes kept
// (simd.h's kAll): the plain ones make GCC 12 warn of an undefined source.)

// exp of 16 lanes, each as fast_exp computes it (vec_math.h), bit for bit.
// Written again in intrinsics: fast_exp under `omp simd` over a 16-float
// array, stored and loaded back, made the bf16 forward 10% slower (2,048
// tokens: 15.5-15.8 ms against 14.1-14.4 on the Intel Xeon, family 6 model 167).
inline __m512 exp16(__m512 x) {
  // Max and min return their second operand when either is NaN: x there, so
  // a NaN stays one (as in fast_exp), not a clamped -87.3.
  const __m512 c =
      _mm512_maskz_min_ps(kAll, _mm512_set1_ps(88.3f), _mm512_maskz_max_ps(kAll, _mm512_set1_ps(-87.3f), x));
  const __m512 big = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(c, _mm512_set1_ps(1.44269504088896341f), big), big);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  for (float coef : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(coef));
  const __m512i scale =
      _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvttps_epi32(kAll, _mm512_add_ps(n, _mm512_set1_ps(127.0f))), 23);
  // x < -87.3 (or -inf) gives 0; the unordered compare keeps a NaN's result.
  return _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ), p, _mm512_castsi512_ps(scale));
}

// Lanes [j, j + 16) of a row that are below `vis`.
inline __mmask16 visible_lanes(int64_t j, int64_t vis) {
  return vis - j >= 16 ? (__mmask16)0xffff : vis <= j ? (__mmask16)0 : (__mmask16)((1u << (vis - j)) - 1);
}

// The forward's softmax step for one row of a tile, at the avx512 level: with
// m' the row's new running max over its visible scores (keys j < vis),
// p_j = e^{s_j - m'}, zero past vis; the row's running sum, kept as 16
// partial sums in l16 (summed across lanes once, after the last key tile),
// is rescaled by alpha = e^{m - m'} and adds the p_j lane by lane. Two
// passes over s, each a few vector instructions per 16 scores: the max, then
// the rest. Taking a max and a sum across lanes per row and tile instead
// (scalar chains) set the pace of the bf16 forward on AMX.
//
// move_row_max: sets m = m' and returns alpha (1 when the max did not move:
// the row's accumulator then needs no rescaling).
inline float move_row_max(const float* s, int64_t vis, float& m) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < vis; j += 16)
    mx = _mm512_maskz_max_ps(kAll, mx, _mm512_mask_loadu_ps(mx, visible_lanes(j, vis), s + j));
  const float m_new = std::max(m, _mm512_cvtss_f32(max_lanes(mx)));
  const float alpha = m_new == m ? 1.0f : fast_exp(m - m_new);
  m = m_new;
  return alpha;
}

// e^{s_j - m} for lanes [j, j + 16), zero from vis on.
inline __m512 exp_visible(const float* s, int64_t j, int64_t vis, __m512 m) {
  const __mmask16 in = visible_lanes(j, vis);
  return _mm512_maskz_mov_ps(in, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, s + j), m)));
}

// The same, added to sum.
inline __m512 exp_lanes(const float* s, int64_t j, int64_t vis, __m512 m, __m512& sum) {
  const __m512 p = exp_visible(s, j, vis, m);
  sum = _mm512_add_ps(sum, p);
  return p;
}

// The row's running sum before this tile's terms: nothing on the first key
// tile (l16 is then written, not read: it starts as whatever memory held),
// else l16 rescaled by alpha.
inline __m512 running_sum(const float* l16, float alpha, bool first) {
  return first ? _mm512_setzero_ps() : _mm512_mul_ps(_mm512_loadu_ps(l16), _mm512_set1_ps(alpha));
}

// The step with float32 products (and Rounded ones, which round P after):
// p written over s[0, cols). Returns alpha; 1 for a row that sees no key of
// the tile (its p all zero).
inline float softmax_row_in_place(float* s, int64_t vis, int64_t cols, float& m, float* l16, bool first) {
  if (vis == 0) {
    if (first) _mm512_storeu_ps(l16, _mm512_setzero_ps());
    return std::fill(s, s + cols, 0.0f), 1.0f;
  }
  const float alpha = move_row_max(s, vis, m);
  __m512 sum = running_sum(l16, alpha, first);
  const __m512 shift = _mm512_set1_ps(m);
  for (int64_t j = 0; j < cols; j += 16)
    _mm512_mask_storeu_ps(s + j, visible_lanes(j, cols), exp_lanes(s, j, vis, shift, sum));
  _mm512_storeu_ps(l16, sum);
  return alpha;
}

// The step on the packed path: p rounded to bfloat16 (VCVTNE2PS2BF16)
// straight into the row's place in the packed P tile (p_row: 32 values per
// chunk of k side by side, chunks 256 words apart, zero to the end of the
// last chunk), instead of written as float32 and read back by pack_a.
__attribute__((target("avx512bf16"))) float softmax_row_into_packed(const float* s, int64_t vis, int64_t chunks,
                                                                    float& m, float* l16, bool first, uint32_t* p_row) {
  if (vis == 0) {
    if (first) _mm512_storeu_ps(l16, _mm512_setzero_ps());
    for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_si512(p_row + c * 256, _mm512_setzero_si512());
    return 1.0f;
  }
  const float alpha = move_row_max(s, vis, m);
  __m512 sum = running_sum(l16, alpha, first);
  const __m512 shift = _mm512_set1_ps(m);
  for (int64_t c = 0; c < chunks; ++c) {
    const __m512 lo = exp_lanes(s, c * 32, vis, shift, sum), hi = exp_lanes(s, c * 32 + 16, vis, shift, sum);
    _mm512_storeu_si512(p_row + c * 256, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
  _mm512_storeu_ps(l16, sum);
  return alpha;
}
#endif

// The backward's probabilities of one row of a tile, over its scores s:
// p_j = e^{s_j - lse} for the visible keys j < vis, zero on to cols.
inline void probabilities_in_place(float* s, int64_t vis, int64_t cols, float lse) {
#if defined(__AVX512F__)
  const __m512 shift = _mm512_set1_ps(lse);
  for (int64_t j = 0; j < cols; j += 16)
    _mm512_mask_storeu_ps(s + j, visible_lanes(j, cols), exp_visible(s, j, vis, shift));
#else
  for (int64_t j = 0; j < vis; ++j) s[j] = fast_exp(s[j] - lse);
  std::fill(s + vis, s + cols, 0.0f);
#endif
}

#if defined(__AVX512F__)
// A short sequence's (batch, head) in one pass (float32 products, 2 to 16
// queries, at most 16 keys, heads of at most 64 dims: a ViT of 16 patches,
// a short sentence). The scores are made transposed, S^T [keys][16 query
// lanes], in registers: the softmax then runs down the keys, a few vector
// instructions for all the rows at once, where the tile path takes its
// softmax a row at a time, each row's max across lanes (that softmax and the
// output took 31% of a 16-token head's forward, the products 68%). Every
// value gets the bits the tile path gives it (NaN payloads aside): each
// score is the same chain of FMAs over the head's dims, the max is exact,
// each row's sum adds its terms in lane_sums16's order, and p V is the same
// tiny_rows product.
constexpr int64_t kShortSeq = 16, kShortDims = 64;
static_assert(kShortSeq <= Br, "a short sequence is one query tile: its rows start at q0 = 0");
bool short_sequence(const FlashShape& f, Products mode) {
  return mode == Products::F32 && f.t >= 2 && f.t <= kShortSeq && f.s <= kShortSeq && f.dh <= kShortDims &&
         f.dv <= kShortDims;
}

// out [dh][16] = the first `rows` rows of x [rows, dh] (row stride ld)
// transposed, zero past them; out has room for dh rounded up to 16 rows.
// transpose_b does the same for the tile path, but stores only the rows out
// has (transpose_block16's loop of min(16, depth) stores, which GCC made a
// `rep movsq` here) and copies 4 columns or fewer one float at a time:
// called in its place, the 16-token forward of this file's short path took
// 754 us against 624 (best of 10 alternating runs, B 256, 4 heads, Dh 32,
// one thread, AMD EPYC Zen 4), 5 tokens 266 against 197.
inline void transpose_short(const float* x, int64_t ld, int64_t rows, int64_t dh, float* out) {
  for (int64_t d0 = 0; d0 < dh; d0 += 16) {
    const __mmask16 dims = lanes_of(dh - d0);
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(dims, x + i * ld + d0) : _mm512_setzero_ps();
    transpose16(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) _mm512_store_ps(out + (d0 + i) * 16, r[i]);
  }
}

// Query rows [0, rows) of head (b, h), whose last row sees C keys: rows of
// Q, K and V from q, k and v (row strides ldq, ldk, ldv), the output's rows
// to o (stride ldo), each row's log-sum-exp to lse (when given).
template <int C>
void short_head(const FlashShape& f, int64_t b, int64_t rows, const float* q, int64_t ldq, const float* k, int64_t ldk,
                const float* v, int64_t ldv, float* o, int64_t ldo, float* lse) {
  if constexpr (C == 0) {  // no row sees a key: zeros, as the tile path writes them
    for (int64_t r = 0; r < rows; ++r) {
      std::fill_n(o + r * ldo, f.dv, 0.0f);
      if (lse) lse[r] = -INFINITY;
    }
    return;
  }
  // Q^T and K^T [dh][16 lanes] (zero past rows and keys): step d of the
  // scores reads one vector of Q^T and broadcasts K's C values of dim d from
  // one place (read where they lie, each row of K through a pointer of its
  // own, they spilled).
  alignas(64) float qt[kShortDims * 16], kt[kShortDims * 16];
  transpose_short(q, ldq, rows, f.dh, qt);
  transpose_short(k, ldk, C, f.dh, kt);
  __m512 st[C > 0 ? C : 1];  // st[j]: key j's scores, lane i for query i
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) st[j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < f.dh; ++d) {
    const __m512 qd = _mm512_load_ps(qt + d * 16);
#pragma GCC unroll 16
    for (int j = 0; j < C; ++j) st[j] = _mm512_fmadd_ps(_mm512_set1_ps(kt[d * 16 + j]), qd, st[j]);
  }
  alignas(64) int32_t vis[16];  // the keys each row sees (none for lanes past rows)
  for (int64_t i = 0; i < 16; ++i) vis[i] = i < rows ? (int32_t)visible_keys(f, b, i) : 0;
  const __m512i visible = _mm512_load_si512(vis);
  const auto sees = [&](int j) { return _mm512_cmpgt_epi32_mask(visible, _mm512_set1_epi32(j)); };  // rows seeing key j
  __m512 m = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) {
    st[j] = _mm512_mul_ps(st[j], _mm512_set1_ps(f.scale));
    m = _mm512_mask_max_ps(m, sees(j), m, st[j]);
  }
  // p over the scores (st[j] becomes p_j), written out as P^T [keys][16
  // query lanes], and each row's sum as lane_sums16 adds its 16 lanes
  // (simd.h): four at a time, then the four quarters.
  alignas(64) float pt[16 * kShortSeq];
  const auto term = [&](int j) {
    if (j >= C) return _mm512_setzero_ps();
    st[j] = _mm512_maskz_mov_ps(sees(j), exp16(_mm512_sub_ps(st[j], m)));
    _mm512_store_ps(pt + j * 16, st[j]);
    return st[j];
  };
  __m512 quarter[4];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const __m512 p0 = term(4 * g), p1 = term(4 * g + 1), p2 = term(4 * g + 2), p3 = term(4 * g + 3);
    quarter[g] = _mm512_add_ps(_mm512_add_ps(p0, p2), _mm512_add_ps(p1, p3));
  }
  alignas(64) float l[16], row_max[16];
  _mm512_store_ps(l, _mm512_add_ps(_mm512_add_ps(quarter[0], quarter[1]), _mm512_add_ps(quarter[2], quarter[3])));
  _mm512_store_ps(row_max, m);
  // p V straight into the output's rows, then each row divided by its sum.
  switch ((f.dv + 15) / 16) {  // dv <= kShortDims: 1 to 4 vectors (0 with no dims)
    case 1: tiny_rows<1>(rows, f.dv, C, 1.0f, pt, 1, 16, v, ldv, 0.0f, o, ldo); break;
    case 2: tiny_rows<2>(rows, f.dv, C, 1.0f, pt, 1, 16, v, ldv, 0.0f, o, ldo); break;
    case 3: tiny_rows<3>(rows, f.dv, C, 1.0f, pt, 1, 16, v, ldv, 0.0f, o, ldo); break;
    case 4: tiny_rows<4>(rows, f.dv, C, 1.0f, pt, 1, 16, v, ldv, 0.0f, o, ldo); break;
  }
  static_assert(kShortDims <= 4 * 16, "tiny_rows takes at most 4 vectors a row");
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < f.dv; ++d) o[r * ldo + d] *= inv;
    if (lse) lse[r] = l[r] > 0 ? row_max[r] + std::log(l[r]) : -INFINITY;
  }
}

// short_head for the number of keys its last row sees, 0 <= keys <= C.
template <int C = kShortSeq>
void short_head_of(int64_t keys, const FlashShape& f, int64_t b, int64_t rows, const float* q, int64_t ldq,
                   const float* k, int64_t ldk, const float* v, int64_t ldv, float* o, int64_t ldo, float* lse) {
  if constexpr (C > 0)
    if (keys < C) return short_head_of<C - 1>(keys, f, b, rows, q, ldq, k, ldk, v, ldv, o, ldo, lse);
  short_head<C>(f, b, rows, q, ldq, k, ldk, v, ldv, o, ldo, lse);
}
#endif

void forward_tiles(const FlashShape& f, const float* q, const float* k, const float* v, float* out, float* lse,
                   Products mode) {
  const int64_t G = f.heads / f.kv_heads;
  const Layouts L(f);
  const int64_t q_tiles = (f.t + Br - 1) / Br;
  const int64_t tasks = f.batch * f.heads * q_tiles;
  const bool packed = mode == Products::Packed, rounded = mode == Products::Rounded;
#if defined(__AVX512F__)
  constexpr bool kLaneSums = true;                    // the softmax_row_ functions above
  const bool fused = packed && avx512_bf16_usable();  // softmax_row_into_packed
#else
  constexpr bool kLaneSums = false;
#endif
  // Packed: each K/V head's K [S, Dh] and V^T [Dv, S], once.
  const int64_t kv_heads = f.batch * f.kv_heads;
  PackBuffer head_words(packed ? kv_heads * (bf16_packed_words(f.s, f.dh) + bf16_packed_words(f.dv, f.s)) : 0);
  std::vector<Packed> Kp(packed ? kv_heads : 0), Vt(packed ? kv_heads : 0);
  for (int64_t bh = 0; bh < (int64_t)Kp.size(); ++bh) Kp[bh] = head_words.take(f.s, f.dh), Vt[bh] = head_words.take(f.dv, f.s);
#pragma omp parallel for schedule(static) if (packed && kv_heads > 1)
  for (int64_t bh = 0; bh < (int64_t)Kp.size(); ++bh) {
    const int64_t b = bh / f.kv_heads, hk = bh % f.kv_heads;
    pack_b(Kp[bh], kv_rows(k, f.k_batches, L.k, b, hk), L.k.row, false);
    pack_b(Vt[bh], kv_rows(v, f.v_batches, L.v, b, hk), L.v.row, true);
  }
  // On the panels: each K/V head's key tiles, K for the scores and V for p
  // V, once (panel_at). Every tile is packed with all the keys of it that
  // any query row of its batch sees (key_extent), and each query tile's
  // products take the whole tile: columns past what a causal query tile
  // sees get p = 0 from the softmax, as past a row's own last key.
  const bool panels = !packed && on_panels(f);
  const int64_t key_tiles = panels ? (f.s + Bc - 1) / Bc : 0;
  const int64_t k_floats = panel_floats(Bc, f.dh), tile_floats = k_floats + panel_floats(f.dv, Bc);
  Scratch key_panels;
  if (panels) key_panels.take(kv_heads * key_tiles * tile_floats);
  const auto key_extent = [&](int64_t b, int64_t k0) { return std::min(Bc, visible_keys(f, b, f.t - 1) - k0); };
  const auto panel_at = [&](int64_t bh_kv, int64_t k0) {
    return key_panels.data() + (bh_kv * key_tiles + k0 / Bc) * tile_floats;
  };
#pragma omp parallel for schedule(static) if (panels && kv_heads * key_tiles > 1)
  for (int64_t i = 0; i < kv_heads * key_tiles; ++i) {
    const int64_t bh = i / key_tiles, b = bh / f.kv_heads, hk = bh % f.kv_heads, k0 = i % key_tiles * Bc;
    const int64_t cols = key_extent(b, k0);
    if (cols <= 0) continue;
    float* at_tile = panel_at(bh, k0);
    pack_panel(at_tile, kv_rows(k, f.k_batches, L.k, b, hk) + k0 * L.k.row, L.k.row, true, cols, f.dh);
    pack_panel(at_tile + k_floats, kv_rows(v, f.v_batches, L.v, b, hk) + k0 * L.v.row, L.v.row, false, f.dv, cols);
  }
  const int64_t grab = tasks_per_grab(tasks);
#if defined(__AVX512F__)
  const bool short_seq = short_sequence(f, mode);
#endif
#pragma omp parallel if (tasks > 1)
  {
    Scratch scores(Br * Bc), acc(Br * f.dv), row_max(Br), row_sum(Br), row_sums16(kLaneSums ? Br * 16 : 1);
    float* S = scores.data();
    float* O = acc.data();
    float* m = row_max.data();
    float* l = row_sum.data();
    float* l16 = row_sums16.data();  // kLaneSums: each row's sum as 16 partial sums
    PackBuffer tile_words(packed ? bf16_packed_words(Br, f.dh) + bf16_packed_words(Br, Bc) : 0);
    const Packed Qp = packed ? tile_words.take(Br, f.dh) : Packed{}, Pp = packed ? tile_words.take(Br, Bc) : Packed{};
#pragma omp for schedule(dynamic, grab)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t qt = task % q_tiles, bh = task / q_tiles, b = bh / f.heads, h = bh % f.heads;
      const int64_t q0 = qt * Br, rows = std::min(Br, f.t - q0);
      const float* Q = q + at(L.q, b, h) + q0 * L.q.row;
      const float* K = kv_rows(k, f.k_batches, L.k, b, h / G);
      const float* V = kv_rows(v, f.v_batches, L.v, b, h / G);
      const int64_t tile_hi = visible_keys(f, b, q0 + rows - 1);  // rows see more keys further down
#if defined(__AVX512F__)
      if (short_seq) {
        short_head_of(tile_hi, f, b, rows, Q, L.q.row, K, L.k.row, V, L.v.row, out + at(L.o, b, h), L.o.row,
                      lse ? lse + bh * f.t : nullptr);
        continue;
      }
#endif
      std::fill(m, m + rows, -INFINITY);
      if (!kLaneSums) std::fill(l, l + rows, 0.0f);
      // The first key tile's p V overwrites O (beta 0, and no rescaling:
      // every row's alpha there is e^{-inf} = 0, or 1 for a row that sees
      // none of its keys, whose p are zeros), and its softmax writes l16; O
      // and l16 start as zeros only for rows that see no key at all.
      if (tile_hi == 0) {
        std::fill(O, O + rows * f.dv, 0.0f);
        if (kLaneSums) std::fill(l16, l16 + rows * 16, 0.0f);
      }
      const int64_t bh_kv = b * f.kv_heads + h / G;
      if (packed) pack_a({Qp.words, rows, f.dh}, Q, L.q.row, false);
      for (int64_t k0 = 0; k0 < tile_hi; k0 += Bc) {
        const int64_t cols = panels ? key_extent(b, k0) : std::min(Bc, tile_hi - k0);
        const bool first = k0 == 0;
        const float o_beta = first ? 0.0f : 1.0f;
        const TileB k_tile{K + k0 * L.k.row, L.k.row, true, panels ? panel_at(bh_kv, k0) : nullptr};
        const TileB v_tile{V + k0 * L.v.row, L.v.row, false, panels ? panel_at(bh_kv, k0) + k_floats : nullptr};
        if (packed)
          packed_product(rows, cols, f.dh, f.scale, Qp.words, Qp.stride(), Kp[bh_kv].rows_from(k0), Kp[bh_kv].stride(),
                         0.0f, S, Bc);
        else if (rows == 1)
          row_scores(Q, K + k0 * L.k.row, L.k.row, cols, f.dh, f.scale, S);
        else
          tile_product(false, rows, cols, f.dh, f.scale, Q, L.q.row, k_tile, 0.0f, S, Bc);
#if defined(__AVX512F__)
        if (fused) {
          const Packed P{Pp.words, rows, cols};
          const int64_t chunks = bf16_chunks(cols);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t vis = std::clamp<int64_t>(visible_keys(f, b, q0 + r) - k0, 0, cols);
            const float alpha = softmax_row_into_packed(S + r * Bc, vis, chunks, m[r], l16 + r * 16, first,
                                                        P.words + r / 16 * P.stride() + r % 16 * 16);
            if (alpha == 1.0f || first) continue;
            float* o = O + r * f.dv;
            for (int64_t d = 0; d < f.dv; ++d) o[d] *= alpha;
          }
          for (int64_t r = rows; r < bf16_blocks(rows) * 16; ++r)  // zero padding rows, as pack_a writes them
            for (int64_t c = 0; c < chunks; ++c)
              std::fill_n(P.words + r / 16 * P.stride() + c * 256 + r % 16 * 16, 16, 0u);
          packed_product(rows, f.dv, cols, 1.0f, P.words, P.stride(), Vt[bh_kv].depth_from(k0), Vt[bh_kv].stride(),
                         o_beta, O, f.dv);
          continue;
        }
#endif
        for (int64_t r = 0; r < rows; ++r) {
          float* s = S + r * Bc;
          const int64_t vis = std::clamp<int64_t>(visible_keys(f, b, q0 + r) - k0, 0, cols);
#if defined(__AVX512F__)
          const float alpha = softmax_row_in_place(s, vis, cols, m[r], l16 + r * 16, first);
          if (alpha == 1.0f || first) continue;
#else
          const float mx = max_of(s, vis);
          std::fill(s + vis, s + cols, 0.0f);
          if (vis == 0) continue;
          const float m_new = std::max(m[r], mx);
          const float alpha = fast_exp(m[r] - m_new);
          float sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < vis; ++j) {
            s[j] = fast_exp(s[j] - m_new);
            sum += s[j];
          }
          l[r] = l[r] * alpha + sum;
          m[r] = m_new;
          if (first) continue;
#endif
          float* o = O + r * f.dv;
          for (int64_t d = 0; d < f.dv; ++d) o[d] *= alpha;
        }
        if (packed) {
          const Packed P{Pp.words, rows, cols};
          pack_a(P, S, Bc, false);
          packed_product(rows, f.dv, cols, 1.0f, P.words, P.stride(), Vt[bh_kv].depth_from(k0), Vt[bh_kv].stride(),
                         o_beta, O, f.dv);
        } else {
          if (rounded)
            for (int64_t r = 0; r < rows; ++r) round_row(S + r * Bc, cols, S + r * Bc);  // after l summed them
          if (rows == 1) {
            if (first) std::fill(O, O + f.dv, 0.0f);
            row_values(S, V + k0 * L.v.row, L.v.row, cols, f.dv, O);
          } else {
            tile_product(false, rows, f.dv, cols, 1.0f, S, Bc, v_tile, o_beta, O, f.dv);
          }
        }
      }
#if defined(__AVX512F__)
      // Each row's 16 partial sums summed across lanes, 16 rows together (a
      // row's sum in the same order whatever the rows beside it).
      static_assert(Br % 16 == 0, "l holds whole groups of 16 rows");
      for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        __m512 partial[16];
#pragma GCC unroll 16
        for (int64_t i = 0; i < 16; ++i)
          partial[i] = r0 + i < rows ? _mm512_loadu_ps(l16 + (r0 + i) * 16) : _mm512_setzero_ps();
        _mm512_storeu_ps(l + r0, lane_sums16(partial));
      }
#endif
      for (int64_t r = 0; r < rows; ++r) {
        float* dst = out + at(L.o, b, h) + (q0 + r) * L.o.row;
        const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < f.dv; ++d) dst[d] = O[r * f.dv + d] * inv;
        if (lse) lse[bh * f.t + q0 + r] = l[r] > 0 ? m[r] + std::log(l[r]) : -INFINITY;
      }
    }
  }
}

// One task per (batch, key/value head): it owns dK and dV of that head and
// dQ of the G query heads that share it, so no two threads write one element.
// dout_r is dout as the products take it (rounded when Rounded); D = dO . O
// reads dout itself.
void backward_tiles(const FlashShape& f, const float* q, const float* k, const float* v, const float* out,
                    const float* dout, const float* dout_r, const float* lse, float* dq, float* dk, float* dv,
                    Products mode) {
  const int64_t G = f.heads / f.kv_heads;
  const Layouts L(f);
  const int64_t tasks = f.batch * f.kv_heads;
  // Packed: per thread, its K/V head's K, K^T and V, each query head's Q,
  // Q^T, dO and dO^T, and the tiles P^T, dS and dS^T.
  const bool packed = mode == Products::Packed, rounded = mode == Products::Rounded;
  const bool panels = !packed && on_panels(f);
  const int64_t grab = tasks_per_grab(tasks);
#pragma omp parallel if (tasks > 1)
  {
    Scratch probs(Br * Bc), dprobs(Br * Bc), rowdot(f.t), rounded_probs(rounded ? Br * Bc : 1);
    float* P = probs.data();
    float* Pr = rounded ? rounded_probs.data() : P;  // P as dV's product takes it
    float* dP = dprobs.data();
    float* D = rowdot.data();
    PackBuffer words(packed ? 2 * bf16_packed_words(f.s, f.dh) + bf16_packed_words(f.s, f.dv) +
                                  2 * bf16_packed_words(f.t, f.dh) + 2 * bf16_packed_words(f.t, f.dv) +
                                  3 * bf16_packed_words(Bc, Br)
                            : 0);
    Packed Kp, Kt, Vp, Qp, Qt, dOp, dOt, Pt, dSp, dSt;
    if (packed) {
      Kp = words.take(f.s, f.dh), Kt = words.take(f.dh, f.s), Vp = words.take(f.s, f.dv);
      Qp = words.take(f.t, f.dh), Qt = words.take(f.dh, f.t), dOp = words.take(f.t, f.dv), dOt = words.take(f.dv, f.t);
      Pt = words.take(Bc, Br), dSp = words.take(Bc, Br), dSt = words.take(Bc, Br);  // each at most Br x Bc either way
    }
    // On the panels (on_panels): the current query head's Q and dO tiles
    // (each the B of a product with a key tile's dS^T or P^T), and the current
    // key tile's K^T (scores), V^T (dP) and K (dQ).
    const int64_t q_floats = panel_floats(f.dh, Br), qt_floats = q_floats + panel_floats(f.dv, Br);
    const int64_t kt_floats = panel_floats(Bc, f.dh), vt_floats = panel_floats(Bc, f.dv);
    Scratch query_panels, key_panels;
    if (panels) {
      query_panels.take((f.t + Br - 1) / Br * qt_floats);
      key_panels.take(kt_floats + vt_floats + panel_floats(f.dh, Bc));
    }
#pragma omp for schedule(dynamic, grab)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / f.kv_heads, hk = task % f.kv_heads;
      const float* K = k + at(L.k, b, hk);
      const float* V = v + at(L.v, b, hk);
      float* dK = dk + at(L.k, b, hk);
      float* dV = dv + at(L.v, b, hk);
      const int64_t qr = L.q.row, kr = L.k.row, vr = L.v.row, orow = L.o.row;
      const int64_t key_hi = visible_keys(f, b, f.t - 1);
      // The products write dK and dV of keys [0, key_hi) (the first with
      // beta 0) and every row of dQ (from the first key tile on); keys past
      // key_hi (padding) get zeros here. (Zeroing every row first, 128 bytes
      // at a time, took a sixth of a ViT's attention backward.)
      for (int64_t j = key_hi; j < f.s; ++j) {
        std::fill_n(dK + j * kr, f.dh, 0.0f);
        std::fill_n(dV + j * vr, f.dv, 0.0f);
      }
      if (packed) {
        pack_b(Kp, K, kr, false);
        pack_b(Kt, K, kr, true);
        pack_b(Vp, V, vr, false);
      }
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = hk * G + g, bh = b * f.heads + h;
        const float* Q = q + at(L.q, b, h);
        const float* O = out + at(L.o, b, h);
        const float* dO = dout + at(L.o, b, h);
        const float* dOr = dout_r + at(L.o, b, h);
        const float* lse_row = lse + bh * f.t;
        float* dQ = dq + at(L.q, b, h);
        // Rows of dQ before the first query tile the first key tile reaches
        // (causal, more queries than keys), or all when no key is visible.
        const int64_t unwritten = key_hi == 0 ? f.t : f.causal ? std::max<int64_t>(0, f.t - f.s) / Br * Br : 0;
        for (int64_t i = 0; i < unwritten; ++i) std::fill_n(dQ + i * qr, f.dh, 0.0f);
        for (int64_t i = 0; i < f.t; ++i) D[i] = dot(dO + i * orow, O + i * orow, f.dv);
        if (packed) {
          pack_a(Qp, Q, qr, false);
          pack_b(Qt, Q, qr, true);
          pack_a(dOp, dO, orow, false);
          pack_b(dOt, dO, orow, true);
        }
        for (int64_t q0 = 0; panels && q0 < f.t; q0 += Br) {
          float* at_tile = query_panels.data() + q0 / Br * qt_floats;
          const int64_t rows = std::min(Br, f.t - q0);
          pack_panel(at_tile, Q + q0 * qr, qr, false, f.dh, rows);
          pack_panel(at_tile + q_floats, dOr + q0 * orow, orow, false, f.dv, rows);
        }
        for (int64_t k0 = 0; k0 < key_hi; k0 += Bc) {
          const int64_t cols = std::min(Bc, key_hi - k0);
          if (panels) {
            pack_panel(key_panels.data(), K + k0 * kr, kr, true, cols, f.dh);
            pack_panel(key_panels.data() + kt_floats, V + k0 * vr, vr, true, cols, f.dv);
            pack_panel(key_panels.data() + kt_floats + vt_floats, K + k0 * kr, kr, false, f.dh, cols);
          }
          const TileB k_t{K + k0 * kr, kr, true, panels ? key_panels.data() : nullptr};
          const TileB v_t{V + k0 * vr, vr, true, panels ? key_panels.data() + kt_floats : nullptr};
          const TileB k_tile{K + k0 * kr, kr, false, panels ? key_panels.data() + kt_floats + vt_floats : nullptr};
          // The first query that can see key k0 (causal: i + S - T >= k0).
          const int64_t first_q = f.causal ? std::max<int64_t>(0, k0 - (f.s - f.t)) : 0;
          for (int64_t q0 = first_q / Br * Br; q0 < f.t; q0 += Br) {
            const int64_t rows = std::min(Br, f.t - q0);
            const float* q_panel = panels ? query_panels.data() + q0 / Br * qt_floats : nullptr;
            const TileB q_tile{Q + q0 * qr, qr, false, q_panel};
            const TileB do_tile{dOr + q0 * orow, orow, false, panels ? q_panel + q_floats : nullptr};
            // Each output's first contribution overwrites it: dK's and dV's
            // rows of this key tile at its first query tile of the first
            // query head, dQ's rows at the first key tile.
            const float kv_beta = g == 0 && q0 == first_q / Br * Br ? 0.0f : 1.0f, q_beta = k0 == 0 ? 0.0f : 1.0f;
            if (packed)
              packed_product(rows, cols, f.dh, f.scale, Qp.rows_from(q0), Qp.stride(), Kp.rows_from(k0), Kp.stride(),
                             0.0f, P, Bc);
            else
              tile_product(false, rows, cols, f.dh, f.scale, Q + q0 * qr, qr, k_t, 0.0f, P, Bc);
            for (int64_t r = 0; r < rows; ++r) {
              float* p = P + r * Bc;
              const float row_lse = lse_row[q0 + r];
              const int64_t vis =
                  row_lse == -INFINITY ? 0 : std::clamp<int64_t>(visible_keys(f, b, q0 + r) - k0, 0, cols);
              probabilities_in_place(p, vis, cols, row_lse);
            }
            if (packed) {  // dV += P^T dO;  dP = dO V^T
              const Packed p_t{Pt.words, cols, rows};
              pack_a(p_t, P, Bc, true);
              packed_product(cols, f.dv, rows, 1.0f, p_t.words, p_t.stride(), dOt.depth_from(q0), dOt.stride(), kv_beta,
                             dV + k0 * vr, vr);
              packed_product(rows, cols, f.dv, 1.0f, dOp.rows_from(q0), dOp.stride(), Vp.rows_from(k0), Vp.stride(),
                             0.0f, dP, Bc);
            } else {
              if (rounded)
                for (int64_t r = 0; r < rows; ++r) round_row(P + r * Bc, cols, Pr + r * Bc);
              tile_product(true, cols, f.dv, rows, 1.0f, Pr, Bc, do_tile, kv_beta, dV + k0 * vr, vr);
              tile_product(false, rows, cols, f.dv, 1.0f, dOr + q0 * orow, orow, v_t, 0.0f, dP, Bc);
            }
            for (int64_t r = 0; r < rows; ++r) {
              const float di = D[q0 + r];
              float* dp = dP + r * Bc;
              const float* p = P + r * Bc;
              for (int64_t j = 0; j < cols; ++j) dp[j] = p[j] * (dp[j] - di);
            }
            if (packed) {  // dQ += scale dS K;  dK += scale dS^T Q
              const Packed ds{dSp.words, rows, cols}, ds_t{dSt.words, cols, rows};
              pack_a(ds, dP, Bc, false);
              pack_a(ds_t, dP, Bc, true);
              packed_product(rows, f.dh, cols, f.scale, ds.words, ds.stride(), Kt.depth_from(k0), Kt.stride(), q_beta,
                             dQ + q0 * qr, qr);
              packed_product(cols, f.dh, rows, f.scale, ds_t.words, ds_t.stride(), Qt.depth_from(q0), Qt.stride(),
                             kv_beta, dK + k0 * kr, kr);
            } else {
              if (rounded)
                for (int64_t r = 0; r < rows; ++r) round_row(dP + r * Bc, cols, dP + r * Bc);
              tile_product(false, rows, f.dh, cols, f.scale, dP, Bc, k_tile, q_beta, dQ + q0 * qr, qr);
              tile_product(true, cols, f.dh, rows, f.scale, dP, Bc, q_tile, kv_beta, dK + k0 * kr, kr);
            }
          }
        }
      }
    }
  }
}

}  // namespace

void flash_attention_forward(const FlashShape& f, const float* q, const float* k, const float* v, float* out,
                             float* lse) {
  const Products mode = products_of(f);
  if (mode != Products::Rounded) return forward_tiles(f, q, k, v, out, lse, mode);
  const Layouts L(f);
  const RoundedCopy qr(q, L.q, f.batch, f.heads, f.t, f.dh), kr(k, L.k, f.batch, f.kv_heads, f.s, f.dh),
      vr(v, L.v, f.batch, f.kv_heads, f.s, f.dv);
  forward_tiles(f, qr.data(), kr.data(), vr.data(), out, lse, mode);
}

void flash_attention_backward(const FlashShape& f, const float* q, const float* k, const float* v, const float* out,
                              const float* dout, const float* lse, float* dq, float* dk, float* dv) {
  const Products mode = products_of(f);
  if (mode != Products::Rounded) return backward_tiles(f, q, k, v, out, dout, dout, lse, dq, dk, dv, mode);
  const Layouts L(f);
  const RoundedCopy qr(q, L.q, f.batch, f.heads, f.t, f.dh), kr(k, L.k, f.batch, f.kv_heads, f.s, f.dh),
      vr(v, L.v, f.batch, f.kv_heads, f.s, f.dv), dr(dout, L.o, f.batch, f.heads, f.t, f.dv);
  backward_tiles(f, qr.data(), kr.data(), vr.data(), out, dout, dr.data(), lse, dq, dk, dv, mode);
}

}  // namespace qkv::cpu::QKV_CPU_NS
