// Internal to the CPU kernel variants: what the low-precision GEMMs share.
// Their per-element epilogue, and a product of operands that are first
// turned into float32 (bfloat16 or float16 widened, int8 dequantized), then
// multiplied by this level's float32 gemm (its thread split, GEMV and bias
// epilogue). In the variant's namespace, like scratch.h.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "src/kernels/cpu/scratch.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {

// In an unnamed namespace: an instance of a template with external linkage
// would be a weak symbol scripts/check_kernel_variants.sh refuses.
namespace {

// The epilogue of one element of the low-precision GEMMs (GemmBf16Args,
// GemmF16Args, GemmInt8Args: the same alpha, beta, c, ldc and bias):
// C[i, j] from the float32 sum of row i of A and row j of B.
template <class Args>
inline void finish(const Args& g, int64_t i, int64_t j, float sum) {
  float& c = g.c[i * g.ldc + j];
  c = (g.beta == 0.0f ? g.alpha * sum : g.alpha * sum + g.beta * c) + (g.bias ? g.bias[j] : 0.0f);
}

// An empty sum (k == 0): C = beta * C + bias.
template <class Args>
void scale_only(const Args& g) {
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) finish(g, i, j, 0.0f);
}

}  // namespace

// row(r) for r in [0, rows), split between threads when there are enough
// values (rows x k) to pay for them.
template <class Row>
void for_rows(int64_t rows, int64_t k, Row&& row) {
  const bool threads = !omp_in_parallel() && rows > 1 && rows * k >= (1 << 16);
#pragma omp parallel for schedule(static) if (threads)
  for (int64_t r = 0; r < rows; ++r) row(r);
}

// C = alpha * A B^T + beta * C + bias with the shape, C and epilogue of `g`
// (its a and b are ignored): a_row(i, out) writes row i of A as g.k floats,
// b_row(j, out) row j of B. A is made whole, B in panels of about 4 MB, each
// multiplied as soon as it is made.
template <class ARow, class BRow>
void gemm_on_float_copies(GemmArgs g, ARow&& a_row, BRow&& b_row) {
  Scratch a(g.m * g.k);
  for_rows(g.m, g.k, [&](int64_t i) { a_row(i, a.data() + i * g.k); });
  const int64_t n = g.n, panel = std::min(std::max<int64_t>((int64_t{1} << 20) / std::max<int64_t>(g.k, 1), 16), n);
  Scratch b(panel * g.k);
  float* c = g.c;
  const float* bias = g.bias;
  g.trans_a = false, g.trans_b = true, g.a = a.data(), g.lda = g.k, g.b = b.data(), g.ldb = g.k;
  for (int64_t j0 = 0; j0 < n; j0 += panel) {
    g.n = std::min(panel, n - j0);
    for_rows(g.n, g.k, [&](int64_t j) { b_row(j0 + j, b.data() + j * g.k); });
    g.c = c + j0;
    g.bias = bias ? bias + j0 : nullptr;
    gemm(g);
  }
}

}  // namespace qkv::cpu::QKV_CPU_NS
