// Fast GEMM: the single place qkv calls BLAS (OpenBLAS, OpenMP build, loaded
// by src/kernels/blas.cpp), beside qkv's own kernels: the panels for most
// products (below), and register tiles for the case BLAS handles worst: a
// few rows of activations against a weight matrix stored [out, in], as in
// y = x W^T with one token per sequence (decoding). That product is bound by
// reading W once from memory, so the kernels read W's rows exactly once,
// with wide FMA accumulators, and split the rows between the OpenMP threads.
// In inference (on the avx512 and avx2 levels) register tiles
// (gemm_tiles.cpp) take every count of rows up to kMaxTiledRows: each output
// is summed in the same order whatever the count, so a sequence decoded
// beside others (`qkv serve`'s streams) gets bit for bit what it gets alone.
// Training's few-row products take a streaming GEMV (up to 4 rows).
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
#include "src/kernels/cpu/gemm_tiles.h"
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

// then the addend (a residual connection; the panels add it as they store),
void add_addend_rows(const GemmArgs& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    float* c = g.c + i * g.ldc;
    const float* r = g.addend + i * g.ld_addend;
#pragma omp simd
    for (int64_t j = 0; j < g.n; ++j) c[j] += r[j];
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
  if (g.addend) add_addend_rows(g);
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
    gemm_tiled(g);  // bias included
    if (g.addend) add_addend_rows(g);
    if (g.act_out) activate_rows(g);
    return;
  }
  if (!g.trans_a && g.trans_b && g.m <= kMaxGemvRows && g.k >= 16) {
    gemv(g);  // bias included
    if (g.addend) add_addend_rows(g);
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
        if (g.addend) p.addend = g.addend + i0 * g.ld_addend;
      } else {
        p.n = i1 - i0;
        p.b = g.trans_b ? g.b + i0 * g.ldb : g.b + i0;  // B is stored [n, k] when transposed
        p.c = g.c + i0;
        if (g.bias) p.bias = g.bias + i0;
        if (g.act_out) p.act_out = g.act_out + i0;
        if (g.addend) p.addend = g.addend + i0;
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
