// The encoder-decoder Transformer for translation, and its config.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "qkv/models.h"
#include "qkv/position.h"
#include "src/config/names.h"

namespace qkv {

static const config::Fields<TransformerConfig>& transformer_fields() {
  using C = TransformerConfig;
  static const config::Fields<C> fields =
      config::Fields<C>()
          .constant("arch", "transformer")
          .add("vocab_size", &C::vocab_size).at_least(0).at_most(config::limits::kVocab)
          .add("source_vocab_size", &C::source_vocab_size).at_least(0).at_most(config::limits::kVocab)
          .written_if([](const C& c) { return c.source_vocab_size > 0; })
          .add("num_encoder_layers", &C::num_encoder_layers).at_least(1).at_most(config::limits::kLayers)
          .add("num_decoder_layers", &C::num_decoder_layers).at_least(1).at_most(config::limits::kLayers)
          .add("max_len", &C::max_len).at_least(1).at_most(config::limits::kPositions)
          .add("scale_embedding", &C::scale_embedding).written_if([](const C& c) { return !c.scale_embedding; })
          .add("output_bias", &C::output_bias).written_if([](const C& c) { return c.output_bias; })
          .add("pad_id", &C::ids, &DecodingIds::pad).at_least(0).at_most(config::limits::kVocab)
          .written_if(&C::nondefault_ids)
          .add("decoder_start_id", &C::ids, &DecodingIds::start).at_least(0).at_most(config::limits::kVocab)
          .written_if(&C::nondefault_ids)
          .add("eos_id", &C::ids, &DecodingIds::eos).at_least(0).at_most(config::limits::kVocab)
          .written_if(&C::nondefault_ids)
          .add("source_eos", &C::ids, &DecodingIds::source_eos).written_if(&C::nondefault_ids)
          .add("forced_eos", &C::ids, &DecodingIds::forced_eos).written_if(&C::nondefault_ids)
          .include(config::block_fields())
          .skip("train");
  return fields;
}

TransformerConfig TransformerConfig::from_json(const std::string& text, const std::string& source) {
  TransformerConfig c = transformer_fields().parse(text, source);
  c.check(source);
  QKV_CHECK(c.ids.eos != c.ids.pad && c.ids.eos != c.ids.start, source, ": eos_id ", c.ids.eos,
            " must differ from pad_id and decoder_start_id (they are never outputs)");
  return c;
}

std::string TransformerConfig::to_json() const { return transformer_fields().write(*this).dump(2) + "\n"; }

TranslationTransformer::TranslationTransformer(const TransformerConfig& c, Rng& rng) : config_(c) {
  QKV_CHECK(c.vocab_size > 4, "transformer: vocab_size must be set (got ", c.vocab_size, ")");
  for (int64_t id : {c.ids.pad, c.ids.start, c.ids.eos})
    QKV_CHECK(id < c.vocab_size, "transformer: special id ", id, " is outside the vocabulary of ", c.vocab_size);
  embed = register_module("embed", std::make_shared<Embedding>(c.vocab_size, c.d_model, rng));
  normal_(embed->weight, rng, 1.0f / std::sqrt((float)c.d_model));  // scaled back up by sqrt(D) on lookup
  if (c.source_vocab_size > 0) {
    QKV_CHECK(c.ids.eos < c.source_vocab_size, "transformer: eos_id ", c.ids.eos,
              " (which ends each source) is outside the source vocabulary of ", c.source_vocab_size);
    source_embed = register_module("source_embed", std::make_shared<Embedding>(c.source_vocab_size, c.d_model, rng));
    normal_(source_embed->weight, rng, 1.0f / std::sqrt((float)c.d_model));
  }
  if (c.positions == PositionKind::Learned)
    positions = register_module("positions", std::make_shared<LearnedPositionalEmbedding>(c.max_len, c.d_model, rng));
  TransformerLayerOptions lo = c.layer_options();
  for (int64_t i = 0; i < c.num_encoder_layers; ++i)
    encoder_layers.push_back(register_module("encoder.layers." + std::to_string(i),
                                             std::make_shared<TransformerEncoderLayer>(lo, rng)));
  for (int64_t i = 0; i < c.num_decoder_layers; ++i)
    decoder_layers.push_back(register_module("decoder.layers." + std::to_string(i),
                                             std::make_shared<TransformerDecoderLayer>(lo, rng)));
  if (c.norm_first) {
    encoder_norm = register_module("encoder.norm", std::make_shared<Norm>(lo.norm, c.d_model, lo.norm_eps));
    decoder_norm = register_module("decoder.norm", std::make_shared<Norm>(lo.norm, c.d_model, lo.norm_eps));
  }
  if (!c.tie_output)
    output_proj = register_module("output_proj", std::make_shared<Linear>(LinearOptions{c.d_model, c.vocab_size, false}, rng));
  if (c.output_bias) output_bias = register_parameter("output_bias", Tensor::zeros({c.vocab_size}));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout, rng.next_bits()));
}

Tensor TranslationTransformer::embed_tokens(const Tensor& ids, int64_t offset, Embedding& table) {
  const int64_t len = ids.size(1);
  QKV_CHECK(offset + len <= config_.max_len || config_.positions != PositionKind::Learned, "transformer: sequence of ",
            offset + len, " tokens exceeds max_len ", config_.max_len);
  Tensor x = table.forward(ids);
  if (config_.scale_embedding) x = scale(x, std::sqrt((float)config_.d_model));
  if (config_.positions == PositionKind::Sinusoidal) x = add(x, sinusoidal_encoding(len, config_.d_model, offset));
  if (config_.positions == PositionKind::SinusoidalHalves)
    x = add(x, sinusoidal_encoding_halves(len, config_.d_model, offset));
  if (config_.positions == PositionKind::Learned) x = add(x, positions->forward(len, offset));
  return dropout->forward(x);
}

Tensor TranslationTransformer::encode(const Tensor& src, const Tensor& src_lengths) {
  Tensor x = embed_source(src);
  for (auto& layer : encoder_layers) x = layer->forward(x, {.key_padding_lengths = src_lengths});
  return encoder_norm ? encoder_norm->forward(x) : x;
}

Tensor TranslationTransformer::decode(const Tensor& tgt_in, const Tensor& memory, const Tensor& src_lengths) {
  Tensor x = embed_tokens(tgt_in, 0, *embed);
  for (auto& layer : decoder_layers) x = layer->forward(x, memory, {.causal = true}, {.key_padding_lengths = src_lengths});
  if (decoder_norm) x = decoder_norm->forward(x);
  return head(x);
}

Tensor TranslationTransformer::head(const Tensor& x) {
  Tensor logits = output_proj ? output_proj->forward(x) : tied_head_.forward(x, *embed);
  return output_bias.defined() ? add(logits, output_bias) : logits;
}

void TranslationTransformer::linear_weights_converted(DType dtype) {
  if (!output_proj) tied_head_.convert(*embed, dtype);
}

Tensor TranslationTransformer::forward(const Tensor& src, const Tensor& src_lengths, const Tensor& tgt_in) {
  return decode(tgt_in, encode(src, src_lengths), src_lengths);
}

AttentionWeights TranslationTransformer::attention_weights(const Tensor& src, const Tensor& src_lengths,
                                                           const Tensor& tgt_in) {
  NoGradGuard no_grad;
  AttentionWeights out;
  Tensor x = embed_source(src);
  for (auto& layer : encoder_layers) {
    x = layer->forward(x, {.key_padding_lengths = src_lengths, .need_weights = true});
    out.encoder.push_back(std::exchange(layer->last_self_weights, Tensor()));
  }
  const Tensor memory = encoder_norm ? encoder_norm->forward(x) : x;
  Tensor y = embed_tokens(tgt_in, 0, *embed);
  for (auto& layer : decoder_layers) {
    y = layer->forward(y, memory, {.causal = true, .need_weights = true},
                       {.key_padding_lengths = src_lengths, .need_weights = true});
    out.decoder.push_back(std::exchange(layer->last_self_weights, Tensor()));
    out.cross.push_back(std::exchange(layer->last_cross_weights, Tensor()));
  }
  return out;
}

std::unique_ptr<DecodeState> TranslationTransformer::start_decoding(const Tensor& src, const Tensor& src_lengths,
                                                                    int64_t capacity) {
  QKV_CHECK(config_.positions != PositionKind::Learned || capacity <= config_.max_len, "transformer: ", capacity,
            " target positions exceed max_len ", config_.max_len);
  Tensor memory = encode(src, src_lengths);
  auto st = std::make_unique<TransformerDecodeState>();
  st->src_lengths = src_lengths;
  for (auto& layer : decoder_layers) {
    st->self.push_back(layer->self_attn->make_cache(memory.size(0), capacity));
    st->cross.push_back(layer->cross_attn->project_kv(memory, 0));
  }
  return st;
}

Tensor TranslationTransformer::decode_step(const Tensor& ids, DecodeState& base, bool need_weights) {
  auto& st = dynamic_cast<TransformerDecodeState&>(base);
  Tensor x = embed_tokens(ids, st.position, *embed);
  for (size_t i = 0; i < decoder_layers.size(); ++i)
    x = decoder_layers[i]->forward_cached(x, st.self[i], st.cross[i].first, st.cross[i].second,
                                          {.key_padding_lengths = st.src_lengths, .need_weights = need_weights});
  st.position += ids.size(1);
  if (decoder_norm) x = decoder_norm->forward(x);
  return head(x);
}

Tensor TranslationTransformer::cross_weights() const {
  const Tensor& w = decoder_layers.back()->last_cross_weights;  // [B, H, T, S]
  QKV_CHECK(w.defined(), "transformer: no cross-attention weights; decode with need_weights");
  return mean(w.slice(2, w.size(2) - 1, w.size(2)), {1}).reshape({w.size(0), w.size(3)});
}

Tensor TranslationTransformer::cross_weights_by_head() const {
  std::vector<Tensor> layers;  // [1, H, S] each: row 0's last query
  for (const auto& layer : decoder_layers) {
    const Tensor& w = layer->last_cross_weights;  // [B, H, T, S]
    QKV_CHECK(w.defined(), "transformer: no cross-attention weights; decode with need_weights");
    layers.push_back(w.slice(0, 0, 1).slice(2, w.size(2) - 1, w.size(2)).reshape({1, w.size(1), w.size(3)}));
  }
  return concat(layers, 0);
}

std::string TranslationTransformer::attention_name() const {
  return "cross-attention: last decoder layer, mean of " + std::to_string(config_.nhead) + " heads";
}

namespace {

// One self-attention cache tensor [B, H, capacity, Dh] after a beam step: row
// r takes row rows[r]'s `length` written positions (those past it are never
// read, so they are not copied). With as many rows as before the rows move in
// place: only those whose hypothesis came from another row, and of their
// sources only the ones that are themselves overwritten are saved first. A
// cache with fewer rows is a new tensor. Rows split between the threads.
void gather_cache_rows(Tensor& t, int64_t length, const std::vector<int64_t>& rows) {
  if (!t.is_contiguous() || t.dim() != 4) {
    t = select_rows(t, rows);
    return;
  }
  const int64_t B = t.size(0), H = t.size(1), R = (int64_t)rows.size();
  for (int64_t r : rows) QKV_CHECK(r >= 0 && r < B, "select_rows: row ", r, " outside [0, ", B, ")");
  const size_t position = (size_t)t.size(3) * dtype_size(t.dtype());
  const size_t head = (size_t)t.size(2) * position, used = (size_t)length * position;
  const bool parallel = (size_t)R * H * used >= (1 << 18);
  // Row `to` (heads `to_head` bytes apart) from row `from` (`from_head` apart).
  const auto copy_row = [&](char* to, size_t to_head, const char* from, size_t from_head) {
    for (int64_t h = 0; h < H; ++h) std::memcpy(to + h * to_head, from + h * from_head, used);
  };
  const char* base = static_cast<const char*>(t.raw_data());
  if (R != B) {
    Tensor out = Tensor::empty({R, H, t.size(2), t.size(3)}, t.dtype());
    char* o = static_cast<char*>(out.raw_data());
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < R; ++r) copy_row(o + r * H * head, head, base + rows[r] * H * head, head);
    t = out;
    return;
  }
  std::vector<int64_t> moved, saved_rows, slot(B, -1);  // slot: a saved row's place in `saved`
  for (int64_t r = 0; r < R; ++r) {
    if (rows[r] == r) continue;
    moved.push_back(r);
    const int64_t from = rows[r];
    if (rows[from] != from && slot[from] < 0) slot[from] = (int64_t)saved_rows.size(), saved_rows.push_back(from);
  }
  if (moved.empty() || used == 0) return;
  Tensor saved = Tensor::empty({std::max<int64_t>((int64_t)saved_rows.size(), 1), H, length, t.size(3)}, t.dtype());
  char* sv = static_cast<char*>(saved.raw_data());
  char* data = static_cast<char*>(t.raw_data());
  const int64_t S = (int64_t)saved_rows.size(), M = (int64_t)moved.size();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < S; ++i) copy_row(sv + i * H * used, used, base + saved_rows[i] * H * head, head);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t m = 0; m < M; ++m) {
    const int64_t r = moved[m], from = rows[r];
    char* to = data + r * H * head;
    if (slot[from] >= 0) {
      copy_row(to, head, sv + slot[from] * H * used, used);
    } else {
      copy_row(to, head, base + from * H * head, head);
    }
  }
}

}  // namespace

void TranslationTransformer::select_rows(DecodeState& base, const std::vector<int64_t>& rows) {
  auto& st = dynamic_cast<TransformerDecodeState&>(base);
  const int64_t G = st.beams, R = (int64_t)rows.size();
  QKV_CHECK(R % G == 0, "transformer: ", R, " rows do not make whole sentences of ", G, " beams");
  // The sentences the rows belong to: the per-sentence cross K/V follow them.
  std::vector<int64_t> sentences;
  for (int64_t g = 0; g < R / G; ++g) {
    sentences.push_back(rows[g * G] / G);
    for (int64_t i = 1; i < G; ++i)
      QKV_CHECK(rows[g * G + i] / G == sentences.back(), "transformer: rows ", g * G, "..", g * G + G - 1,
                " mix beams of different sentences");
  }
  for (KVCache& c : st.self) {  // the written positions only, in place where the rows stay as many
    gather_cache_rows(c.k, c.length, rows);
    gather_cache_rows(c.v, c.length, rows);
  }
  bool same_sentences = (int64_t)sentences.size() == st.src_lengths.size(0);
  for (size_t i = 0; same_sentences && i < sentences.size(); ++i) same_sentences = sentences[i] == (int64_t)i;
  if (same_sentences) return;  // beams reordered within their sentences: nothing per sentence moves
  for (auto& [k, v] : st.cross) {
    k = qkv::select_rows(k, sentences);
    v = qkv::select_rows(v, sentences);
  }
  st.src_lengths = qkv::select_rows(st.src_lengths, sentences);
}

void TranslationTransformer::expand_beams(DecodeState& base, int64_t sentences, int64_t k) {
  auto& st = dynamic_cast<TransformerDecodeState&>(base);
  QKV_CHECK(st.beams == 1 && k >= 1 && sentences == st.src_lengths.size(0), "transformer: expand_beams(", sentences,
            ", ", k, ") on a state of ", st.src_lengths.size(0), " sentences with ", st.beams, " beams");
  const std::vector<int64_t> rows = beam_rows(sentences, k);
  for (KVCache& c : st.self) {  // the self-attention caches become one per beam ...
    c.k = qkv::select_rows(c.k, rows);
    c.v = qkv::select_rows(c.v, rows);
  }
  st.beams = k;  // ... the cross-attention K/V stay one per sentence
}

std::string TranslationTransformer::summary() const {
  return "transformer: d_model " + std::to_string(config_.d_model) + ", " + std::to_string(config_.num_encoder_layers) +
         "+" + std::to_string(config_.num_decoder_layers) + " layers, " + std::to_string(config_.nhead) + " heads, " +
         std::to_string(parameter_count()) + " parameters, " +
         (config_.source_vocab_size > 0 ? "vocabularies " + std::to_string(config_.source_vocab_size) +
                                              " (source) and " + std::to_string(config_.vocab_size) + " (target)"
                                        : "vocabulary " + std::to_string(config_.vocab_size));
}

Tensor select_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  Shape shape = t.shape();
  shape[0] = (int64_t)rows.size();
  if (t.dtype() == DType::F32) {  // a differentiable gather
    Tensor flat = t.reshape({t.size(0), -1});
    return embedding(flat, Tensor::from_ints(rows, {(int64_t)rows.size()})).reshape(shape);
  }
  Tensor src = t.contiguous(), out = Tensor::empty(shape, t.dtype());
  const size_t row_bytes = (size_t)(t.numel() / std::max<int64_t>(t.size(0), 1)) * dtype_size(t.dtype());
  for (size_t r = 0; r < rows.size(); ++r) {
    QKV_CHECK(rows[r] >= 0 && rows[r] < t.size(0), "select_rows: row ", rows[r], " outside [0, ", t.size(0), ")");
    std::memcpy(static_cast<char*>(out.raw_data()) + r * row_bytes,
                static_cast<const char*>(src.raw_data()) + rows[r] * row_bytes, row_bytes);
  }
  return out;
}

Tensor TranslationTransformer::aux_loss() const {
  Tensor total;
  auto add_from = [&](const std::shared_ptr<FeedForward>& ff) {
    Tensor a = ff->aux_loss();
    if (a.defined()) total = total.defined() ? add(total, a) : a;
  };
  for (auto& l : encoder_layers) add_from(l->mlp);
  for (auto& l : decoder_layers) add_from(l->mlp);
  return total;
}

}  // namespace qkv
