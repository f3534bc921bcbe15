// Internal: the Transformer block fields that the translation Transformer's
// config and the decoder LM's config share (same keys, same checks), read
// once and turned into TransformerLayerOptions once.
#pragma once

#include <initializer_list>
#include <string>

#include "qkv/blocks.h"
#include "src/core/json.h"

namespace qkv {

// Reads d_model, nhead, dim_feedforward, dropout, activation, norm_first,
// norm, mlp, qk_norm, positions (one of `positions`), tie_output and the MoE
// keys into `c`; absent keys keep c's defaults.
template <class Config>
void read_block_fields(const nlohmann::json& j, const std::string& source, Config& c,
                       std::initializer_list<const char*> positions) {
  c.d_model = json_get<int64_t>(j, "d_model", c.d_model, source);
  c.nhead = json_get<int64_t>(j, "nhead", c.nhead, source);
  c.dim_feedforward = json_get<int64_t>(j, "dim_feedforward", c.dim_feedforward, source);
  c.dropout = json_get<float>(j, "dropout", c.dropout, source);
  c.activation = json_get<std::string>(j, "activation", c.activation, source);
  json_one_of(c.activation, {"relu", "gelu", "gelu_tanh", "silu"}, "activation", source);
  c.norm_first = json_get<bool>(j, "norm_first", c.norm_first, source);
  c.norm = json_get<std::string>(j, "norm", c.norm, source);
  json_one_of(c.norm, {"layernorm", "rmsnorm"}, "norm", source);
  c.mlp = json_get<std::string>(j, "mlp", c.mlp, source);
  json_one_of(c.mlp, {"dense", "swiglu", "moe"}, "mlp", source);
  c.qk_norm = json_get<bool>(j, "qk_norm", c.qk_norm, source);
  c.positions = json_get<std::string>(j, "positions", c.positions, source);
  json_one_of(c.positions, positions, "positions", source);
  c.tie_output = json_get<bool>(j, "tie_output", c.tie_output, source);
  c.moe.num_experts = json_get<int64_t>(j, "num_experts", c.moe.num_experts, source);
  c.moe.top_k = json_get<int64_t>(j, "top_k", c.moe.top_k, source);
  c.moe.aux_loss_weight = json_get<float>(j, "aux_loss_weight", c.moe.aux_loss_weight, source);
}

template <class Config>
TransformerLayerOptions block_layer_options(const Config& c) {
  TransformerLayerOptions o;
  o.d_model = c.d_model, o.nhead = c.nhead, o.dim_feedforward = c.dim_feedforward, o.dropout = c.dropout;
  o.activation = activation_from_name(c.activation);
  o.norm_first = c.norm_first;
  o.norm = c.norm == "rmsnorm" ? NormKind::RMSNorm : NormKind::LayerNorm;
  o.mlp = c.mlp == "swiglu" ? MLPKind::SwiGLU : c.mlp == "moe" ? MLPKind::MoE : MLPKind::Dense;
  o.moe = c.moe;
  o.qk_norm = c.qk_norm;
  o.rotary = c.positions == "rope";
  return o;
}

}  // namespace qkv
