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

// q [B,H,T,Dh], k [B,Hkv,S,Dh], v [B,Hkv,S,Dv], out [B,H,T,Dv], lse [B,H,T]; contiguous,
// except that consecutive (batch, head) blocks of k and v may lie kv_head_stride
// elements apart (>= S*Dh): the first S rows of a larger KV cache, read in place.
struct FlashShape {
  int64_t batch = 0, heads = 0, kv_heads = 0, t = 0, s = 0, dh = 0, dv = 0;
  int64_t k_head_stride = 0, v_head_stride = 0;  // 0: S*Dh and S*Dv (contiguous)
  float scale = 1.0f;
  bool causal = false;
  const int64_t* key_lengths = nullptr;  // [B] or null
};

// Writes out and lse (log-sum-exp of each query row's scaled scores; -inf
// for a row that sees no key, whose output is 0).
void flash_attention_forward(const FlashShape& f, const float* q, const float* k, const float* v, float* out,
                             float* lse);
// dq, dk, dv must be zeroed by the caller; gradients are added into them.
void flash_attention_backward(const FlashShape& f, const float* q, const float* k, const float* v, const float* out,
                              const float* dout, const float* lse, float* dq, float* dk, float* dv);

}  // namespace qkv::cpu
