// Flash attention on the CPU: tiles of kFlashQueryTile queries x kFlashKeyTile
// keys, QK^T and PV as small GEMMs (OpenBLAS, one thread per tile task), an
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

#include <algorithm>
#include <cmath>
#include <vector>

#include "qkv/allocator.h"
#include "src/kernels/cpu/gemm_bf16_packed.h"
#include "src/kernels/cpu/vec_math.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {
namespace {

constexpr int64_t Br = kFlashQueryTile;
constexpr int64_t Bc = kFlashKeyTile;

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

// C[m,n] (+)= alpha * op(A) op(B) on raw row-major pointers; in bfloat16
// (operands rounded as packed, float32 sums) when f.bf16.
void small_gemm(const FlashShape& f, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (f.bf16) {
    GemmBf16Args g;  // C = A B^T with B [N, K]: op(B) = B^T is B as it lies
    g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = beta, g.c = c, g.ldc = ldc;
    g.a_f32 = a, g.lda = lda, g.a_transposed = ta;
    g.b_f32 = b, g.ldb = ldb, g.b_transposed = !tb;
    return gemm_bf16(g);
  }
  GemmArgs g;
  g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k, g.alpha = alpha;
  g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.beta = beta, g.c = c, g.ldc = ldc;
  gemm(g);
}

// The bfloat16 forward's operands, packed for gemm_bf16's kernels (AMX or
// AVX512-BF16; the avx512 level where the CPU has either): each K/V head's K
// and V^T once per call (bfloat16 copies, O(S D) words in all), each query
// tile's Q once, and each tile of probabilities as it is made, where
// small_gemm would pack Q, K and V again for every tile.
struct PackedHeads {
#if defined(__AVX512F__)
  int64_t k_words = 0, v_words = 0;  // per K/V head
  uint32_t* k = nullptr;              // [B * Hkv][K as B: n = S keys, k = Dh]
  uint32_t* v = nullptr;              // [B * Hkv][V^T as B: n = Dv, k = S keys]
#endif
  bool on = false;
};

#if defined(__AVX512F__)

void pack_heads(const FlashShape& f, const Layouts& L, const float* k, const float* v, PackedHeads& p) {
  const int64_t heads = f.batch * f.kv_heads;
#pragma omp parallel for schedule(static) if (heads > 1)
  for (int64_t bh = 0; bh < heads; ++bh) {
    const int64_t b = bh / f.kv_heads, hk = bh % f.kv_heads;
    GemmBf16Args gk;  // B = K [S, Dh]
    gk.m = 1, gk.n = f.s, gk.k = f.dh, gk.b_f32 = k + at(L.k, b, hk), gk.ldb = L.k.row;
    pack_bf16_b(gk, p.k + bh * p.k_words);
    GemmBf16Args gv;  // B = V^T [Dv, S], held as V [S, Dv]: transposed
    gv.m = 1, gv.n = f.dv, gv.k = f.s, gv.b_f32 = v + at(L.v, b, hk), gv.ldb = L.v.row, gv.b_transposed = true;
    pack_bf16_b(gv, p.v + bh * p.v_words);
  }
}

// S = scale Q K^T for keys [k0, k0 + cols) of K/V head bh, Q packed in qp.
void packed_scores(const FlashShape& f, const PackedHeads& p, int64_t bh, const uint32_t* qp, int64_t rows,
                   int64_t k0, int64_t cols, float* S) {
  GemmBf16Args g;
  g.m = rows, g.n = cols, g.k = f.dh, g.alpha = f.scale, g.c = S, g.ldc = kFlashKeyTile;
  const int64_t kb = bf16_chunks(f.dh);
  gemm_bf16_packed(g, {.kb = kb, .nb = bf16_blocks(cols), .a = qp, .a_stride = kb * 256,
                       .b = p.k + bh * p.k_words + k0 / 16 * kb * 256, .b_stride = kb * 256});
}

// O += P V for keys [k0, k0 + cols) of K/V head bh (k0 a multiple of 32), P
// packed into pp from the scores tile.
void packed_mix(const FlashShape& f, const PackedHeads& p, int64_t bh, const float* P, uint32_t* pp, int64_t rows,
                int64_t k0, int64_t cols, float* O) {
  GemmBf16Args a;
  a.m = rows, a.k = cols, a.a_f32 = P, a.lda = kFlashKeyTile;
  pack_bf16_a(a, pp);
  GemmBf16Args g;
  g.m = rows, g.n = f.dv, g.k = cols, g.beta = 1.0f, g.c = O, g.ldc = f.dv;
  const int64_t kb = bf16_chunks(cols);
  gemm_bf16_packed(g, {.kb = kb, .nb = bf16_blocks(f.dv), .a = pp, .a_stride = kb * 256,
                       .b = p.v + bh * p.v_words + k0 / 32 * 256, .b_stride = bf16_chunks(f.s) * 256});
}

#endif

}  // namespace

void flash_attention_forward(const FlashShape& f, const float* q, const float* k, const float* v, float* out,
                             float* lse) {
  const int64_t G = f.heads / f.kv_heads;
  const Layouts L(f);
  const int64_t q_tiles = (f.t + Br - 1) / Br;
  const int64_t tasks = f.batch * f.heads * q_tiles;
  PackedHeads packed;
#if defined(__AVX512F__)
  packed.on = f.bf16 && bf16_packed_usable();
  packed.k_words = bf16_packed_words(f.s, f.dh), packed.v_words = bf16_packed_words(f.dv, f.s);
  Scratch heads(packed.on ? f.batch * f.kv_heads * (packed.k_words + packed.v_words) : 1);  // 32-bit words
  if (packed.on) {
    packed.k = reinterpret_cast<uint32_t*>(heads.data());
    packed.v = packed.k + f.batch * f.kv_heads * packed.k_words;
    pack_heads(f, L, k, v, packed);
  }
#endif
#pragma omp parallel if (tasks > 1)
  {
    Scratch scores(Br * Bc), acc(Br * f.dv), row_max(Br), row_sum(Br);
    float* S = scores.data();
    float* O = acc.data();
    float* m = row_max.data();
    float* l = row_sum.data();
#if defined(__AVX512F__)
    Scratch q_words(packed.on ? bf16_packed_words(Br, f.dh) : 1), p_words(packed.on ? bf16_packed_words(Br, Bc) : 1);
    uint32_t* qp = reinterpret_cast<uint32_t*>(q_words.data());
    uint32_t* pp = reinterpret_cast<uint32_t*>(p_words.data());
#endif
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t qt = task % q_tiles, bh = task / q_tiles, b = bh / f.heads, h = bh % f.heads;
      const int64_t q0 = qt * Br, rows = std::min(Br, f.t - q0);
      const float* Q = q + at(L.q, b, h) + q0 * L.q.row;
      const float* K = k + at(L.k, b, h / G);
      const float* V = v + at(L.v, b, h / G);
      const int64_t tile_hi = visible_keys(f, b, q0 + rows - 1);  // rows see more keys further down
      std::fill(m, m + rows, -INFINITY);
      std::fill(l, l + rows, 0.0f);
      std::fill(O, O + rows * f.dv, 0.0f);
#if defined(__AVX512F__)
      const int64_t bh_kv = b * f.kv_heads + h / G;
      if (packed.on) {
        GemmBf16Args a;
        a.m = rows, a.k = f.dh, a.a_f32 = Q, a.lda = L.q.row;
        pack_bf16_a(a, qp);
      }
#endif
      for (int64_t k0 = 0; k0 < tile_hi; k0 += Bc) {
        const int64_t cols = std::min(Bc, tile_hi - k0);
#if defined(__AVX512F__)
        if (packed.on) packed_scores(f, packed, bh_kv, qp, rows, k0, cols, S);
        else
#endif
          small_gemm(f, false, true, rows, cols, f.dh, f.scale, Q, L.q.row, K + k0 * L.k.row, L.k.row, 0.0f, S, Bc);
        for (int64_t r = 0; r < rows; ++r) {
          float* s = S + r * Bc;
          const int64_t vis = std::clamp<int64_t>(visible_keys(f, b, q0 + r) - k0, 0, cols);
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
          float* o = O + r * f.dv;
          for (int64_t d = 0; d < f.dv; ++d) o[d] *= alpha;
        }
#if defined(__AVX512F__)
        if (packed.on) packed_mix(f, packed, bh_kv, S, pp, rows, k0, cols, O);
        else
#endif
          small_gemm(f, false, false, rows, f.dv, cols, 1.0f, S, Bc, V + k0 * L.v.row, L.v.row, 1.0f, O, f.dv);
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* dst = out + at(L.o, b, h) + (q0 + r) * L.o.row;
        const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < f.dv; ++d) dst[d] = O[r * f.dv + d] * inv;
        lse[bh * f.t + q0 + r] = l[r] > 0 ? m[r] + std::log(l[r]) : -INFINITY;
      }
    }
  }
}

// One task per (batch, key/value head): it owns dK and dV of that head and
// dQ of the G query heads that share it, so no two threads write one element.
void flash_attention_backward(const FlashShape& f, const float* q, const float* k, const float* v, const float* out,
                              const float* dout, const float* lse, float* dq, float* dk, float* dv) {
  const int64_t G = f.heads / f.kv_heads;
  const Layouts L(f);
  const int64_t tasks = f.batch * f.kv_heads;
#pragma omp parallel if (tasks > 1)
  {
    Scratch probs(Br * Bc), dprobs(Br * Bc), rowdot(f.t);
    float* P = probs.data();
    float* dP = dprobs.data();
    float* D = rowdot.data();
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / f.kv_heads, hk = task % f.kv_heads;
      const float* K = k + at(L.k, b, hk);
      const float* V = v + at(L.v, b, hk);
      float* dK = dk + at(L.k, b, hk);
      float* dV = dv + at(L.v, b, hk);
      const int64_t qr = L.q.row, kr = L.k.row, vr = L.v.row, orow = L.o.row;
      const int64_t key_hi = visible_keys(f, b, f.t - 1);
      for (int64_t j = 0; j < f.s; ++j) {  // keys past key_hi (padding) keep these zeros
        std::fill_n(dK + j * kr, f.dh, 0.0f);
        std::fill_n(dV + j * vr, f.dv, 0.0f);
      }
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = hk * G + g, bh = b * f.heads + h;
        const float* Q = q + at(L.q, b, h);
        const float* O = out + at(L.o, b, h);
        const float* dO = dout + at(L.o, b, h);
        const float* lse_row = lse + bh * f.t;
        float* dQ = dq + at(L.q, b, h);
        for (int64_t i = 0; i < f.t; ++i) std::fill_n(dQ + i * qr, f.dh, 0.0f);
        for (int64_t i = 0; i < f.t; ++i) {
          float s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < f.dv; ++d) s += dO[i * orow + d] * O[i * orow + d];
          D[i] = s;
        }
        for (int64_t k0 = 0; k0 < key_hi; k0 += Bc) {
          const int64_t cols = std::min(Bc, key_hi - k0);
          // The first query that can see key k0 (causal: i + S - T >= k0).
          const int64_t first_q = f.causal ? std::max<int64_t>(0, k0 - (f.s - f.t)) : 0;
          for (int64_t q0 = first_q / Br * Br; q0 < f.t; q0 += Br) {
            const int64_t rows = std::min(Br, f.t - q0);
            small_gemm(f, false, true, rows, cols, f.dh, f.scale, Q + q0 * qr, qr, K + k0 * kr, kr, 0.0f, P, Bc);
            for (int64_t r = 0; r < rows; ++r) {
              float* p = P + r * Bc;
              const float row_lse = lse_row[q0 + r];
              const int64_t vis =
                  row_lse == -INFINITY ? 0 : std::clamp<int64_t>(visible_keys(f, b, q0 + r) - k0, 0, cols);
              for (int64_t j = 0; j < vis; ++j) p[j] = fast_exp(p[j] - row_lse);
              std::fill(p + vis, p + cols, 0.0f);
            }
            small_gemm(f, true, false, cols, f.dv, rows, 1.0f, P, Bc, dO + q0 * orow, orow, 1.0f, dV + k0 * vr, vr);
            small_gemm(f, false, true, rows, cols, f.dv, 1.0f, dO + q0 * orow, orow, V + k0 * vr, vr, 0.0f, dP, Bc);
            for (int64_t r = 0; r < rows; ++r) {
              const float di = D[q0 + r];
              float* dp = dP + r * Bc;
              const float* p = P + r * Bc;
              for (int64_t j = 0; j < cols; ++j) dp[j] = p[j] * (dp[j] - di);
            }
            small_gemm(f, false, false, rows, f.dh, cols, f.scale, dP, Bc, K + k0 * kr, kr, 1.0f, dQ + q0 * qr, qr);
            small_gemm(f, true, false, cols, f.dh, rows, f.scale, dP, Bc, Q + q0 * qr, qr, 1.0f, dK + k0 * kr, kr);
          }
        }
      }
    }
  }
}

}  // namespace qkv::cpu::QKV_CPU_NS
