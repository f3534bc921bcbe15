// The RNN encoder-decoder with additive attention (see qkv/models.h for the formulas).
#include <cmath>
#include "qkv/models.h"
#include "src/config/fields.h"

namespace qkv {

static const config::Fields<RnnAttentionConfig>& rnn_fields() {
  using C = RnnAttentionConfig;
  static const config::Fields<C> fields =
      config::Fields<C>()
          .constant("arch", "rnn_attention")
          .add("vocab_size", &C::vocab_size).at_least(0).at_most(config::limits::kVocab)
          .add("embed_dim", &C::embed_dim).at_least(1).at_most(config::limits::kWidth)
          .add("hidden", &C::hidden).at_least(1).at_most(config::limits::kWidth)
          .add("attention_dim", &C::attention_dim).at_least(1).at_most(config::limits::kWidth)
          .add("dropout", &C::dropout).fraction()
          .skip("train");
  return fields;
}

RnnAttentionConfig RnnAttentionConfig::from_json(const std::string& text, const std::string& source) {
  return rnn_fields().parse(text, source);
}

std::string RnnAttentionConfig::to_json() const { return rnn_fields().write(*this).dump(2) + "\n"; }

RnnAttention::RnnAttention(const RnnAttentionConfig& c, Rng& rng) : config_(c) {
  QKV_CHECK(c.vocab_size > 4, "rnn_attention: vocab_size must be set (got ", c.vocab_size, ")");
  const int64_t E = c.embed_dim, H = c.hidden, A = c.attention_dim;
  embed = register_module("embed", std::make_shared<Embedding>(c.vocab_size, E, rng));
  normal_(embed->weight, rng, 1.0f / std::sqrt((float)E));
  encoder_fwd = register_module("encoder.fwd", std::make_shared<GRUCell>(E, H, rng));
  encoder_bwd = register_module("encoder.bwd", std::make_shared<GRUCell>(E, H, rng));
  init = register_module("decoder.init", std::make_shared<Linear>(LinearOptions{2 * H, H}, rng));
  attn_query = register_module("decoder.attention.query", std::make_shared<Linear>(LinearOptions{H, A, false}, rng));
  attn_key = register_module("decoder.attention.key", std::make_shared<Linear>(LinearOptions{2 * H, A}, rng));
  attn_score = register_module("decoder.attention.score", std::make_shared<Linear>(LinearOptions{A, 1, false}, rng));
  decoder_cell = register_module("decoder.cell", std::make_shared<GRUCell>(E + 2 * H, H, rng));
  output = register_module("decoder.output", std::make_shared<Linear>(LinearOptions{H + 2 * H + E, E}, rng));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout, rng.next_bits()));
}

// Runs `cell` over x [B, S, E] left to right: [B, S, H].
static Tensor run_gru(const GRUCell& cell, const Tensor& x) {
  const int64_t B = x.size(0), S = x.size(1);
  Tensor gates = cell.input_gates(x);  // [B, S, 3H], one matmul for the whole sequence
  Tensor h = Tensor::zeros({B, cell.hidden_size()});
  std::vector<Tensor> outputs;
  for (int64_t t = 0; t < S; ++t) {
    h = cell.step(gates.slice(1, t, t + 1).reshape({B, -1}), h);
    outputs.push_back(h.unsqueeze(1));
  }
  return concat(outputs, 1);
}

// Reverses each row's first lengths[b] positions, padding left in place: an involution.
static Tensor reverse_valid(const Tensor& x, const std::vector<int64_t>& lengths) {
  const int64_t B = x.size(0), S = x.size(1);
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) rows.push_back(b * S + (t < lengths[b] ? lengths[b] - 1 - t : t));
  return select_rows(x.reshape({B * S, -1}), rows).reshape(x.shape());
}

RnnDecodeState RnnAttention::encode(const Tensor& src, const Tensor& src_lengths) {
  const int64_t B = src.size(0), S = src.size(1);
  std::vector<int64_t> lengths = src_lengths.to_ints();
  Tensor x = dropout->forward(embed->forward(src));
  Tensor fwd = run_gru(*encoder_fwd, x);
  Tensor bwd = reverse_valid(run_gru(*encoder_bwd, reverse_valid(x, lengths)), lengths);
  RnnDecodeState st;
  st.annotations = concat({fwd, bwd}, -1);  // [B, S, 2H]
  st.keys = attn_key->forward(st.annotations);
  std::vector<int64_t> pad(B * S), inv_len(B);
  std::vector<float> keep(B * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      pad[b * S + t] = t >= lengths[b];
      keep[b * S + t] = t < lengths[b] ? 1.0f / (float)lengths[b] : 0.0f;
    }
  st.padding = Tensor::from_ints(pad, {B, S}).to(DType::U8);
  // s_0 = tanh(W_init mean over the valid positions of h)
  Tensor mean_h = matmul(Tensor::from_vector(keep, {B, 1, S}), st.annotations).reshape({B, -1});
  st.state = tanh(init->forward(mean_h));
  return st;
}

Tensor RnnAttention::step(const Tensor& ids, RnnDecodeState& st, bool need_weights) {
  const int64_t B = ids.size(0), S = st.annotations.size(1);
  // e_ti = v^T tanh(W s_{t-1} + U h_i);  a_t = softmax over the valid i
  Tensor query = attn_query->forward(st.state).unsqueeze(1);                      // [B, 1, A]
  Tensor scores = attn_score->forward(tanh(add(st.keys, query))).reshape({B, S});  // [B, S]
  Tensor weights = softmax(masked_fill(scores, st.padding, -INFINITY));
  if (need_weights) last_weights_ = weights;
  Tensor context = matmul(weights.unsqueeze(1), st.annotations).reshape({B, -1});  // c_t [B, 2H]
  Tensor y = dropout->forward(embed->forward(ids));                               // E y_{t-1} [B, E]
  st.state = decoder_cell->forward(concat({y, context}, -1), st.state);
  Tensor out = dropout->forward(tanh(output->forward(concat({st.state, context, y}, -1))));
  return matmul(out, embed->weight.transpose(0, 1));  // [B, V]
}

Tensor RnnAttention::forward(const Tensor& src, const Tensor& src_lengths, const Tensor& tgt_in) {
  RnnDecodeState st = encode(src, src_lengths);
  const int64_t B = tgt_in.size(0), T = tgt_in.size(1);
  std::vector<Tensor> logits;
  for (int64_t t = 0; t < T; ++t) logits.push_back(step(tgt_in.slice(1, t, t + 1).reshape({B}), st, false).unsqueeze(1));
  return concat(logits, 1);
}

std::unique_ptr<DecodeState> RnnAttention::start_decoding(const Tensor& src, const Tensor& src_lengths, int64_t) {
  return std::make_unique<RnnDecodeState>(encode(src, src_lengths));
}

Tensor RnnAttention::decode_step(const Tensor& ids, DecodeState& base, bool need_weights) {
  auto& st = dynamic_cast<RnnDecodeState&>(base);
  const int64_t B = ids.size(0), T = ids.size(1);
  std::vector<Tensor> logits;
  for (int64_t t = 0; t < T; ++t) logits.push_back(step(ids.slice(1, t, t + 1).reshape({B}), st, need_weights).unsqueeze(1));
  st.position += T;
  return T == 1 ? logits[0] : concat(logits, 1);
}

void RnnAttention::select_rows(DecodeState& base, const std::vector<int64_t>& rows) {
  auto& st = dynamic_cast<RnnDecodeState&>(base);
  st.annotations = qkv::select_rows(st.annotations, rows);
  st.keys = qkv::select_rows(st.keys, rows);
  st.state = qkv::select_rows(st.state, rows);
  st.padding = qkv::select_rows(st.padding, rows);
}

std::string RnnAttention::summary() const {
  return "rnn_attention: bidirectional GRU encoder (2 x " + std::to_string(config_.hidden) +
         "), GRU decoder with additive attention, embed " + std::to_string(config_.embed_dim) + ", " +
         std::to_string(parameter_count()) + " parameters, vocabulary " + std::to_string(config_.vocab_size);
}

}  // namespace qkv
