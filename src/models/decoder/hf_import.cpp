// Hugging Face causal language models as qkv decoders: LlamaForCausalLM,
// MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM and
// Qwen3ForCausalLM are one architecture (Pre-Norm RMSNorm, rotary positions,
// grouped-query attention, a SwiGLU MLP, or a mixture of SwiGLU experts for
// Mixtral) that differs in which projections have a bias, whether q and
// k are RMS-normalized per head before the rotation (Qwen3's QK-Norm), and
// how the rotary frequencies are scaled (Llama 3.1's "llama3" type).
// GPT2LMHeadModel is the other decoder of the lecture's kind: learned
// positions, LayerNorm, a dense GELU MLP, one fused q/k/v projection, a bias
// everywhere, and weights stored as Conv1D ([in, out], transposed here).
// The config keys and the weight names are mapped here, once; an option that
// changes the math and that qkv does not implement is an error naming the
// field, never a different model.
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <map>
#include <regex>

#include "qkv/lm.h"
#include "src/config/fields.h"
#include "src/core/json.h"
#include "src/models/families.h"

namespace qkv::builtin {

namespace {

// Weight names: HF -> qkv (layers.N.* keep their index).
const std::vector<std::pair<std::string, std::string>> kLayerWeights = {
    {"input_layernorm.weight", "norm1.weight"},
    {"post_attention_layernorm.weight", "norm2.weight"},
    {"self_attn.q_proj.weight", "self_attn.q_proj.weight"},
    {"self_attn.q_proj.bias", "self_attn.q_proj.bias"},
    {"self_attn.k_proj.weight", "self_attn.k_proj.weight"},
    {"self_attn.k_proj.bias", "self_attn.k_proj.bias"},
    {"self_attn.v_proj.weight", "self_attn.v_proj.weight"},
    {"self_attn.v_proj.bias", "self_attn.v_proj.bias"},
    {"self_attn.o_proj.weight", "self_attn.out_proj.weight"},
    {"self_attn.o_proj.bias", "self_attn.out_proj.bias"},
    {"self_attn.q_norm.weight", "self_attn.q_norm.weight"},  // Qwen3
    {"self_attn.k_norm.weight", "self_attn.k_norm.weight"},
    {"mlp.gate_proj.weight", "mlp.w1.weight"},  // silu(x W1^T) * (x W2^T), then W3
    {"mlp.up_proj.weight", "mlp.w2.weight"},
    {"mlp.down_proj.weight", "mlp.w3.weight"},
};

std::string decoder_weight_name(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "embed.weight";
  if (hf == "model.norm.weight") return "norm.weight";
  if (hf == "lm_head.weight") return "output_proj.weight";
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(hf, m, layer)) return "";
  for (const auto& [from, to] : kLayerWeights)
    if (m[2] == from) return "layers." + m[1].str() + "." + to;
  // Mixtral's experts: w1 gate, w3 up, w2 down (qkv's SwiGLU: w1 gate, w2 up, w3 down).
  if (m[2] == "block_sparse_moe.gate.weight") return "layers." + m[1].str() + ".mlp.router.weight";
  static const std::regex expert(R"(block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight)");
  std::smatch e;
  const std::string rest = m[2].str();
  if (!std::regex_match(rest, e, expert)) return "";
  static const std::map<std::string, std::string> kExpertWeights = {{"w1", "w1"}, {"w3", "w2"}, {"w2", "w3"}};
  return "layers." + m[1].str() + ".mlp.experts." + e[1].str() + "." + kExpertWeights.at(e[2].str()) + ".weight";
}


// GPT-2: HF -> qkv names of h.N.*; the Conv1D weights among them are transposed.
const std::vector<std::pair<std::string, std::string>> kGpt2LayerWeights = {
    {"ln_1.weight", "norm1.weight"},
    {"ln_1.bias", "norm1.bias"},
    {"ln_2.weight", "norm2.weight"},
    {"ln_2.bias", "norm2.bias"},
    {"attn.c_attn.weight", "self_attn.qkv_proj.weight"},  // q, k, v stacked, as qkv's fused layout
    {"attn.c_attn.bias", "self_attn.qkv_proj.bias"},
    {"attn.c_proj.weight", "self_attn.out_proj.weight"},
    {"attn.c_proj.bias", "self_attn.out_proj.bias"},
    {"mlp.c_fc.weight", "mlp.mlp.fc1.weight"},
    {"mlp.c_fc.bias", "mlp.mlp.fc1.bias"},
    {"mlp.c_proj.weight", "mlp.mlp.fc2.weight"},
    {"mlp.c_proj.bias", "mlp.mlp.fc2.bias"},
};

// Checkpoints name the body "transformer.*" (GPT2LMHeadModel) or leave the
// prefix out (the original GPT-2 files, which also save the causal mask).
std::string gpt2_weight_name(const std::string& hf_name) {
  const std::string prefix = "transformer.";
  const std::string hf = hf_name.rfind(prefix, 0) == 0 ? hf_name.substr(prefix.size()) : hf_name;
  if (hf == "wte.weight") return "embed.weight";
  if (hf == "wpe.weight") return "positions.weight";
  if (hf == "ln_f.weight") return "norm.weight";
  if (hf == "ln_f.bias") return "norm.bias";
  if (hf_name == "lm_head.weight") return "output_proj.weight";
  static const std::regex layer(R"(h\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(hf, m, layer)) return "";
  if (m[2] == "attn.bias" || m[2] == "attn.masked_bias") return HfImport::kSkip;
  for (const auto& [from, to] : kGpt2LayerWeights)
    if (m[2] == from) return "layers." + m[1].str() + "." + to;
  return "";
}

Tensor gpt2_convert(const std::string& hf_name, const Tensor& t) {
  static const std::regex conv1d(
      R"((transformer\.)?h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight)");
  if (!std::regex_match(hf_name, conv1d)) return t;
  QKV_CHECK(t.dim() == 2, hf_name, ": a Conv1D weight must have 2 dimensions, got ", shape_str(t.shape()));
  return t.transpose(0, 1).contiguous();
}

HfImport import_gpt2(const nlohmann::json& hf, const std::string& source) {
  const std::string act = field(hf, "activation_function", "gelu_new").get<std::string>();
  static const std::map<std::string, std::string> kActivations = {
      {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"}, {"gelu", "gelu"}, {"relu", "relu"}};
  const auto a = kActivations.find(act);
  if (a == kActivations.end()) unsupported(source, "'activation_function' '" + act + "'");
  if (field(hf, "scale_attn_weights", true) != true) unsupported(source, "'scale_attn_weights': false");
  if (field(hf, "scale_attn_by_inverse_layer_idx", false) != false)
    unsupported(source, "'scale_attn_by_inverse_layer_idx': true");
  if (field(hf, "add_cross_attention", false) != false) unsupported(source, "'add_cross_attention': true");
  const int64_t d = whole(required(hf, "n_embd", source), "n_embd", source, 1, config::limits::kWidth);
  nlohmann::ordered_json c = {
      {"arch", "decoder"},
      {"vocab_size", required(hf, "vocab_size", source)},
      {"num_layers", required(hf, "n_layer", source)},
      {"context", required(hf, "n_positions", source)},
      {"d_model", d},
      {"nhead", required(hf, "n_head", source)},
      {"dim_feedforward", field(hf, "n_inner", 4 * d)},
      {"dropout", 0.0},
      {"activation", a->second},
      {"norm_first", true},
      {"norm", "layernorm"},
      {"norm_eps", field(hf, "layer_norm_epsilon", 1e-5)},
      {"mlp", "dense"},
      {"positions", "learned"},
      {"qkv_layout", "fused"},
      {"q_bias", true},
      {"k_bias", true},
      {"v_bias", true},
      {"out_bias", true},
      {"tie_output", field(hf, "tie_word_embeddings", true)},
  };
  return {c.dump(2), gpt2_weight_name, gpt2_convert};
}

}  // namespace

// The values are checked by the decoder's own config reader afterwards; a field
// of the wrong JSON type is load_hf's one-line error.
HfImport import_hf_causal_lm(const std::string& text, const std::string& source) {
  const nlohmann::json hf = parse_json(text, source);
  QKV_CHECK(hf.is_object(), source, ": expected a JSON object");
  const std::string type = field(hf, "model_type", "").get<std::string>();
  if (type == "gpt2") return import_gpt2(hf, source);
  auto unsupported = [&](const std::string& what) { qkv::builtin::unsupported(source, what); };
  QKV_CHECK(field(hf, "hidden_act", "silu") == "silu", source, ": 'hidden_act' is ", hf["hidden_act"].dump(),
            "; the SwiGLU MLP of these models uses silu");
  if (field(hf, "mlp_bias", false) != false) unsupported("'mlp_bias': true");
  if (field(hf, "pretraining_tp", 1) != 1) unsupported("'pretraining_tp' other than 1");
  // Rotary positions: rope_theta at the top (transformers 4) or in
  // rope_parameters (transformers 5); the plain rotation or Llama 3's
  // frequency scaling.
  double theta = field(hf, "rope_theta", 10000.0).get<double>();
  int64_t dynamic_context = 0;  // "dynamic" scaling: the longer context it allows
  nlohmann::ordered_json scaling = nlohmann::ordered_json::object();
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const nlohmann::json r = field(hf, key, nlohmann::json::object());
    if (!r.is_object()) unsupported(std::string("'") + key + "' " + r.dump());
    const std::string kind = field(r, "rope_type", field(r, "type", "default")).get<std::string>();
    const std::string where = source + ": '" + key + "'";
    if (kind == "linear") {
      scaling = {{"rope_scaling_type", "linear"}, {"rope_scaling_factor", required(r, "factor", where)}};
    } else if (kind == "llama3") {
      scaling = {{"rope_scaling_type", "llama3"},
                 {"rope_scaling_factor", required(r, "factor", where)},
                 {"rope_low_freq_factor", required(r, "low_freq_factor", where)},
                 {"rope_high_freq_factor", required(r, "high_freq_factor", where)},
                 {"rope_original_context", required(r, "original_max_position_embeddings", where)}};
    } else if (kind == "yarn") {
      // transformers' reading: factor, else max_position_embeddings over the
      // original context; attention_factor, else from factor (and mscale and
      // mscale_all_dim when both are set): 0.1 m ln(factor) + 1.
      const nlohmann::json original = required(r, "original_max_position_embeddings", where);
      const nlohmann::json given = field(r, "factor", nullptr);
      const double factor = given.is_null() ? field(hf, "max_position_embeddings", 2048).get<double>() /
                                                  original.get<double>()
                                            : given.get<double>();
      auto mscale = [&](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
      const nlohmann::json m = field(r, "mscale", nullptr), m_all = field(r, "mscale_all_dim", nullptr);
      double attention = mscale(1.0);
      if (!field(r, "attention_factor", nullptr).is_null()) attention = r["attention_factor"].get<double>();
      else if (!m.is_null() && !m_all.is_null() && m.get<double>() != 0 && m_all.get<double>() != 0)
        attention = mscale(m.get<double>()) / mscale(m_all.get<double>());
      const nlohmann::json fast = field(r, "beta_fast", nullptr), slow = field(r, "beta_slow", nullptr);
      scaling = {{"rope_scaling_type", "yarn"},
                 {"rope_scaling_factor", factor},
                 {"rope_original_context", original},
                 {"rope_beta_fast", fast.is_null() ? 32.0 : fast.get<double>()},
                 {"rope_beta_slow", slow.is_null() ? 1.0 : slow.get<double>()},
                 {"rope_attention_factor", attention},
                 {"rope_truncate", field(r, "truncate", true)}};
    } else if (kind == "dynamic") {
      // transformers scales past max_position_embeddings (the context it was
      // trained on); qkv allows factor times that.
      const int64_t original = whole(field(hf, "max_position_embeddings", 2048), "max_position_embeddings", source, 1,
                                     config::limits::kPositions);
      const double factor = required(r, "factor", where).get<double>();
      scaling = {
          {"rope_scaling_type", "dynamic"}, {"rope_scaling_factor", factor}, {"rope_original_context", original}};
      // Past the limit stays past it (the decoder's config names it), never an overflowing cast.
      dynamic_context = (int64_t)std::min(std::floor((double)original * std::max(factor, 1.0)),
                                          (double)config::limits::kPositions + 1);
    } else if (kind != "default") {
      unsupported(std::string("'") + key + "' of type '" + kind + "'");
    }
    theta = field(r, "rope_theta", theta).get<double>();
  }
  if (field(hf, "use_sliding_window", false) != false) unsupported("'use_sliding_window': true");
  for (const nlohmann::json& kind : field(hf, "layer_types", nlohmann::json::array()))
    if (kind != "full_attention") unsupported("'layer_types' with " + kind.dump());
  const int64_t heads =
      whole(required(hf, "num_attention_heads", source), "num_attention_heads", source, 1, config::limits::kHeads);
  const int64_t d = whole(required(hf, "hidden_size", source), "hidden_size", source, 1, config::limits::kWidth);
  int64_t context = whole(field(hf, "max_position_embeddings", 2048), "max_position_embeddings", source, 1,
                          std::numeric_limits<int64_t>::max());
  if (dynamic_context > 0) context = dynamic_context;
  // Mistral and Mixtral attend to the last sliding_window positions: the
  // same model as full attention up to that length, which is then the
  // context (longer is the decoder's "exceeds the context" error).
  if (type == "mistral" || type == "mixtral")
    context = std::min(context, whole(field(hf, "sliding_window", context), "sliding_window", source, 1,
                                      std::numeric_limits<int64_t>::max()));
  const bool qkv_bias = type == "qwen2" || field(hf, "attention_bias", false).get<bool>();
  const bool out_bias = type != "qwen2" && field(hf, "attention_bias", false).get<bool>();
  const bool qk_norm = type == "qwen3";
  nlohmann::ordered_json c = {
      {"arch", "decoder"},
      {"vocab_size", required(hf, "vocab_size", source)},
      {"num_layers", required(hf, "num_hidden_layers", source)},
      {"context", context},
      {"d_model", d},
      {"nhead", heads},
      {"num_kv_heads", field(hf, "num_key_value_heads", heads)},
      {"head_dim", field(hf, "head_dim", d / heads)},
      {"dim_feedforward", required(hf, "intermediate_size", source)},
      {"dropout", 0.0},
      {"activation", "silu"},
      {"norm_first", true},
      {"norm", "rmsnorm"},
      {"norm_eps", field(hf, "rms_norm_eps", 1e-6)},
      {"mlp", "swiglu"},
      {"positions", "rope"},
      {"rope_theta", theta},
      {"qkv_layout", "separate"},
      {"q_bias", qkv_bias},
      {"k_bias", qkv_bias},
      {"v_bias", qkv_bias},
      {"out_bias", out_bias},
      {"tie_output", field(hf, "tie_word_embeddings", false)},
  };
  // Mixtral: a router over num_local_experts SwiGLU experts, the top
  // num_experts_per_tok of its softmax renormalized, as qkv's MoE routes.
  if (type == "mixtral") {
    c["mlp"] = "moe";
    c["num_experts"] = required(hf, "num_local_experts", source);
    c["top_k"] = required(hf, "num_experts_per_tok", source);
    c["aux_loss_weight"] = field(hf, "router_aux_loss_coef", 0.0);
  }
  if (qk_norm) {
    c["qk_norm"] = true;
    c["qk_norm_eps"] = c["norm_eps"];
  }
  c.update(scaling);
  return {c.dump(2), decoder_weight_name};
}

}  // namespace qkv::builtin
