// qkv/lm.h — the decoder-only language model: the modern variants together.
//
//   x      = E[ids] (+ P[positions] for learned or sinusoidal positions)
//   blocks   L causal self-attention + MLP layers (Pre-Norm or Post-Norm,
//            LayerNorm or RMSNorm, QK-Norm, RoPE, grouped-query heads,
//            dense / SwiGLU / Mixture-of-Experts MLP)
//   logits = norm(x) E^T   (tied; or a separate output projection)
#pragma once

#include <string>
#include <vector>

#include "qkv/blocks.h"

namespace qkv {

// The block keys (BlockConfig: d_model, nhead, ..., positions, norm) with the
// decoder's defaults, plus its own.
struct DecoderConfig : BlockConfig {
  int64_t vocab_size = 0;
  int64_t num_layers = 4;
  int64_t context = 256;  // the longest sequence (learned positions' table size)
  DecoderConfig() {
    dim_feedforward = 512, dropout = 0.0f, activation = Activation::Gelu, norm = NormKind::RMSNorm;
    mlp = MLPKind::SwiGLU, positions = PositionKind::Rope;
  }
  // Unknown keys and bad values are errors naming `source`; "train" and "tokenizer" are skipped.
  static DecoderConfig from_json(const std::string& text, const std::string& source);
  std::string to_json() const;
};

// Parameters: embed.weight [V, D], positions.weight [context, D] (learned),
// layers.i.* (TransformerEncoderLayer run causally), norm.* (Pre-Norm),
// output_proj.weight [V, D] (untied).
class DecoderLM : public Module {
public:
  DecoderLM(const DecoderConfig& config, Rng& rng);
  // ids [B, T] -> logits [B, T, V]; position t sees tokens 0..t. With
  // need_weights every layer keeps its masked self-attention weights
  // [B, H, T, T] (layers[i]->last_self_weights; the naive attention path).
  Tensor forward(const Tensor& ids, bool need_weights = false);
  // One KV cache per layer for `capacity` positions.
  std::vector<KVCache> make_caches(int64_t batch, int64_t capacity) const;
  // ids [B, T] at positions caches[0].length .. +T-1 -> logits [B, T, V]:
  // the prompt at once (prefill), then one token at a time. With last_only,
  // the logits of the last position only, [B, 1, V]: a prefill that draws
  // its next token from there skips the output head for the others (a
  // 128-token prefill at lm-100m's shape 7-18% faster; llama.cpp and
  // transformers' generate keep the last position's only too).
  Tensor forward_cached(const Tensor& ids, std::vector<KVCache>& caches, bool last_only = false);
  // One decoding step of B independent sequences (continuous batching): ids
  // [B, 1], row b the next token of the sequence whose caches are *rows[b]
  // (make_caches(1, ...), each at its own length) -> logits [B, 1, V]. Every
  // matrix product runs once for all rows; attention runs per row.
  Tensor forward_cached_rows(const Tensor& ids, const std::vector<std::vector<KVCache>*>& rows);
  // Several sequences' new tokens in one pass, each at its own positions
  // (continuous batching's prefill): ids [1, N] hold lengths[0] tokens of
  // the sequence whose caches are *rows[0], then lengths[1] of *rows[1]'s,
  // and so on, packed without padding. Every matrix product runs once over
  // all N positions (8 prompts of 109 tokens at lm-20m's shape 1.18-1.23x faster
  // than one at a time); attention runs per sequence. Returns the last
  // layer's output [1, N, D]; logits() of the positions wanted gives theirs.
  Tensor forward_cached_packed(const Tensor& ids, const std::vector<int64_t>& lengths,
                               const std::vector<std::vector<KVCache>*>& rows);
  // The final norm and the output projection: x [..., D] -> logits [..., V].
  Tensor logits(const Tensor& x);
  // The MoE layers' load-balancing losses of the last forward (undefined without MoE).
  Tensor aux_loss() const;
  const DecoderConfig& config() const { return config_; }
  std::string summary() const;
  // The bytes of weights one decoding step reads: every parameter, except
  // that a tied head converted to bf16 or int8 reads its copy (TiedHead), and
  // the embedding only by rows.
  uint64_t decode_bytes() const;

  std::shared_ptr<Embedding> embed;
  std::shared_ptr<LearnedPositionalEmbedding> positions;
  std::vector<std::shared_ptr<TransformerEncoderLayer>> layers;
  std::shared_ptr<Norm> norm;
  std::shared_ptr<Linear> output_proj;
  std::shared_ptr<Dropout> dropout;

protected:
  void linear_weights_converted(DType dtype) override;

private:
  Tensor embed_tokens(const Tensor& ids, int64_t offset);
  // Whether sequences of `length` tokens run under Bf16AutocastGuard:
  // bfloat16 weights and a length enough for bfloat16 attention, or a guard already on.
  bool bf16_attention(int64_t length) const;
  DecoderConfig config_;
  TiedHead tied_head_;  // with tie_output
};

}  // namespace qkv
