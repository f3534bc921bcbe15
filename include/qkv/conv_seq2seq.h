// qkv/conv_seq2seq.h — ConvSeq2Seq (arch "conv"): a small convolutional
// sequence-to-sequence model in the manner of Gehring et al. 2017, so that
// convolution, recurrence and attention can be compared on one corpus.
//
//   conv_k(x)_t = W [x_{t-a}; ...; x_{t+b}] + bias   (k taps; a = b = (k-1)/2 in
//                the encoder, a = k-1, b = 0 in the decoder: causal)
//   GLU(u, g)  = u * sigmoid(g)
//   encoder layer:  x = x + GLU(conv_k(norm(x)))
//   decoder layer:  x = x + GLU(causal conv_k(norm1(x)));  x = x + CrossAttn(norm2(x), memory)
// Each layer sees k positions; L layers see L (k - 1) + 1. The decoder keeps
// its last k - 1 conv inputs per layer between steps (its cache), and the
// cross-attention K/V of the source once per sentence.
#pragma once

#include "qkv/models.h"

namespace qkv {

struct ConvSeq2SeqConfig {
  int64_t vocab_size = 0;
  int64_t d_model = 128;
  int64_t kernel_size = 3;  // odd
  int64_t num_encoder_layers = 3;
  int64_t num_decoder_layers = 3;
  int64_t nhead = 1;        // heads of the decoder's cross-attention
  float dropout = 0.1f;
  static ConvSeq2SeqConfig from_json(const std::string& text, const std::string& source);
  std::string to_json() const;
};

// y [B, T, 2D -> D] = GLU(conv_k(x)), with left/right zero padding.
class GatedConv : public Module {
public:
  GatedConv(int64_t dim, int64_t kernel_size, Rng& rng);
  // x [B, T, D] -> [B, T, D]; `left` + `right` = k - 1 zero positions around x.
  Tensor forward(const Tensor& x, int64_t left, int64_t right) const;
  // x [B, k, D] exactly one window -> [B, 1, D].
  Tensor forward_window(const Tensor& window) const;
  std::shared_ptr<Linear> proj;  // [2D, k D]
  int64_t kernel_size;
};

struct ConvDecodeState : DecodeState {
  std::vector<Tensor> windows;                   // per layer: the last k-1 conv inputs [B, k-1, D]
  std::vector<std::pair<Tensor, Tensor>> cross;  // per layer: cross-attention K, V
  Tensor src_lengths;
};

class ConvSeq2Seq : public Seq2Seq {
public:
  ConvSeq2Seq(const ConvSeq2SeqConfig& config, Rng& rng);
  Tensor forward(const Tensor& src, const Tensor& src_lengths, const Tensor& tgt_in) override;
  std::unique_ptr<DecodeState> start_decoding(const Tensor& src, const Tensor& src_lengths, int64_t capacity) override;
  Tensor decode_step(const Tensor& ids, DecodeState& state, bool need_weights = false) override;
  Tensor cross_weights() const override;
  std::string attention_name() const override;
  void select_rows(DecodeState& state, const std::vector<int64_t>& rows) override;
  std::string config_json() const override { return config_.to_json(); }
  const ConvSeq2SeqConfig& config() const { return config_; }
  std::string summary() const override;

  std::shared_ptr<Embedding> embed;
  std::vector<std::shared_ptr<GatedConv>> encoder_convs, decoder_convs;
  std::vector<std::shared_ptr<LayerNorm>> encoder_norms, decoder_norms1, decoder_norms2;
  std::vector<std::shared_ptr<MultiheadAttention>> cross_attn;
  std::shared_ptr<LayerNorm> encoder_norm, decoder_norm;
  std::shared_ptr<Dropout> dropout;

private:
  Tensor encode(const Tensor& src, const Tensor& src_lengths);
  Tensor embed_tokens(const Tensor& ids, int64_t offset);
  Tensor logits_of(const Tensor& x);
  ConvSeq2SeqConfig config_;
  Tensor last_weights_;
};

}  // namespace qkv
