// The "encoder" family: BERT's kind of text encoder, for sentence
// embeddings; and its reading of Hugging Face BertModel folders, with the
// pooling and normalization sentence-transformers saves beside them
// (modules.json, 1_Pooling/config.json, a Normalize module,
// sentence_bert_config.json's max_seq_length). An option that changes the
// math and that qkv does not implement is an error naming the field.
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "qkv/encoder.h"
#include "qkv/io.h"
#include "src/core/json.h"
#include "src/models/families.h"

namespace qkv::builtin {

namespace {

using Json = nlohmann::json;


// HF -> qkv names of encoder.layer.N.*.
const std::vector<std::pair<std::string, std::string>> kBertLayerWeights = {
    {"attention.self.query", "self_attn.q_proj"},        {"attention.self.key", "self_attn.k_proj"},
    {"attention.self.value", "self_attn.v_proj"},        {"attention.output.dense", "self_attn.out_proj"},
    {"attention.output.LayerNorm", "norm1"},             {"intermediate.dense", "mlp.mlp.fc1"},
    {"output.dense", "mlp.mlp.fc2"},                     {"output.LayerNorm", "norm2"},
};

// LayerNorm's old names (gamma, beta) and its new ones (weight, bias).
std::string param_name(const std::string& p) { return p == "gamma" ? "weight" : p == "beta" ? "bias" : p; }

std::string bert_weight_name(std::string hf) {
  if (hf.rfind("bert.", 0) == 0) hf = hf.substr(5);  // BertFor...: the same model under "bert."
  if (hf == "embeddings.position_ids" || hf.rfind("pooler.", 0) == 0) return HfImport::kSkip;
  static const std::map<std::string, std::string> kEmbeddings = {
      {"embeddings.word_embeddings.weight", "embed.weight"},
      {"embeddings.position_embeddings.weight", "positions.weight"},
      {"embeddings.token_type_embeddings.weight", "token_types.weight"}};
  if (auto it = kEmbeddings.find(hf); it != kEmbeddings.end()) return it->second;
  static const std::regex norm(R"(embeddings\.LayerNorm\.(weight|bias|gamma|beta))");
  static const std::regex layer(R"(encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta))");
  std::smatch m;
  if (std::regex_match(hf, m, norm)) return "embed_norm." + param_name(m[1]);
  if (!std::regex_match(hf, m, layer)) return "";
  for (const auto& [from, to] : kBertLayerWeights)
    if (m[2] == from) return "layers." + m[1].str() + "." + to + "." + param_name(m[3]);
  return "";
}

// sentence-transformers' modules after the transformer: pooling (mean or the
// [CLS] token) and whether a Normalize module follows; anything else is an error.
void read_sentence_transformers(const std::filesystem::path& dir, Json& c) {
  const Json modules = folder_json(dir / "modules.json");
  if (modules.is_null()) return;
  const std::string source = (dir / "modules.json").string();
  QKV_CHECK(modules.is_array(), source, ": expected a list of modules");
  for (const Json& m : modules) {
    QKV_CHECK(m.is_object() && m.value("type", Json()).is_string(), source, ": a module without a \"type\"");
    const std::string type = m["type"].get<std::string>();
    const std::string name = type.substr(type.rfind('.') + 1);
    if (name == "Transformer") continue;
    if (name == "Normalize") {
      c["normalize"] = true;
      continue;
    }
    if (name != "Pooling") unsupported(source, "the module " + type);
    const std::string path = (dir / m.value("path", std::string()) / "config.json").string();
    const Json p = folder_json(path);
    QKV_CHECK(p.is_object(), path, ": the pooling module's config is missing");
    const bool cls = p.value("pooling_mode_cls_token", false), mean = p.value("pooling_mode_mean_tokens", false);
    for (const char* other : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                              "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"})
      if (p.value(other, false)) unsupported(path, std::string("\"") + other + "\"");
    QKV_CHECK(cls != mean, path, ": exactly one of pooling_mode_mean_tokens and pooling_mode_cls_token must be true");
    c["pooling"] = cls ? "cls" : "mean";
  }
  const Json sbert = folder_json(dir / "sentence_bert_config.json");
  if (sbert.is_object() && sbert.value("max_seq_length", Json()).is_number_integer())
    c["max_tokens"] = sbert["max_seq_length"].get<int64_t>();
}

HfImport import_hf_bert(const std::string& text, const std::string& source) {
  const Json hf = parse_json(text, source);
  if (hf.value("is_decoder", false)) unsupported(source, "\"is_decoder\": true");
  if (hf.value("add_cross_attention", false)) unsupported(source, "\"add_cross_attention\": true");
  const std::string positions = hf.value("position_embedding_type", std::string("absolute"));
  if (positions != "absolute") unsupported(source, "\"position_embedding_type\": \"" + positions + "\"");
  const std::string act = hf.value("hidden_act", std::string("gelu"));
  static const std::map<std::string, std::string> kActivations = {
      {"gelu", "gelu"}, {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"}, {"relu", "relu"}};
  if (!kActivations.count(act)) unsupported(source, "\"hidden_act\": \"" + act + "\"");
  Json c = {{"arch", "encoder"},
            {"vocab_size", required(hf, "vocab_size", source)},
            {"d_model", required(hf, "hidden_size", source)},
            {"num_layers", required(hf, "num_hidden_layers", source)},
            {"nhead", required(hf, "num_attention_heads", source)},
            {"dim_feedforward", required(hf, "intermediate_size", source)},
            {"context", required(hf, "max_position_embeddings", source)},
            {"type_vocab_size", field(hf, "type_vocab_size", 2)},
            {"norm_eps", hf.value("layer_norm_eps", 1e-12)},
            {"activation", kActivations.at(act)},
            {"dropout", hf.value("hidden_dropout_prob", 0.1)}};
  read_sentence_transformers(std::filesystem::path(source).parent_path(), c);
  return {.config_json = c.dump(), .weight_name = bert_weight_name};
}

}  // namespace

Family encoder() {
  Family f = family_of<TextEncoder, EncoderConfig>("encoder", "a text encoder (sentence embeddings)",
                                                   Domain::Embedding, {Task::Embed});
  f.hf_architectures = {"BertModel"};
  f.from_hf = import_hf_bert;
  return f;
}

}  // namespace qkv::builtin
