// The decoder-only language model and its config.
#include "qkv/lm.h"

#include "qkv/position.h"
#include "src/config/names.h"

namespace qkv {

static const config::Fields<DecoderConfig>& decoder_fields() {
  using C = DecoderConfig;
  static const config::Fields<C> fields =
      config::Fields<C>()
          .constant("arch", "decoder")
          .add("vocab_size", &C::vocab_size).at_least(0).at_most(config::limits::kVocab)
          .add("num_layers", &C::num_layers).at_least(1).at_most(config::limits::kLayers)
          .add("context", &C::context).at_least(2).at_most(config::limits::kPositions)
          .include(config::block_fields())
          .skip("train")
          .skip("tokenizer");
  return fields;
}

DecoderConfig DecoderConfig::from_json(const std::string& text, const std::string& source) {
  DecoderConfig c = decoder_fields().parse(text, source);
  c.check(source);
  return c;
}

std::string DecoderConfig::to_json() const { return decoder_fields().write(*this).dump(2); }

DecoderLM::DecoderLM(const DecoderConfig& c, Rng& rng) : config_(c) {
  QKV_CHECK(c.vocab_size > 0, "decoder: vocab_size must be set (got ", c.vocab_size, ")");
  embed = register_module("embed", std::make_shared<Embedding>(c.vocab_size, c.d_model, rng));
  normal_(embed->weight, rng, 0.02f);
  if (c.positions == PositionKind::Learned)
    positions = register_module("positions", std::make_shared<LearnedPositionalEmbedding>(c.context, c.d_model, rng));
  const TransformerLayerOptions lo = c.layer_options();
  for (int64_t i = 0; i < c.num_layers; ++i)
    layers.push_back(register_module("layers." + std::to_string(i), std::make_shared<TransformerEncoderLayer>(lo, rng)));
  if (c.norm_first) norm = register_module("norm", std::make_shared<Norm>(lo.norm, c.d_model, lo.norm_eps));
  if (!c.tie_output)
    output_proj = register_module("output_proj", std::make_shared<Linear>(LinearOptions{c.d_model, c.vocab_size, false}, rng));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout, rng.next_bits()));
}

Tensor DecoderLM::embed_tokens(const Tensor& ids, int64_t offset) {
  const int64_t T = ids.size(1);
  QKV_CHECK(offset + T <= config_.context, "decoder: ", offset + T, " positions exceed the context of ",
            config_.context);
  Tensor x = embed->forward(ids);
  if (config_.positions == PositionKind::Learned) x = add(x, positions->forward(T, offset));
  if (config_.positions == PositionKind::Sinusoidal) x = add(x, sinusoidal_encoding(T, config_.d_model, offset));
  if (config_.positions == PositionKind::SinusoidalHalves)
    x = add(x, sinusoidal_encoding_halves(T, config_.d_model, offset));
  return dropout->forward(x);
}

Tensor DecoderLM::logits(const Tensor& x_in) {
  Tensor x = norm ? norm->forward(x_in) : x_in;
  return output_proj ? output_proj->forward(x) : tied_head_.forward(x, *embed);
}

void DecoderLM::linear_weights_converted(DType dtype) {
  if (!output_proj) tied_head_.convert(*embed, dtype);
}

uint64_t DecoderLM::decode_bytes() const {
  if (output_proj) return parameter_bytes();
  return parameter_bytes() - embed->parameter_bytes() + tied_head_.bytes(*embed);
}

// With bfloat16 weights (--dtype bf16) the attention of kBf16AttentionLength
// tokens or more multiplies bfloat16 operands too, on the tiles the linears
// use, with float32 sums and softmax, as a bfloat16 model runs in PyTorch: a
// 990-token prefill of the 97M Llama 0.27-0.29 -> 0.21-0.22 s (Intel Xeon
// model 207). Shorter sequences and decoding steps keep float32 attention
// (and skip the walk over the modules for their dtype). A guard already on,
// as in mixed-precision training, stays on.
bool DecoderLM::bf16_attention(int64_t length) const {
  return bf16_autocast() || (length >= kBf16AttentionLength && linear_weight_dtype() == DType::BF16);
}

Tensor DecoderLM::forward(const Tensor& ids, bool need_weights) {
  QKV_CHECK(ids.dim() == 2, "decoder: ids must be [B, T], got ", shape_str(ids.shape()));
  Bf16AutocastGuard bf16(bf16_attention(ids.size(1)));
  Tensor x = embed_tokens(ids, 0);
  for (auto& layer : layers) x = layer->forward(x, {.causal = true, .need_weights = need_weights});
  return logits(x);
}

std::vector<KVCache> DecoderLM::make_caches(int64_t batch, int64_t capacity) const {
  QKV_CHECK(capacity <= config_.context, "decoder: a cache of ", capacity, " positions exceeds the context of ",
            config_.context);
  std::vector<KVCache> caches;
  for (auto& layer : layers) caches.push_back(layer->self_attn->make_cache(batch, capacity));
  return caches;
}

Tensor DecoderLM::forward_cached(const Tensor& ids, std::vector<KVCache>& caches, bool last_only) {
  QKV_CHECK(ids.dim() == 2 && caches.size() == layers.size(), "decoder: ids [B, T] and one cache per layer");
  Bf16AutocastGuard bf16(bf16_attention(ids.size(1)));
  Tensor x = embed_tokens(ids, caches[0].length);
  for (size_t i = 0; i < layers.size(); ++i) x = layers[i]->forward_cached(x, caches[i]);
  const int64_t T = x.size(1);
  return logits(last_only && T > 1 ? x.slice(1, T - 1, T) : x);
}

Tensor DecoderLM::forward_cached_rows(const Tensor& ids, const std::vector<std::vector<KVCache>*>& rows) {
  const int64_t B = ids.dim() == 2 ? ids.size(0) : 0;
  QKV_CHECK(ids.dim() == 2 && ids.size(1) == 1 && (size_t)B == rows.size(),
            "decoder: ids must be [B, 1] with the caches of each row, got ", shape_str(ids.shape()), " and ",
            rows.size(), " rows");
  std::vector<Tensor> at;  // [1, 1, D] per row: its token at its own position
  for (int64_t b = 0; b < B; ++b) {
    QKV_CHECK(rows[(size_t)b]->size() == layers.size(), "decoder: row ", b, " needs one cache per layer");
    at.push_back(embed_tokens(ids.slice(0, b, b + 1), rows[(size_t)b]->front().length));
  }
  Tensor x = concat(at, 0);
  std::vector<KVCache*> caches((size_t)B);
  for (size_t i = 0; i < layers.size(); ++i) {
    for (int64_t b = 0; b < B; ++b) caches[(size_t)b] = &(*rows[(size_t)b])[i];
    x = layers[i]->forward_cached_rows(x, caches);
  }
  return logits(x);
}

Tensor DecoderLM::forward_cached_packed(const Tensor& ids, const std::vector<int64_t>& lengths,
                                        const std::vector<std::vector<KVCache>*>& rows) {
  QKV_CHECK(ids.dim() == 2 && ids.size(0) == 1 && lengths.size() == rows.size(),
            "decoder: ids must be [1, N] with a length and the caches of each sequence, got ", shape_str(ids.shape()),
            ", ", lengths.size(), " lengths and ", rows.size(), " sequences");
  std::vector<Tensor> at;  // [1, n, D] per sequence: its tokens at its own positions
  int64_t offset = 0, longest = 0;
  for (size_t b = 0; b < rows.size(); ++b) {
    QKV_CHECK(rows[b]->size() == layers.size(), "decoder: sequence ", b, " needs one cache per layer");
    QKV_CHECK(lengths[b] >= 1 && offset + lengths[b] <= ids.size(1),
              "decoder: the lengths must be positive and sum to ", ids.size(1));
    at.push_back(embed_tokens(ids.slice(1, offset, offset + lengths[b]), rows[b]->front().length));
    offset += lengths[b];
    longest = std::max(longest, lengths[b]);
  }
  QKV_CHECK(offset == ids.size(1), "decoder: the lengths sum to ", offset, ", not to the ", ids.size(1), " tokens");
  Bf16AutocastGuard bf16(bf16_attention(longest));  // as for the longest sequence alone
  Tensor x = at.size() == 1 ? at[0] : concat(at, 1);
  std::vector<KVCache*> caches(rows.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    for (size_t b = 0; b < rows.size(); ++b) caches[b] = &(*rows[b])[i];
    x = layers[i]->forward_cached_packed(x, lengths, caches);
  }
  return x;
}

Tensor DecoderLM::aux_loss() const {
  Tensor total;
  for (auto& l : layers) {
    Tensor a = l->mlp->aux_loss();
    if (a.defined()) total = total.defined() ? add(total, a) : a;
  }
  return total;
}

std::string DecoderLM::summary() const {
  const DecoderConfig& c = config_;
  return "decoder: d_model " + std::to_string(c.d_model) + ", " + std::to_string(c.num_layers) + " layers, " +
         std::to_string(c.nhead) + " heads (" + std::to_string(c.num_kv_heads ? c.num_kv_heads : c.nhead) +
         " key/value), " + config::name_of(c.mlp) + " MLP, " + config::name_of(c.positions) + " positions, " + std::to_string(parameter_count()) +
         " parameters, vocabulary " + std::to_string(c.vocab_size);
}

}  // namespace qkv
