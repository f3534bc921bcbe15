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
#endif
}  // namespace qkv::cpu::QKV_CPU_NS
