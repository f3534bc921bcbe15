// qkv/attention.h — scaled dot-product attention, naive and flash.
//
//   Attention(Q, K, V) = softmax(Q K^T / sqrt(Dh) + mask) V
//
// Shapes: q [B, H, T, Dh], k [B, Hkv, S, Dh], v [B, Hkv, S, Dv] -> [B, H, T, Dv].
// H must be a multiple of Hkv: query heads h*G ... h*G+G-1 share key/value
// head h (grouped-query attention; G = 1 is ordinary multi-head attention).
//
// Masks (a masked score is -inf before the softmax; a query that sees no key
// at all gets a zero output, never NaN):
//   causal             query i sees keys j <= i + (S - T): aligned at the
//                      bottom right, so T new queries over a cache of S keys
//                      see their own past (equal to the usual tril when T == S).
//   key_padding_lengths  I64 [B]: keys at positions >= length are padding.
//   attn_mask          U8 (nonzero = masked, as PyTorch's boolean mask True)
//                      or F32 (added to the scores), broadcastable to [B, H, T, S].
//
// Two implementations:
//   Naive  materializes the [B, H, T, S] scores; the reference, and the only
//          one that can return the attention weights (for pictures).
//   Flash  tiles queries and keys with an online softmax and saves one
//          log-sum-exp per query row; the backward recomputes the tiles from
//          it. Extra memory O(T + S) per thread, never an N x N buffer.
//          Supports causal and key padding masks (not attn_mask).
// Auto picks Flash whenever it can (no attn_mask, no dropout).
#pragma once

#include "qkv/tensor.h"

namespace qkv {

enum class AttentionImpl { Auto, Naive, Flash };

struct AttentionOptions {
  bool causal = false;
  Tensor key_padding_lengths;  // I64 [B], or undefined
  Tensor attn_mask;            // U8 or F32 broadcastable to [B, H, T, S], or undefined
  float scale = 0.0f;          // 0: 1 / sqrt(Dh)
  AttentionImpl impl = AttentionImpl::Auto;
  float dropout = 0.0f;        // on the attention weights (naive path); needs `rng`
  Rng* rng = nullptr;
};

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

// Self-attention straight from a packed projection: qkv [B, T, (H + 2 Hkv) Dh]
// holds each row's q (H heads), k and v (Hkv heads each) side by side, as one
// fused projection writes them. Returns [B, T, H Dh], the heads side by side
// again. The same values and gradients as splitting qkv into heads and calling
// scaled_dot_product_attention, without the copies into and out of the
// [B, H, T, Dh] layout on the flash path (which reads and writes the packed
// rows in place, and writes dqkv in one buffer).
Tensor packed_self_attention(const Tensor& qkv, int64_t heads, int64_t kv_heads, const AttentionOptions& options = {});

// Decoding B sequences together, each with a KV cache of its own: row b's
// one query q[b] ([B, H, 1, Dh]) against all of keys[b] and values[b]
// ([1, Hkv, S_b, Dh] and [1, Hkv, S_b, Dv], views of the caches, which may
// differ in length). Returns [B, H, 1, Dv], as B calls of
// scaled_dot_product_attention would, but in one call of the flash kernel
// over every (row, head), reading each cache where it lies. (With a gradient
// to compute, under bfloat16 autocast, or caches of different layouts, it
// makes those B calls.)
Tensor cached_rows_attention(const Tensor& q, const std::vector<Tensor>& keys, const std::vector<Tensor>& values,
                             float scale = 0.0f);

// The naive path, also returning the attention weights [B, H, T, S].
struct AttentionWithWeights {
  Tensor out;
  Tensor weights;
};
AttentionWithWeights attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const AttentionOptions& options = {});

}  // namespace qkv
