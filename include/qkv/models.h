// qkv/models.h — whole models built from a config.
//
// TranslationTransformer (arch "transformer"): the encoder-decoder of
// Vaswani et al. 2017 for sequence-to-sequence translation.
//   memory = Encoder(embed(src) * sqrt(D) + PE)          [B, S, D]
//   logits = Decoder(embed(<bos> y) * sqrt(D) + PE, memory) W_out   [B, T, V]
// The decoder's self-attention is causal; its cross-attention sees the
// source up to each sentence's length.
#pragma once

#include <string>
#include <vector>

#include "qkv/blocks.h"

namespace qkv {

struct TransformerConfig {
  std::string arch = "transformer";
  int64_t vocab_size = 0;  // one joint vocabulary for source and target (shared embedding)
  int64_t d_model = 128;
  int64_t nhead = 4;
  int64_t num_encoder_layers = 2;
  int64_t num_decoder_layers = 2;
  int64_t dim_feedforward = 512;
  float dropout = 0.1f;
  std::string activation = "relu";  // relu | gelu | gelu_tanh | silu
  bool norm_first = true;
  std::string norm = "layernorm";   // layernorm | rmsnorm
  std::string mlp = "dense";        // dense | swiglu | moe
  bool qk_norm = false;
  std::string positions = "sinusoidal";  // sinusoidal | learned | rope
  int64_t max_len = 256;
  bool tie_output = true;  // output projection = embedding^T
  MoEOptions moe;

  // From config.json (unknown keys are an error, each value checked).
  static TransformerConfig from_json(const std::string& text, const std::string& source);
  std::string to_json() const;
  TransformerLayerOptions layer_options() const;
};

// Everything the decoder keeps between steps: a self-attention KV cache per
// layer and each layer's cross-attention K and V of the source, computed once.
struct DecoderState {
  std::vector<KVCache> self;
  std::vector<std::pair<Tensor, Tensor>> cross;
  Tensor src_lengths;
  int64_t position = 0;  // target tokens consumed so far
};

class TranslationTransformer : public Module {
public:
  TranslationTransformer(const TransformerConfig& config, Rng& rng);
  // src [B, S] ids, src_lengths I64 [B] -> memory [B, S, D]
  Tensor encode(const Tensor& src, const Tensor& src_lengths);
  // tgt_in [B, T] ids starting with <bos> -> logits [B, T, V]
  Tensor decode(const Tensor& tgt_in, const Tensor& memory, const Tensor& src_lengths);
  // Incremental decoding: start_decoding sizes the caches for `capacity`
  // target tokens; decode_step feeds new tokens ids [B, T] (usually T = 1)
  // and returns their logits [B, T, V], equal to decode() on the whole prefix.
  DecoderState start_decoding(const Tensor& memory, const Tensor& src_lengths, int64_t capacity);
  Tensor decode_step(const Tensor& ids, DecoderState& state, bool need_cross_weights = false);
  // The sum of the MoE layers' load-balancing losses of the last forward (undefined without MoE).
  Tensor aux_loss() const;
  const TransformerConfig& config() const { return config_; }

  std::shared_ptr<Embedding> embed;
  std::shared_ptr<LearnedPositionalEmbedding> positions;
  std::vector<std::shared_ptr<TransformerEncoderLayer>> encoder_layers;
  std::vector<std::shared_ptr<TransformerDecoderLayer>> decoder_layers;
  std::shared_ptr<Norm> encoder_norm, decoder_norm;  // Pre-Norm only
  std::shared_ptr<Linear> output_proj;               // untied only
  std::shared_ptr<Dropout> dropout;

private:
  Tensor embed_tokens(const Tensor& ids, int64_t offset);
  TransformerConfig config_;
};

}  // namespace qkv
