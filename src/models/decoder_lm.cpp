// The decoder-only language model and its config.
#include "qkv/lm.h"

#include <nlohmann/json.hpp>
#include <set>

#include "qkv/position.h"
#include "src/core/json.h"
#include "src/models/block_config.h"

namespace qkv {

DecoderConfig DecoderConfig::from_json(const std::string& text, const std::string& source) {
  nlohmann::json j = parse_json(text, source);
  QKV_CHECK(j.is_object(), source, ": expected a JSON object");
  static const std::set<std::string> known = {
      "arch",       "vocab_size", "d_model",   "nhead",       "num_kv_heads", "num_layers", "dim_feedforward",
      "dropout",    "activation", "norm_first", "norm",       "mlp",          "qk_norm",    "positions",
      "context",    "tie_output", "num_experts", "top_k",     "aux_loss_weight", "train",   "tokenizer"};
  json_known_keys(j, known, source);
  DecoderConfig c;
  c.arch = json_get<std::string>(j, "arch", c.arch, source);
  json_one_of(c.arch, {"decoder"}, "arch", source);
  c.vocab_size = json_get<int64_t>(j, "vocab_size", c.vocab_size, source);
  c.num_kv_heads = json_get<int64_t>(j, "num_kv_heads", c.num_kv_heads, source);
  c.num_layers = json_get<int64_t>(j, "num_layers", c.num_layers, source);
  c.context = json_get<int64_t>(j, "context", c.context, source);
  read_block_fields(j, source, c, {"rope", "learned", "sinusoidal"});
  QKV_CHECK(c.d_model > 0 && c.nhead > 0 && c.d_model % c.nhead == 0, source, ": d_model ", c.d_model,
            " must be a positive multiple of nhead ", c.nhead);
  const int64_t kv = c.num_kv_heads ? c.num_kv_heads : c.nhead;
  QKV_CHECK(kv > 0 && c.nhead % kv == 0, source, ": nhead ", c.nhead, " must be a multiple of num_kv_heads ", kv);
  QKV_CHECK(c.num_layers > 0 && c.dim_feedforward > 0, source, ": num_layers and dim_feedforward must be positive");
  QKV_CHECK(c.context >= 2, source, ": context ", c.context, ": must be at least 2 (<bos> and one token)");
  QKV_CHECK(c.dropout >= 0 && c.dropout < 1, source, ": dropout must be in [0, 1)");
  QKV_CHECK(c.mlp != "moe" || (c.moe.top_k >= 1 && c.moe.top_k <= c.moe.num_experts), source,
            ": top_k must be in [1, num_experts]");
  return c;
}

std::string DecoderConfig::to_json() const {
  nlohmann::ordered_json j = {{"arch", arch},
                              {"vocab_size", vocab_size},
                              {"d_model", d_model},
                              {"nhead", nhead},
                              {"num_kv_heads", num_kv_heads},
                              {"num_layers", num_layers},
                              {"dim_feedforward", dim_feedforward},
                              {"dropout", dropout},
                              {"activation", activation},
                              {"norm_first", norm_first},
                              {"norm", norm},
                              {"mlp", mlp},
                              {"qk_norm", qk_norm},
                              {"positions", positions},
                              {"context", context},
                              {"tie_output", tie_output}};
  if (mlp == "moe") {
    j["num_experts"] = moe.num_experts;
    j["top_k"] = moe.top_k;
    j["aux_loss_weight"] = moe.aux_loss_weight;
  }
  return j.dump(2);
}

TransformerLayerOptions DecoderConfig::layer_options() const {
  TransformerLayerOptions o = block_layer_options(*this);
  o.num_kv_heads = num_kv_heads;
  return o;
}

DecoderLM::DecoderLM(const DecoderConfig& c, Rng& rng) : config_(c) {
  QKV_CHECK(c.vocab_size > 0, "decoder: vocab_size must be set (got ", c.vocab_size, ")");
  embed = register_module("embed", std::make_shared<Embedding>(c.vocab_size, c.d_model, rng));
  normal_(embed->weight, rng, 0.02f);
  if (c.positions == "learned")
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
  if (config_.positions == "learned") x = add(x, positions->forward(T, offset));
  if (config_.positions == "sinusoidal") x = add(x, sinusoidal_encoding(T, config_.d_model, offset));
  return dropout->forward(x);
}

Tensor DecoderLM::logits(const Tensor& x_in) {
  Tensor x = norm ? norm->forward(x_in) : x_in;
  return output_proj ? output_proj->forward(x) : matmul(x, embed->weight.transpose(0, 1));
}

Tensor DecoderLM::forward(const Tensor& ids) {
  QKV_CHECK(ids.dim() == 2, "decoder: ids must be [B, T], got ", shape_str(ids.shape()));
  Tensor x = embed_tokens(ids, 0);
  for (auto& layer : layers) x = layer->forward(x, {.causal = true});
  return logits(x);
}

std::vector<KVCache> DecoderLM::make_caches(int64_t batch, int64_t capacity) const {
  QKV_CHECK(capacity <= config_.context, "decoder: a cache of ", capacity, " positions exceeds the context of ",
            config_.context);
  std::vector<KVCache> caches;
  for (auto& layer : layers) caches.push_back(layer->self_attn->make_cache(batch, capacity));
  return caches;
}

Tensor DecoderLM::forward_cached(const Tensor& ids, std::vector<KVCache>& caches) {
  QKV_CHECK(ids.dim() == 2 && caches.size() == layers.size(), "decoder: ids [B, T] and one cache per layer");
  Tensor x = embed_tokens(ids, caches[0].length);
  for (size_t i = 0; i < layers.size(); ++i) x = layers[i]->forward_cached(x, caches[i]);
  return logits(x);
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
         " key/value), " + c.mlp + " MLP, " + c.positions + " positions, " + std::to_string(parameter_count()) +
         " parameters, vocabulary " + std::to_string(c.vocab_size);
}

}  // namespace qkv
