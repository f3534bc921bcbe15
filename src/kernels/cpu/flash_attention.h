// Internal: the flash attention kernels (Dao et al. 2022, 2023) for the CPU.
// Their reference twin is the naive attention in src/ops/attention.cpp; the
// tests compare the two over a table of shapes and masks.
#pragma once

#include <cstdint>

namespace qkv::cpu {

// Tile sizes (queries x keys per tile): a 64 x 128 score tile is 32 KiB, and
// 128 x 128 or 128 x 256 measured no faster here.
constexpr int64_t kFlashQueryTile = 64;
constexpr int64_t kFlashKeyTile = 128;

// Where the rows of one operand lie: element strides between batches, heads
// and rows; each row's Dh (or Dv) elements are contiguous. A zero stride means
// the contiguous layout [B, heads, rows, D].
struct FlashLayout {
  int64_t batch = 0, head = 0, row = 0;
};

// q [B,H,T,Dh], k [B,Hkv,S,Dh], v [B,Hkv,S,Dv], out [B,H,T,Dv], lse [B,H,T]
// (contiguous). The layouts let q, k, v and out (with dout) lie elsewhere: the
// first S rows of a larger KV cache, or the heads side by side on each row of
// a packed [B, T, (H + 2 Hkv) Dh] projection. dq, dk, dv take the layouts of
// q, k, v.
struct FlashShape {
  int64_t batch = 0, heads = 0, kv_heads = 0, t = 0, s = 0, dh = 0, dv = 0;
  FlashLayout q, k, v, o;
  float scale = 1.0f;
  bool causal = false;
  const int64_t* key_lengths = nullptr;  // [B] or null
};

#ifdef QKV_CPU_NS  // declared inside each kernel variant; elsewhere called through cpu::kernels()
namespace QKV_CPU_NS {

// Writes out and lse (log-sum-exp of each query row's scaled scores; -inf
// for a row that sees no key, whose output is 0).
void flash_attention_forward(const FlashShape& f, const float* q, const float* k, const float* v, float* out,
                             float* lse);
// Writes every element of dq, dk and dv (the caller need not clear them): each
// task zeroes the rows it owns, then adds the tiles' contributions into them.
void flash_attention_backward(const FlashShape& f, const float* q, const float* k, const float* v, const float* out,
                              const float* dout, const float* lse, float* dq, float* dk, float* dv);

}  // namespace QKV_CPU_NS
#endif

}  // namespace qkv::cpu
