// The shared Transformer-block keys and their one conversion into module options.
#include "qkv/blocks.h"
#include "src/config/names.h"

namespace qkv {

namespace config {

const Fields<BlockConfig>& block_fields() {
  using C = BlockConfig;
  static const Fields<BlockConfig> fields =
      Fields<C>()
          .add("d_model", &C::d_model).at_least(1).at_most(limits::kWidth)
          .add("nhead", &C::nhead).at_least(1).at_most(limits::kHeads)
          .add("num_kv_heads", &C::num_kv_heads).at_least(0).at_most(limits::kHeads)
          .add("head_dim", &C::head_dim).at_least(0).at_most(limits::kHeadDim)
          .add("dim_feedforward", &C::dim_feedforward).at_least(1).at_most(limits::kWidth)
          .add("dropout", &C::dropout).fraction()
          .add("activation", &C::activation)
          .only({Activation::Relu, Activation::Gelu, Activation::GeluTanh, Activation::Silu})
          .add("norm_first", &C::norm_first)
          .add("norm", &C::norm)
          .add("norm_eps", &C::norm_eps).positive()
          .add("mlp", &C::mlp)
          .add("qk_norm", &C::qk_norm)
          .add("qk_norm_eps", &C::qk_norm_eps).positive()
          .add("positions", &C::positions)
          .only({PositionKind::Sinusoidal, PositionKind::SinusoidalHalves, PositionKind::Learned, PositionKind::Rope})
          .add("rope_theta", &C::rope_theta).positive()
          .add("rope_scaling_type", &C::rope_scaling, &RopeScaling::kind).written_if(&C::is_rope_scaled)
          .add("rope_scaling_factor", &C::rope_scaling, &RopeScaling::factor).positive().written_if(&C::is_rope_scaled)
          .add("rope_low_freq_factor", &C::rope_scaling, &RopeScaling::low_freq_factor).positive()
          .written_if(&C::is_llama3_scaled)
          .add("rope_high_freq_factor", &C::rope_scaling, &RopeScaling::high_freq_factor).positive()
          .written_if(&C::is_llama3_scaled)
          .add("rope_original_context", &C::rope_scaling, &RopeScaling::original_context).at_least(1)
          .at_most(limits::kPositions).written_if(&C::has_original_context)
          .add("rope_beta_fast", &C::rope_scaling, &RopeScaling::beta_fast).positive().written_if(&C::is_yarn_scaled)
          .add("rope_beta_slow", &C::rope_scaling, &RopeScaling::beta_slow).positive().written_if(&C::is_yarn_scaled)
          .add("rope_attention_factor", &C::rope_scaling, &RopeScaling::attention_factor).positive()
          .written_if(&C::is_yarn_scaled)
          .add("rope_truncate", &C::rope_scaling, &RopeScaling::truncate).written_if(&C::is_yarn_scaled)
          .add("qkv_layout", &C::qkv_layout)
          .add("q_bias", &C::bias, &ProjectionBias::q)
          .add("k_bias", &C::bias, &ProjectionBias::k)
          .add("v_bias", &C::bias, &ProjectionBias::v)
          .add("out_bias", &C::bias, &ProjectionBias::out)
          .add("tie_output", &C::tie_output)
          .add("num_experts", &C::moe, &MoEOptions::num_experts).at_least(1).at_most(limits::kExperts)
          .written_if(&C::is_moe)
          .add("top_k", &C::moe, &MoEOptions::top_k).at_least(1).at_most(limits::kExperts)
          .written_if(&C::is_moe)
          .add("aux_loss_weight", &C::moe, &MoEOptions::aux_loss_weight).at_least(0).written_if(&C::is_moe);
  return fields;
}

}  // namespace config

TransformerLayerOptions BlockConfig::layer_options() const {
  TransformerLayerOptions o;
  o.d_model = d_model, o.dim_feedforward = dim_feedforward, o.dropout = dropout;
  o.activation = activation;
  o.norm_first = norm_first, o.norm = norm, o.norm_eps = norm_eps;
  o.mlp = mlp, o.moe = moe;
  o.attention = {.d_model = d_model,
                 .nhead = nhead,
                 .num_kv_heads = num_kv_heads,
                 .head_dim = head_dim,
                 .bias = bias,
                 .dropout = dropout,
                 .qk_norm = qk_norm,
                 .rotary = positions == PositionKind::Rope,
                 .rope_theta = rope_theta,
                 .rope_scaling = rope_scaling,
                 .qkv_layout = qkv_layout,
                 .qk_norm_eps = qk_norm_eps};
  return o;
}

void BlockConfig::check(const std::string& source) const {
  QKV_CHECK(head_dim > 0 || d_model % nhead == 0, source, ": d_model ", d_model, " must be a multiple of nhead ", nhead,
            " (or set head_dim)");
  QKV_CHECK(nhead % kv_heads() == 0, source, ": nhead ", nhead, " must be a multiple of num_kv_heads ", kv_heads());
  QKV_CHECK(positions != PositionKind::Rope || (head_dim > 0 ? head_dim : d_model / nhead) % 2 == 0, source,
            ": RoPE needs an even head dimension");
  QKV_CHECK(!rope_scaling.active() || rope_scaling.kind != RopeScalingKind::Llama3 ||
                rope_scaling.low_freq_factor < rope_scaling.high_freq_factor,
            source,
            ": rope_low_freq_factor ", rope_scaling.low_freq_factor, " must be below rope_high_freq_factor ",
            rope_scaling.high_freq_factor);
  QKV_CHECK(mlp != MLPKind::MoE || moe.top_k <= moe.num_experts, source, ": top_k ", moe.top_k,
            " must be at most num_experts ", moe.num_experts);
  QKV_CHECK(qkv_layout == QkvLayout::Separate || (bias.q == bias.k && bias.k == bias.v), source,
            ": a fused q/k/v projection has one bias for all of q, k and v; set q_bias, k_bias and v_bias alike or "
            "\"qkv_layout\": \"separate\"");
}

}  // namespace qkv
