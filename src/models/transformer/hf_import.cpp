// Hugging Face MarianMTModel (the Helsinki-NLP opus-mt models) as qkv's
// translation Transformer. Marian is the encoder-decoder of the lecture with
// Post-Norm layers (LayerNorm after each residual sum, no final norm),
// separate q/k/v projections with biases, a dense MLP (swish in the opus-mt
// models), one embedding for source, target and output head (or, with
// share_encoder_decoder_embeddings false, one for the source and one for
// the target and the head: qkv's source_vocab_size), scaled by
// sqrt(d_model), and sinusoidal positions laid out as halves (every sine,
// then every cosine). It adds final_logits_bias to the logits, starts
// decoding from decoder_start_token_id (its <pad>) and ends the source with
// </s>. The config keys and weight names are mapped here; an option that
// changes the math and that qkv does not implement is an error naming the
// field, never a different model.
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "qkv/models.h"
#include "src/core/json.h"
#include "src/models/families.h"

namespace qkv::builtin {

namespace {

// HF -> qkv names inside encoder.layers.N / decoder.layers.N.
const std::vector<std::pair<std::string, std::string>> kMarianLayerWeights = {
    {"self_attn.q_proj", "self_attn.q_proj"},
    {"self_attn.k_proj", "self_attn.k_proj"},
    {"self_attn.v_proj", "self_attn.v_proj"},
    {"self_attn.out_proj", "self_attn.out_proj"},
    {"encoder_attn.q_proj", "cross_attn.q_proj"},
    {"encoder_attn.k_proj", "cross_attn.k_proj"},
    {"encoder_attn.v_proj", "cross_attn.v_proj"},
    {"encoder_attn.out_proj", "cross_attn.out_proj"},
    {"fc1", "mlp.mlp.fc1"},
    {"fc2", "mlp.mlp.fc2"},
};

// The norms: an encoder layer's two, a decoder layer's three, in the order
// of the sublayers they follow.
const std::map<std::string, std::string> kEncoderNorms = {{"self_attn_layer_norm", "norm1"},
                                                          {"final_layer_norm", "norm2"}};
const std::map<std::string, std::string> kDecoderNorms = {
    {"self_attn_layer_norm", "norm1"}, {"encoder_attn_layer_norm", "norm2"}, {"final_layer_norm", "norm3"}};

// `separate`: the source's embedding is the encoder's embed_tokens, the
// target's the decoder's (and the head's, tied to it).
std::string marian_weight_name(const std::string& hf, bool separate) {
  if (separate) {
    if (hf == "model.encoder.embed_tokens.weight") return "source_embed.weight";
    if (hf == "model.decoder.embed_tokens.weight") return "embed.weight";
    if (hf == "lm_head.weight") return HfImport::kSkip;  // the tied copy
  }
  if (hf == "model.shared.weight") return separate ? "" : "embed.weight";
  if (hf == "final_logits_bias") return "output_bias";
  // The tied copies transformers may also write: the shared embedding is
  // what it loads them from.
  if (hf == "model.encoder.embed_tokens.weight" || hf == "model.decoder.embed_tokens.weight" ||
      hf == "lm_head.weight")
    return HfImport::kSkip;
  // Sinusoidal tables older files carry: qkv computes them (checked against transformers' in the tests).
  if (hf == "model.encoder.embed_positions.weight" || hf == "model.decoder.embed_positions.weight")
    return HfImport::kSkip;
  static const std::regex layer(R"(model\.(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias))");
  std::smatch m;
  if (!std::regex_match(hf, m, layer)) return "";
  const std::string prefix = m[1].str() + ".layers." + m[2].str() + ".", part = m[3].str(), kind = m[4].str();
  const auto& norms = m[1] == "encoder" ? kEncoderNorms : kDecoderNorms;
  if (auto n = norms.find(part); n != norms.end()) return prefix + n->second + "." + kind;
  for (const auto& [from, to] : kMarianLayerWeights)
    if (part == from && (m[1] == "decoder" || from.rfind("encoder_attn", 0) != 0)) return prefix + to + "." + kind;
  return "";
}

// final_logits_bias is [1, V]; qkv's output_bias [V].
Tensor marian_convert(const std::string& hf_name, const Tensor& t) {
  if (hf_name != "final_logits_bias") return t;
  QKV_CHECK(t.dim() == 2 && t.size(0) == 1, hf_name, ": expected shape [1, vocab], got ", shape_str(t.shape()));
  return t.reshape({t.size(1)});
}

}  // namespace

// The values are checked by the transformer's own config reader afterwards; a field
// of the wrong JSON type is load_hf's one-line error.
HfImport import_hf_marian(const std::string& text, const std::string& source) {
  const nlohmann::json hf = parse_json(text, source);
  QKV_CHECK(hf.is_object(), source, ": expected a JSON object");
  auto unsupported = [&](const std::string& what) { qkv::builtin::unsupported(source, what); };
  const nlohmann::json shared = field(hf, "share_encoder_decoder_embeddings", true);
  QKV_CHECK(shared.is_boolean(), source, ": 'share_encoder_decoder_embeddings' must be true or false, got ",
            shared.dump());
  const bool separate = !shared.get<bool>();
  if (field(hf, "tie_word_embeddings", true) != true) unsupported("'tie_word_embeddings': false");
  // vocab_size is the source's (the encoder's embedding), decoder_vocab_size
  // the target's; one vocabulary for both unless they are separate.
  const nlohmann::json vocab = required(hf, "vocab_size", source);
  const nlohmann::json target_vocab = field(hf, "decoder_vocab_size", vocab);
  if (!separate && target_vocab != vocab) unsupported("a 'decoder_vocab_size' other than 'vocab_size'");
  // qkv's encoder and decoder layers share their widths (the layer counts may differ).
  for (const auto& [enc, dec] : {std::pair{"encoder_attention_heads", "decoder_attention_heads"},
                                 std::pair{"encoder_ffn_dim", "decoder_ffn_dim"}})
    if (required(hf, enc, source) != required(hf, dec, source))
      unsupported("'" + std::string(enc) + "' different from '" + dec + "'");
  const std::string act = field(hf, "activation_function", "gelu").get<std::string>();
  static const std::map<std::string, std::string> kActivations = {{"swish", "silu"},
                                                                  {"silu", "silu"},
                                                                  {"gelu", "gelu"},
                                                                  {"gelu_new", "gelu_tanh"},
                                                                  {"gelu_pytorch_tanh", "gelu_tanh"},
                                                                  {"relu", "relu"}};
  const auto a = kActivations.find(act);
  if (a == kActivations.end()) unsupported("'activation_function' '" + act + "'");
  const nlohmann::json pad = required(hf, "pad_token_id", source);
  nlohmann::json eos = required(hf, "eos_token_id", source);
  if (eos.is_array()) {
    if (eos.size() != 1) unsupported("more than one 'eos_token_id'");
    eos = eos[0];
  }
  // generate()'s forced_eos_token_id (the opus-mt folders set it to their
  // </s>): the last token a length limit allows is that id.
  const nlohmann::json forced = field(hf, "forced_eos_token_id", nullptr);
  if (!forced.is_null() && forced != eos) unsupported("a 'forced_eos_token_id' other than 'eos_token_id'");
  nlohmann::ordered_json c = {
      {"arch", "transformer"},
      {"vocab_size", target_vocab},
      {"num_encoder_layers", required(hf, "encoder_layers", source)},
      {"num_decoder_layers", required(hf, "decoder_layers", source)},
      {"d_model", required(hf, "d_model", source)},
      {"nhead", required(hf, "encoder_attention_heads", source)},
      {"dim_feedforward", required(hf, "encoder_ffn_dim", source)},
      {"dropout", 0.0},
      {"activation", a->second},
      {"norm_first", false},
      {"norm", "layernorm"},
      {"norm_eps", 1e-5},  // torch.nn.LayerNorm's default, which Marian's layers use
      {"mlp", "dense"},
      {"positions", "sinusoidal_halves"},
      {"qkv_layout", "separate"},
      {"q_bias", true},
      {"k_bias", true},
      {"v_bias", true},
      {"out_bias", true},
      {"tie_output", true},
      {"scale_embedding", field(hf, "scale_embedding", false)},
      {"output_bias", true},
      {"pad_id", pad},
      {"decoder_start_id", field(hf, "decoder_start_token_id", pad)},
      {"eos_id", eos},
      {"source_eos", true},
      {"forced_eos", !forced.is_null()},
  };
  if (separate) c["source_vocab_size"] = vocab;
  return {c.dump(2), [separate](const std::string& hf_name) { return marian_weight_name(hf_name, separate); },
          marian_convert};
}

}  // namespace qkv::builtin
