// Internal to the kernel levels: gemm_bf16's packed operands (avx512 only), for a caller
// that multiplies by one operand many times and packs it once (flash
// attention packs each head's K and V once per call, not once per tile).
//
// Layout (gemm_bf16.cpp packs it, its AMX and AVX512-BF16 kernels read it):
// k in chunks of 32, held as 16 "pairs" (two bfloat16 of consecutive k in one
// 32-bit word, the lower k in the low half); rows (of A, or of B: C's
// columns) in blocks of 16, their count rounded up to even (AMX takes 32 rows
// at a time). A is [blocks][chunks][16 rows][16 pairs], one 16 x 32 tile per
// (block, chunk); B is [blocks][chunks][16 pairs][16 rows]. Both zero-padded
// to whole blocks and chunks. A block's chunks lie one after another, so a
// range of chunks (a slice of k) of an operand packed whole is a pointer
// into it with the whole operand's block stride.
#pragma once

#include <cstdint>

#include "src/kernels/kernels.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifndef QKV_CPU_NS
#error "gemm_bf16_packed.h belongs to a kernel variant: define QKV_CPU_NS (CMake does for src/kernels/cpu)"
#endif

namespace qkv::cpu::QKV_CPU_NS {

// AMX's tile configuration (palette 1): for each tile register, its rows and
// the bytes of each row. _tile_loadconfig reads it.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

#if defined(__AVX512F__)
// LDTILECFG of cfg. GCC 12 does not count the instruction as a read of cfg:
// with the function that filled cfg inlined into its caller, it kept only
// the palette byte of the stores (a zero configuration, and the first tile
// instruction faulted). The barrier makes every store happen first.
__attribute__((target("amx-tile"))) inline void load_tile_config(const TileConfig& cfg) {
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}
#endif

// Chunks of 32 along k, and blocks of 16 rows (rounded up to even).
constexpr int64_t bf16_chunks(int64_t k) { return (k + 31) / 32; }
constexpr int64_t bf16_blocks(int64_t rows) { return ((rows + 15) / 16 + 1) / 2 * 2; }
// 32-bit words of a packed operand of `rows` rows by k.
constexpr int64_t bf16_packed_words(int64_t rows, int64_t k) { return bf16_blocks(rows) * bf16_chunks(k) * 256; }

// Operands as the kernels read them: kb chunks of k from a and b; nb blocks
// of B (an even count); the stride, in words, from one block to the next.
struct PackedBf16 {
  int64_t kb = 0, nb = 0;
  const uint32_t* a = nullptr;
  int64_t a_stride = 0;
  const uint32_t* b = nullptr;
  int64_t b_stride = 0;
};

// g's A (m x k), or B (n x k), as packed, into `out` (bf16_packed_words of it):
// rounded to bfloat16 when given in float32, turned round when transposed.
void pack_bf16_a(const GemmBf16Args& g, uint32_t* out);
void pack_bf16_b(const GemmBf16Args& g, uint32_t* out);
// C = alpha * A B^T + beta * C + bias with g's m, n, k, alpha, beta, c, ldc
// and bias, and A and B from pk (g's operand fields are not read): AMX tiles
// where usable (above 4 rows), else AVX512-BF16.
void gemm_bf16_packed(const GemmBf16Args& g, const PackedBf16& pk);
// Whether the three above run here: on the avx512 level of a CPU with AMX-BF16
// or AVX512-BF16. (The lower levels define them only to fail: callers ask first.)
bool bf16_packed_usable();

}  // namespace qkv::cpu::QKV_CPU_NS
