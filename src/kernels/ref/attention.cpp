// Reference attention with the flash kernels' interface: for each query row,
// every visible score, a softmax and the weighted sum, in double; the
// backward from the same probabilities, recomputed from the saved lse.
//   s_j = scale q.k_j;  p_j = exp(s_j - lse);  lse = log sum_j exp(s_j);  out = sum_j p_j v_j
//   D = dout.out;  dv_j += p_j dout;  ds_j = p_j (dout.v_j - D);  dq += scale ds_j k_j;  dk_j += scale ds_j q
// With f.bf16, each factor of a product is rounded to bfloat16 where it
// enters one, as the fast kernel's GEMMs round their operands: q, k, v and
// dout, and p and ds (the fast forward rounds p before it divides by the
// row's sum, this twin after: the two differ by a rounding of p, which is
// the tests' bound). D and the softmax stay unrounded.
#include <algorithm>
#include <cmath>
#include <vector>

#include "qkv/dtype.h"
#include "src/kernels/kernels.h"

namespace qkv::ref {
namespace {

// Row r of head h of batch b of an operand whose layout may be zero (contiguous).
struct Rows {
  FlashLayout l;
  Rows(FlashLayout layout, int64_t heads, int64_t rows, int64_t d) : l(layout) {
    if (l.row == 0) l.row = d;
    if (l.head == 0) l.head = rows * l.row;
    if (l.batch == 0) l.batch = heads * l.head;
  }
  int64_t at(int64_t b, int64_t h, int64_t r) const { return b * l.batch + h * l.head + r * l.row; }
};

// Row j of key/value head h of batch b: in x, or in the batch's own buffer.
const float* kv_row(const float* x, const float* const* batches, const Rows& r, int64_t b, int64_t h, int64_t j) {
  return batches ? batches[b] + h * r.l.head + j * r.l.row : x + r.at(b, h, j);
}

int64_t visible(const FlashShape& f, int64_t b, int64_t i) {
  int64_t hi = f.s;
  if (f.key_lengths) hi = std::clamp<int64_t>(f.key_lengths[b], 0, f.s);
  if (f.causal) hi = std::min(hi, i + f.s - f.t + 1);
  return std::max<int64_t>(hi, 0);
}

// x as a factor of a product: rounded to bfloat16 when f.bf16.
double factor(const FlashShape& f, double x) { return f.bf16 ? bf16_to_float(float_to_bf16((float)x)) : x; }

double dot(const FlashShape& f, const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t c = 0; c < n; ++c) s += factor(f, a[c]) * factor(f, b[c]);
  return s;
}

}  // namespace

void flash_attention_forward(const FlashShape& f, const float* q, const float* k, const float* v, float* out,
                             float* lse) {
  const Rows Q(f.q, f.heads, f.t, f.dh), K(f.k, f.kv_heads, f.s, f.dh), V(f.v, f.kv_heads, f.s, f.dv),
      O(f.o, f.heads, f.t, f.dv);
  const int64_t group = f.heads / f.kv_heads;
  std::vector<double> score(f.s), acc(f.dv);
  for (int64_t b = 0; b < f.batch; ++b)
    for (int64_t h = 0; h < f.heads; ++h)
      for (int64_t i = 0; i < f.t; ++i) {
        const int64_t hk = h / group, n = visible(f, b, i);
        float* o = out + O.at(b, h, i);
        double m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          score[j] = f.scale * dot(f, q + Q.at(b, h, i), kv_row(k, f.k_batches, K, b, hk, j), f.dh);
          m = std::max(m, score[j]);
        }
        double l = 0;
        for (int64_t j = 0; j < n; ++j) l += std::exp(score[j] - m);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const double p = factor(f, std::exp(score[j] - m) / l);
          const float* vj = kv_row(v, f.v_batches, V, b, hk, j);
          for (int64_t c = 0; c < f.dv; ++c) acc[c] += p * factor(f, vj[c]);
        }
        for (int64_t c = 0; c < f.dv; ++c) o[c] = n ? (float)acc[c] : 0.0f;
        if (lse) lse[(b * f.heads + h) * f.t + i] = n ? (float)(m + std::log(l)) : -INFINITY;
      }
}

void flash_attention_backward(const FlashShape& f, const float* q, const float* k, const float* v, const float* out,
                              const float* dout, const float* lse, float* dq, float* dk, float* dv) {
  const Rows Q(f.q, f.heads, f.t, f.dh), K(f.k, f.kv_heads, f.s, f.dh), V(f.v, f.kv_heads, f.s, f.dv),
      O(f.o, f.heads, f.t, f.dv);
  const int64_t group = f.heads / f.kv_heads;
  FlashShape unrounded = f;  // D = dout . out is no product of the GEMMs
  unrounded.bf16 = false;
  // Sums in double, by [b, head, row, c], written out at the end.
  std::vector<double> gq(f.batch * f.heads * f.t * f.dh, 0.0), gk(f.batch * f.kv_heads * f.s * f.dh, 0.0),
      gv(f.batch * f.kv_heads * f.s * f.dv, 0.0);
  for (int64_t b = 0; b < f.batch; ++b)
    for (int64_t h = 0; h < f.heads; ++h)
      for (int64_t i = 0; i < f.t; ++i) {
        const int64_t hk = h / group, n = visible(f, b, i);
        const float* qi = q + Q.at(b, h, i);
        const float* doi = dout + O.at(b, h, i);
        const double D = dot(unrounded, doi, out + O.at(b, h, i), f.dv);
        const double row_lse = lse[(b * f.heads + h) * f.t + i];
        for (int64_t j = 0; j < n; ++j) {
          const float* kj = k + K.at(b, hk, j);
          const float* vj = v + V.at(b, hk, j);
          const double p = std::exp(f.scale * dot(f, qi, kj, f.dh) - row_lse);
          const double ds = factor(f, p * (dot(f, doi, vj, f.dv) - D));
          const double pf = factor(f, p);
          double* gvj = &gv[((b * f.kv_heads + hk) * f.s + j) * f.dv];
          for (int64_t c = 0; c < f.dv; ++c) gvj[c] += pf * factor(f, doi[c]);
          double* gqi = &gq[((b * f.heads + h) * f.t + i) * f.dh];
          double* gkj = &gk[((b * f.kv_heads + hk) * f.s + j) * f.dh];
          for (int64_t c = 0; c < f.dh; ++c) {
            gqi[c] += f.scale * ds * factor(f, kj[c]);
            gkj[c] += f.scale * ds * factor(f, qi[c]);
          }
        }
      }
  for (int64_t b = 0; b < f.batch; ++b) {
    for (int64_t h = 0; h < f.heads; ++h)
      for (int64_t i = 0; i < f.t; ++i)
        for (int64_t c = 0; c < f.dh; ++c) dq[Q.at(b, h, i) + c] = (float)gq[((b * f.heads + h) * f.t + i) * f.dh + c];
    for (int64_t h = 0; h < f.kv_heads; ++h)
      for (int64_t j = 0; j < f.s; ++j) {
        for (int64_t c = 0; c < f.dh; ++c) dk[K.at(b, h, j) + c] = (float)gk[((b * f.kv_heads + h) * f.s + j) * f.dh + c];
        for (int64_t c = 0; c < f.dv; ++c) dv[V.at(b, h, j) + c] = (float)gv[((b * f.kv_heads + h) * f.s + j) * f.dv + c];
      }
  }
}

}  // namespace qkv::ref
