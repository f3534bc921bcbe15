// Reference GEMM: the textbook triple loop, accumulated in double.
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "qkv/dtype.h"
#include "src/kernels/kernels.h"

namespace qkv::ref {

void gemm(const GemmArgs& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        float a = g.trans_a ? g.a[p * g.lda + i] : g.a[i * g.lda + p];
        float b = g.trans_b ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
        acc += (double)a * b;
      }
      float& c = g.c[i * g.ldc + j];
      c = (float)(g.alpha * acc + (g.beta == 0.0f ? 0.0 : (double)g.beta * c) + (g.bias ? g.bias[j] : 0.0f));
      if (g.addend) c += g.addend[i * g.ld_addend + j];
      if (g.act_out) unary_forward(g.act, &c, g.act_out + i * g.ld_act + j, 1);
    }
  }
}

// Element (i, p) of A and (j, p) of B as the bfloat16 GemmBf16Args describes
// (rounded when given in float32), widened back to float.
static float bf16_a(const GemmBf16Args& g, int64_t i, int64_t p) {
  const int64_t at = g.a_transposed ? p * g.lda + i : i * g.lda + p;
  return bf16_to_float(g.a_f32 ? float_to_bf16(g.a_f32[at]) : g.a[at]);
}
static float bf16_b(const GemmBf16Args& g, int64_t j, int64_t p) {
  const int64_t at = g.b_transposed ? p * g.ldb + j : j * g.ldb + p;
  return bf16_to_float(g.b_f32 ? float_to_bf16(g.b_f32[at]) : g.b[at]);
}

void gemm_bf16(const GemmBf16Args& g) {
  for (int64_t i = 0; g.a_sums && i < g.m; ++i) {
    double s = 0;
    for (int64_t p = 0; p < g.k; ++p) s += g.a_f32[g.a_transposed ? p * g.lda + i : i * g.lda + p];
    g.a_sums[i] = (float)s;
  }
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < g.k; ++p) acc += (double)bf16_a(g, i, p) * bf16_b(g, j, p);
      if (g.c_bf16) {  // C in bfloat16: read widened, written rounded
        uint16_t& c = g.c_bf16[i * g.ldc + j];
        const double old = g.beta == 0.0f ? 0.0 : (double)g.beta * bf16_to_float(c);
        float v = (float)(g.alpha * acc + old + (g.bias ? g.bias[j] : 0.0f));
        if (g.has_act) unary_forward(g.act, &v, &v, 1);
        c = float_to_bf16(v);
        continue;
      }
      float& c = g.c[i * g.ldc + j];
      c = (float)(g.alpha * acc + (g.beta == 0.0f ? 0.0 : (double)g.beta * c) + (g.bias ? g.bias[j] : 0.0f));
      if (g.act_out) unary_forward(g.act, &c, g.act_out + i * g.ld_act + j, 1);
    }
  }
}

const char* gemm_bf16_path() { return "reference (float64 sums)"; }

// The reference reads B as it lies (b_packed is never read).
int64_t gemm_bf16_packed_b_words(int64_t, int64_t) { return 0; }
void gemm_bf16_pack_b(const GemmBf16Args&, uint32_t*) { std::abort(); }  // callers ask for the words first
void gemm_bf16_unpack_b(int64_t, int64_t, const uint32_t*, uint16_t*) { std::abort(); }

// Each row of A quantized per block of 32 (as qkv/dtype.h says), then every
// product of the two int8 values scaled by both scales, summed in double.
void gemm_f16(const GemmF16Args& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < g.k; ++p) acc += (double)g.a[i * g.lda + p] * half_to_float(g.b[j * g.ldb + p]);
      float& c = g.c[i * g.ldc + j];
      c = (float)(g.alpha * acc + (g.beta == 0.0f ? 0.0 : (double)g.beta * c) + (g.bias ? g.bias[j] : 0.0f));
    }
  }
}

void gemm_int8(const GemmInt8Args& g) {
  const int64_t kb = (g.k + kInt8Block - 1) / kInt8Block;
  std::vector<int8_t> qa(g.k);
  std::vector<float> da(kb);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t p0 = b * kInt8Block, len = std::min(kInt8Block, g.k - p0);
      da[b] = int8_block_scale(g.a + i * g.lda + p0, len);
      int8_quantize(g.a + i * g.lda + p0, len, da[b], qa.data() + p0);
    }
    for (int64_t j = 0; j < g.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < g.k; ++p)
        acc += (double)qa[p] * g.b[j * g.ldb + p] * da[p / kInt8Block] * g.scales[j * g.ld_scale + p / kInt8Block];
      float& c = g.c[i * g.ldc + j];
      c = (float)(g.alpha * acc + (g.beta == 0.0f ? 0.0 : (double)g.beta * c) + (g.bias ? g.bias[j] : 0.0f));
    }
  }
}

const char* gemm_decode_path() { return "reference (float64 sums)"; }
const char* gemm_f32_path() { return "reference (float64 sums)"; }

const char* gemm_f16_path() { return "reference (float64 sums)"; }

const char* gemm_int8_path() { return "reference (float64 sums)"; }

void gemm_batched(const GemmArgs& g, int64_t batch, const int64_t* a_offsets, const int64_t* b_offsets,
                  int64_t c_stride) {
  for (int64_t i = 0; i < batch; ++i) {
    GemmArgs p = g;
    p.a = g.a + a_offsets[i], p.b = g.b + b_offsets[i], p.c = g.c + i * c_stride;
    gemm(p);  // k == 0: the loop above writes alpha * 0
  }
}

}  // namespace qkv::ref
