// The convolutional sequence-to-sequence model (see qkv/conv_seq2seq.h).
#include "qkv/conv_seq2seq.h"

#include <cmath>
#include "qkv/position.h"
#include "src/config/fields.h"

namespace qkv {

static const config::Fields<ConvSeq2SeqConfig>& conv_fields() {
  using C = ConvSeq2SeqConfig;
  static const config::Fields<C> fields =
      config::Fields<C>()
          .constant("arch", "conv")
          .add("vocab_size", &C::vocab_size).at_least(0).at_most(config::limits::kVocab)
          .add("d_model", &C::d_model).at_least(1).at_most(config::limits::kWidth)
          .add("kernel_size", &C::kernel_size).at_least(1).at_most(config::limits::kWidth)
          .add("nhead", &C::nhead).at_least(1).at_most(config::limits::kHeads)
          .add("num_encoder_layers", &C::num_encoder_layers).at_least(1).at_most(config::limits::kLayers)
          .add("num_decoder_layers", &C::num_decoder_layers).at_least(1).at_most(config::limits::kLayers)
          .add("dropout", &C::dropout).fraction()
          .skip("train");
  return fields;
}

ConvSeq2SeqConfig ConvSeq2SeqConfig::from_json(const std::string& text, const std::string& source) {
  ConvSeq2SeqConfig c = conv_fields().parse(text, source);
  QKV_CHECK(c.kernel_size % 2 == 1, source, ": kernel_size must be odd, got ", c.kernel_size);
  QKV_CHECK(c.d_model % c.nhead == 0, source, ": d_model ", c.d_model, " must be a positive multiple of nhead ",
            c.nhead);
  return c;
}

std::string ConvSeq2SeqConfig::to_json() const { return conv_fields().write(*this).dump(2) + "\n"; }

GatedConv::GatedConv(int64_t dim, int64_t k, Rng& rng) : kernel_size(k) {
  proj = register_module("proj", std::make_shared<Linear>(LinearOptions{k * dim, 2 * dim}, rng));
}

// The k shifted copies of x side by side (im2col): [B, T, k D], one matmul away from the convolution.
Tensor GatedConv::forward(const Tensor& x, int64_t left, int64_t right) const {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2);
  std::vector<Tensor> parts;
  if (left) parts.push_back(Tensor::zeros({B, left, D}));
  parts.push_back(x);
  if (right) parts.push_back(Tensor::zeros({B, right, D}));
  Tensor padded = parts.size() == 1 ? x : concat(parts, 1);
  std::vector<Tensor> taps;
  for (int64_t j = 0; j < kernel_size; ++j) taps.push_back(padded.slice(1, j, j + T));
  std::vector<Tensor> ug = split(proj->forward(concat(taps, -1)), {D, D}, -1);
  return mul(ug[0], sigmoid(ug[1]));
}

Tensor GatedConv::forward_window(const Tensor& window) const {
  const int64_t B = window.size(0), D = window.size(2);
  std::vector<Tensor> ug = split(proj->forward(window.reshape({B, 1, kernel_size * D})), {D, D}, -1);
  return mul(ug[0], sigmoid(ug[1]));
}

ConvSeq2Seq::ConvSeq2Seq(const ConvSeq2SeqConfig& c, Rng& rng) : config_(c) {
  QKV_CHECK(c.vocab_size > 4, "conv: vocab_size must be set (got ", c.vocab_size, ")");
  const int64_t D = c.d_model;
  embed = register_module("embed", std::make_shared<Embedding>(c.vocab_size, D, rng));
  normal_(embed->weight, rng, 1.0f / std::sqrt((float)D));
  for (int64_t i = 0; i < c.num_encoder_layers; ++i) {
    std::string p = "encoder.layers." + std::to_string(i);
    encoder_norms.push_back(register_module(p + ".norm", std::make_shared<LayerNorm>(D)));
    encoder_convs.push_back(register_module(p + ".conv", std::make_shared<GatedConv>(D, c.kernel_size, rng)));
  }
  for (int64_t i = 0; i < c.num_decoder_layers; ++i) {
    std::string p = "decoder.layers." + std::to_string(i);
    decoder_norms1.push_back(register_module(p + ".norm1", std::make_shared<LayerNorm>(D)));
    decoder_convs.push_back(register_module(p + ".conv", std::make_shared<GatedConv>(D, c.kernel_size, rng)));
    decoder_norms2.push_back(register_module(p + ".norm2", std::make_shared<LayerNorm>(D)));
    cross_attn.push_back(register_module(
        p + ".cross_attn",
        std::make_shared<MultiheadAttention>(
            MultiheadAttentionOptions{.d_model = D, .nhead = c.nhead, .dropout = c.dropout, .cross_attention = true},
            rng)));
  }
  encoder_norm = register_module("encoder.norm", std::make_shared<LayerNorm>(D));
  decoder_norm = register_module("decoder.norm", std::make_shared<LayerNorm>(D));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout, rng.next_bits()));
}

Tensor ConvSeq2Seq::embed_tokens(const Tensor& ids, int64_t offset) {
  Tensor x = scale(embed->forward(ids), std::sqrt((float)config_.d_model));
  return dropout->forward(add(x, sinusoidal_encoding(ids.size(1), config_.d_model, offset)));
}

Tensor ConvSeq2Seq::logits_of(const Tensor& x) { return matmul(decoder_norm->forward(x), embed->weight.transpose(0, 1)); }

Tensor ConvSeq2Seq::encode(const Tensor& src, const Tensor& src_lengths) {
  const int64_t B = src.size(0), S = src.size(1), half = (config_.kernel_size - 1) / 2;
  std::vector<int64_t> lengths = src_lengths.to_ints();
  std::vector<float> keep(B * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) keep[b * S + t] = t < lengths[b] ? 1.0f : 0.0f;
  Tensor mask = Tensor::from_vector(keep, {B, S, 1});  // padding must not leak into the convolutions
  Tensor x = mul(embed_tokens(src, 0), mask);
  for (size_t i = 0; i < encoder_convs.size(); ++i)
    x = mul(add(x, dropout->forward(encoder_convs[i]->forward(encoder_norms[i]->forward(x), half, half))), mask);
  return encoder_norm->forward(x);
}

Tensor ConvSeq2Seq::forward(const Tensor& src, const Tensor& src_lengths, const Tensor& tgt_in) {
  Tensor memory = encode(src, src_lengths);
  Tensor x = embed_tokens(tgt_in, 0);
  for (size_t i = 0; i < decoder_convs.size(); ++i) {
    x = add(x, dropout->forward(decoder_convs[i]->forward(decoder_norms1[i]->forward(x), config_.kernel_size - 1, 0)));
    x = add(x, dropout->forward(
                   cross_attn[i]->forward(decoder_norms2[i]->forward(x), memory, {.key_padding_lengths = src_lengths}).out));
  }
  return logits_of(x);
}

std::unique_ptr<DecodeState> ConvSeq2Seq::start_decoding(const Tensor& src, const Tensor& src_lengths, int64_t) {
  Tensor memory = encode(src, src_lengths);
  auto st = std::make_unique<ConvDecodeState>();
  st->src_lengths = src_lengths;
  for (size_t i = 0; i < decoder_convs.size(); ++i) {
    // Before the first token the window holds the causal zero padding.
    st->windows.push_back(Tensor::zeros({src.size(0), config_.kernel_size - 1, config_.d_model}));
    st->cross.push_back(cross_attn[i]->project_kv(memory, 0));
  }
  return st;
}

Tensor ConvSeq2Seq::decode_step(const Tensor& ids, DecodeState& base, bool need_weights) {
  auto& st = dynamic_cast<ConvDecodeState&>(base);
  const int64_t T = ids.size(1);
  std::vector<Tensor> logits;
  for (int64_t t = 0; t < T; ++t) {
    Tensor x = embed_tokens(ids.slice(1, t, t + 1), st.position);  // [B, 1, D]
    for (size_t i = 0; i < decoder_convs.size(); ++i) {
      Tensor window = concat({st.windows[i], decoder_norms1[i]->forward(x)}, 1);  // [B, k, D]
      x = add(x, decoder_convs[i]->forward_window(window));
      st.windows[i] = window.slice(1, 1, config_.kernel_size).contiguous();
      Tensor q = cross_attn[i]->project_q(decoder_norms2[i]->forward(x), 0);
      AttentionOutput o = cross_attn[i]->attend(q, st.cross[i].first, st.cross[i].second,
                                                {.key_padding_lengths = st.src_lengths, .need_weights = need_weights});
      if (need_weights && i + 1 == decoder_convs.size()) last_weights_ = o.weights;
      x = add(x, o.out);
    }
    st.position += 1;
    logits.push_back(logits_of(x));
  }
  return T == 1 ? logits[0] : concat(logits, 1);
}

Tensor ConvSeq2Seq::cross_weights() const {
  QKV_CHECK(last_weights_.defined(), "conv: no attention weights; decode with need_weights");
  return mean(last_weights_, {1}).reshape({last_weights_.size(0), last_weights_.size(3)});
}

std::string ConvSeq2Seq::attention_name() const {
  return "cross-attention of the last convolutional decoder layer, mean of " + std::to_string(config_.nhead) +
         " head" + (config_.nhead > 1 ? "s" : "");
}

void ConvSeq2Seq::select_rows(DecodeState& base, const std::vector<int64_t>& rows) {
  auto& st = dynamic_cast<ConvDecodeState&>(base);
  for (Tensor& w : st.windows) w = qkv::select_rows(w, rows);
  for (auto& [k, v] : st.cross) {
    k = qkv::select_rows(k, rows);
    v = qkv::select_rows(v, rows);
  }
  st.src_lengths = qkv::select_rows(st.src_lengths, rows);
}

std::string ConvSeq2Seq::summary() const {
  return "conv: d_model " + std::to_string(config_.d_model) + ", kernel " + std::to_string(config_.kernel_size) + ", " +
         std::to_string(config_.num_encoder_layers) + "+" + std::to_string(config_.num_decoder_layers) +
         " gated convolution layers, " + std::to_string(parameter_count()) + " parameters, vocabulary " +
         std::to_string(config_.vocab_size);
}

}  // namespace qkv
