// Fast LayerNorm and RMSNorm: rows in parallel for x and dx; the parameter
// gradients (sums over rows) summed so that no thread shares an accumulator
// and the order of additions is fixed whatever the thread count: LayerNorm's
// with dx by chunks of rows and then over the chunks, alone (and RMSNorm's)
// over column blocks.
#include <algorithm>
#include <cmath>

#include "src/kernels/cpu/scratch.h"
#include "src/kernels/cpu/simd.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {

constexpr int64_t kColumnBlock = 64;

namespace {

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))  // (this level's Vec)
// A row's statistics in four chains of vector adds, summed as a tree: at
// d_model 128 one chain through eight vectors and then sixteen lanes one at
// a time made each row's two sums a serial wait (LayerNorm was 7% of a bf16
// ViT training step).
#if defined(__AVX512F__)
inline float lane_sum(Vec v) {
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(kAll, v, v, 0x4e));  // 256-bit halves
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(kAll, v, v, 0xb1));  // 128-bit quarters
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(kAll, v, 0x4e));        // pairs
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(kAll, v, 0xb1));
  return _mm512_cvtss_f32(v);
}
#else
inline float lane_sum(Vec v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
#endif

// The sums over j in [0, n) of term(j) (kLanes terms from j) in four chains;
// the last n % kLanes terms are left to the caller.
template <class Term>
inline float chains_sum(int64_t n, Term&& term) {
  Vec a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
  int64_t j = 0;
  for (; j + 4 * kLanes <= n; j += 4 * kLanes) {
    a0 = vadd(a0, term(j));
    a1 = vadd(a1, term(j + kLanes));
    a2 = vadd(a2, term(j + 2 * kLanes));
    a3 = vadd(a3, term(j + 3 * kLanes));
  }
  if (j + kLanes <= n) a0 = vadd(a0, term(j)), j += kLanes;
  if (j + kLanes <= n) a1 = vadd(a1, term(j)), j += kLanes;
  if (j + kLanes <= n) a2 = vadd(a2, term(j));
  return lane_sum(vadd(vadd(a0, a1), vadd(a2, a3)));
}
#define QKV_NORM_CHAINS 1
#endif

// Sum and mean-centred sum of squares of a LayerNorm row.
inline void row_moments(const float* xr, int64_t cols, float& mean, float& var) {
  int64_t j = 0;
  float s = 0.0f;
#ifdef QKV_NORM_CHAINS
  j = cols / kLanes * kLanes;
  s = chains_sum(j, [&](int64_t i) { return vload(xr + i); });
#endif
  for (int64_t i = j; i < cols; ++i) s += xr[i];
  const float m = s / cols;
  float v = 0.0f;
#ifdef QKV_NORM_CHAINS
  const Vec minus_m = vset(-m);
  v = chains_sum(j, [&](int64_t i) {
    const Vec d = vadd(vload(xr + i), minus_m);
    return vmul(d, d);
  });
#endif
  for (int64_t i = j; i < cols; ++i) v += (xr[i] - m) * (xr[i] - m);
  mean = m, var = v;
}

}  // namespace

void layer_norm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t cols, float eps) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float m, v;
    row_moments(xr, cols, m, v);
    const float rs = 1.0f / std::sqrt(v / cols + eps);
    mean[r] = m;
    rstd[r] = rs;
    if (w && b) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - m) * rs * w[j] + b[j];
    } else {
      for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - m) * rs * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f);
    }
  }
}

namespace {

// dx of one LayerNorm row (w may be null).
inline void layer_norm_dx_row(const float* xr, const float* w, float m, float rs, const float* dyr, float* dxr,
                              int64_t cols) {
  float mg = 0, mgx = 0;
  int64_t j0 = 0;
#ifdef QKV_NORM_CHAINS
  if (w) {
    j0 = cols / kLanes * kLanes;
    const Vec minus_m = vset(-m), vrs = vset(rs);
    mg = chains_sum(j0, [&](int64_t i) { return vmul(vload(dyr + i), vload(w + i)); });
    mgx = chains_sum(j0, [&](int64_t i) {
      return vmul(vmul(vload(dyr + i), vload(w + i)), vmul(vadd(vload(xr + i), minus_m), vrs));
    });
  }
#endif
  for (int64_t j = j0; j < cols; ++j) {
    float g = dyr[j] * (w ? w[j] : 1.0f);
    mg += g;
    mgx += g * (xr[j] - m) * rs;
  }
  mg /= cols;
  mgx /= cols;
  if (w) {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) dxr[j] = rs * (dyr[j] * w[j] - mg - (xr[j] - m) * rs * mgx);
  } else {
    for (int64_t j = 0; j < cols; ++j) dxr[j] = rs * (dyr[j] - mg - (xr[j] - m) * rs * mgx);
  }
}

// The backward with dx and the parameter gradients together takes the rows in
// chunks of kRowChunk whatever the thread count: each chunk sums its rows'
// dw and db terms while they are in L1 from dx's pass, and the chunks' sums
// are added in chunk order, so the result does not depend on the threads.
// Apart, the parameter gradients read x and dy a second time, by columns
// (the rows another thread's dx pass had in its cache): half of LayerNorm's
// backward at d_model 128 (2048 rows).
constexpr int64_t kRowChunk = 64;

}  // namespace

void layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                         float* dx, float* dw, float* db, int64_t rows, int64_t cols) {
  const bool big = rows * cols >= 16384;
  if (dx && (dw || db)) {
    const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
    Scratch sums(2 * chunks * cols);  // chunk c's dw terms, then its db terms
#pragma omp parallel for schedule(static) if (big && chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      float* sw = sums.data() + 2 * c * cols;
      float* sb = sw + cols;
      std::fill(sw, sw + 2 * cols, 0.0f);
      for (int64_t r = c * kRowChunk; r < std::min(rows, (c + 1) * kRowChunk); ++r) {
        const float* xr = x + r * cols;
        const float* dyr = dy + r * cols;
        const float m = mean[r], rs = rstd[r];
        layer_norm_dx_row(xr, w, m, rs, dyr, dx + r * cols, cols);
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) {
          sw[j] += dyr[j] * (xr[j] - m) * rs;
          sb[j] += dyr[j];
        }
      }
    }
    const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (big && blocks > 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t c0 = blk * kColumnBlock, c1 = std::min(cols, c0 + kColumnBlock);
      for (int64_t j = c0; j < c1; ++j) {
        float tw = 0.0f, tb = 0.0f;
        for (int64_t c = 0; c < chunks; ++c) {
          tw += sums.data()[2 * c * cols + j];
          tb += sums.data()[(2 * c + 1) * cols + j];
        }
        if (dw) dw[j] = tw;
        if (db) db[j] = tb;
      }
    }
    return;
  }
  if (dx) {
#pragma omp parallel for schedule(static) if (big && rows > 1)
    for (int64_t r = 0; r < rows; ++r)
      layer_norm_dx_row(x + r * cols, w, mean[r], rstd[r], dy + r * cols, dx + r * cols, cols);
    return;
  }
  if (!dw && !db) return;
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (big && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(cols, c0 + kColumnBlock);
    float accw[kColumnBlock] = {}, accb[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      const float m = mean[r], rs = rstd[r];
      for (int64_t j = c0; j < c1; ++j) {
        accw[j - c0] += dyr[j] * (xr[j] - m) * rs;
        accb[j - c0] += dyr[j];
      }
    }
    for (int64_t j = c0; j < c1; ++j) {
      if (dw) dw[j] = accw[j - c0];
      if (db) db[j] = accb[j - c0];
    }
  }
}

void rms_norm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols, float eps) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < cols; ++j) ss += xr[j] * xr[j];
    float rs = 1.0f / std::sqrt(ss / cols + eps);
    rstd[r] = rs;
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = xr[j] * rs * (w ? w[j] : 1.0f);
  }
}

void rms_norm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                       int64_t rows, int64_t cols) {
  if (dx) {
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      const float rs = rstd[r];
      float mgx = 0;
#pragma omp simd reduction(+ : mgx)
      for (int64_t j = 0; j < cols; ++j) mgx += dyr[j] * (w ? w[j] : 1.0f) * xr[j];
      mgx /= cols;
      for (int64_t j = 0; j < cols; ++j) dx[r * cols + j] = rs * (dyr[j] * (w ? w[j] : 1.0f) - xr[j] * rs * rs * mgx);
    }
  }
  if (!dw) return;
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= 16384 && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(cols, c0 + kColumnBlock);
    float acc[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = c0; j < c1; ++j) acc[j - c0] += dy[r * cols + j] * x[r * cols + j] * rstd[r];
    for (int64_t j = c0; j < c1; ++j) dw[j] = acc[j - c0];
  }
}

#undef QKV_NORM_CHAINS

}  // namespace qkv::cpu::QKV_CPU_NS
