// Internal to the CPU kernel variants: qkv's own float32 GEMM for products of
// more rows than decoding's (src/kernels/cpu/gemm_panels.cpp). In the
// variant's namespace, like simd.h.
#pragma once

#include "src/kernels/kernels.h"

#ifndef QKV_CPU_NS
#error "gemm_panels.h belongs to a kernel variant: define QKV_CPU_NS (CMake does for src/kernels/cpu)"
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define QKV_HAVE_PANELS 1  // the generic level leaves every product to BLAS
#endif

namespace qkv::cpu::QKV_CPU_NS {
#ifdef QKV_HAVE_PANELS
// The smallest product (m n k) the panels take: below it, BLAS.
constexpr int64_t kPanelWork = 1 << 18;

// C = alpha op(A) op(B) + beta C + bias, then act_out = act(C) where asked:
// all of g on the calling thread (gemm splits C between the threads).
void gemm_panels(const GemmArgs& g);
// What gemm_f32_path says of them.
const char* panels_path();

// The same product with B packed beforehand, for a caller that multiplies
// one B by many A (flash attention's key and value tiles, each met by every
// query tile): panels_b_floats(n, k) floats, which panels_pack_b(g) fills
// from g's B (g.b, ldb, trans_b, n and k; the other fields unused), and
// gemm_panels_packed_b reads in place of g.b. The whole of B in one block:
// meant for B of L2's size or less.
int64_t panels_b_floats(int64_t n, int64_t k);
void panels_pack_b(const GemmArgs& g, float* out);
void gemm_panels_packed_b(const GemmArgs& g, const float* packed_b);
#endif
}  // namespace qkv::cpu::QKV_CPU_NS
