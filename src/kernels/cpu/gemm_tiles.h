// Internal to the CPU kernel variants: gemm's register tiles for a few rows
// of A against a weight read in place (src/kernels/cpu/gemm_tiles.cpp). In
// the variant's namespace, like simd.h.
#pragma once

#include "src/kernels/kernels.h"

#ifndef QKV_CPU_NS
#error "gemm_tiles.h belongs to a kernel variant: define QKV_CPU_NS (CMake does for src/kernels/cpu)"
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define QKV_HAVE_TILES 1  // without wide FMA, BLAS keeps every case
#endif

namespace qkv::cpu::QKV_CPU_NS {
#ifdef QKV_HAVE_TILES
// Up to this many rows of A (a batch of decoding steps: the streams of `qkv
// serve`, the sentences of a greedy batch; GemmArgs::inference), W's rows are
// read in place by register tiles instead of going to BLAS, which first
// copies (packs) all of W on every call: with 16 rows that copy took 40% of a
// serving step. From one row on: with one row the tiles (four rows of W at a
// time, the next block prefetched) were also faster than the GEMV, 2.17-2.23
// against 2.34-2.45 ms a step of `qkv bench streams` on the lm-20m shape, and
// with 3-4 rows twice as fast (Intel Xeon with AMX, 2026-12-05). On the avx2
// level (QKV_ISA=avx2, same machine), against the GEMV up to 4 rows and BLAS
// above: 1 row 2.25-2.28 against 2.51 ms, 4 rows 3.40 against 5.70-6.52, 16
// rows 10.2-10.5 against 11.3-11.8.
constexpr int64_t kMaxTiledRows = 64;

// C = alpha A W^T + beta C + bias for A [m, k] and W = g.b [n, k] (trans_b,
// not trans_a), m <= kMaxTiledRows: W's rows split between the threads.
void gemm_tiled(const GemmArgs& g);

// The same with W bfloat16 (raw bits) at b, row stride g.ldb (g.b is not
// read): each value widened as it is loaded, so every output gets the bits
// gemm_tiled gives over W's float32 copy, from half the bytes (gemm_bf16 on
// the levels without AVX512-BF16, in inference).
void gemm_tiled_bf16(const GemmArgs& g, const uint16_t* b);

// The same with W IEEE float16 (raw bits) at b, widened by F16C as it is
// loaded (gemm_f16).
void gemm_tiled_f16(const GemmArgs& g, const uint16_t* b);
#endif
}  // namespace qkv::cpu::QKV_CPU_NS
