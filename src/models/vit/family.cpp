// The "vit" family: the Vision Transformer; and its reading of Hugging Face
// ViTForImageClassification folders: Pre-Norm layers with separate q/k/v,
// the class token pooled, the patch convolution as a matrix (its [D, C, p, p]
// weight is the [D, C*p*p] matrix of patches flattened channel by channel,
// row by row, as patchify lays them out), id2label as the class names, and
// preprocessor_config.json's normalization (any mean and std per channel,
// folded into the patch embedding: fold_normalization). An option that
// changes the math and that qkv does not implement is an error naming the
// field.
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <system_error>

#include "qkv/io.h"
#include "qkv/vit.h"
#include "src/config/fields.h"
#include "src/core/json.h"
#include "src/models/families.h"

namespace qkv::builtin {

namespace {

using Json = nlohmann::json;

// HF -> qkv names of vit.encoder.layer.N.*.
const std::vector<std::pair<std::string, std::string>> kVitLayerWeights = {
    {"attention.attention.query", "self_attn.q_proj"}, {"attention.attention.key", "self_attn.k_proj"},
    {"attention.attention.value", "self_attn.v_proj"}, {"attention.output.dense", "self_attn.out_proj"},
    {"layernorm_before", "norm1"},                     {"layernorm_after", "norm2"},
    {"intermediate.dense", "mlp.mlp.fc1"},             {"output.dense", "mlp.mlp.fc2"},
};

std::string vit_weight_name(const std::string& hf) {
  static const std::map<std::string, std::string> kTop = {
      {"vit.embeddings.cls_token", "cls_token"},
      {"vit.embeddings.position_embeddings", "pos_embed"},
      {"vit.embeddings.patch_embeddings.projection.weight", "patch_embed.weight"},
      {"vit.embeddings.patch_embeddings.projection.bias", "patch_embed.bias"},
      {"vit.layernorm.weight", "norm.weight"},
      {"vit.layernorm.bias", "norm.bias"},
      {"classifier.weight", "head.weight"},
      {"classifier.bias", "head.bias"}};
  if (auto it = kTop.find(hf); it != kTop.end()) return it->second;
  if (hf.rfind("vit.pooler.", 0) == 0) return HfImport::kSkip;  // ViTModel's pooler: not used for classification
  static const std::regex layer(R"(vit\.encoder\.layer\.(\d+)\.(.+)\.(weight|bias))");
  std::smatch m;
  if (!std::regex_match(hf, m, layer)) return "";
  for (const auto& [from, to] : kVitLayerWeights)
    if (m[2] == from) return "layers." + m[1].str() + "." + to + "." + m[3].str();
  return "";
}

// The class token [1, 1, D] -> [D], the positions [1, N+1, D] -> [N+1, D],
// the patch convolution [D, C, p, p] -> [D, C*p*p].
Tensor vit_convert(const std::string& hf, const Tensor& t) {
  if (hf == "vit.embeddings.cls_token") return t.reshape({t.numel()});
  if (hf == "vit.embeddings.position_embeddings" && t.dim() == 3) return t.reshape({t.size(1), t.size(2)});
  if (hf == "vit.embeddings.patch_embeddings.projection.weight" && t.dim() == 4)
    return t.contiguous().reshape({t.size(0), t.size(1) * t.size(2) * t.size(3)});
  return t;
}

// A number, or a list of one value per channel: `channels` values.
std::vector<double> per_channel(const Json& v, int64_t channels, const std::string& source, const std::string& key) {
  const Json list = v.is_array() ? v : Json::array({v});
  QKV_CHECK(list.size() == 1 || (int64_t)list.size() == channels, source, ": \"", key, "\" ", v.dump(),
            " must be one number or one per channel (", channels, ")");
  std::vector<double> out;
  for (int64_t c = 0; c < channels; ++c) {
    const Json& x = list[list.size() == 1 ? 0 : (size_t)c];
    QKV_CHECK(x.is_number(), source, ": \"", key, "\" ", v.dump(), " must hold numbers");
    out.push_back(x.get<double>());
  }
  return out;
}

// What ViTImageProcessor does to the pixels p: (p * rescale_factor - mean) /
// std per channel, or p * rescale_factor without do_normalize.
struct PixelNormalization {
  std::vector<double> mean, std;
  bool is_qkvs() const {  // qkv's own inputs: (p / 255 - 0.5) / 0.5
    for (size_t c = 0; c < mean.size(); ++c)
      if (std::abs(mean[c] - 0.5) > 1e-9 || std::abs(std[c] - 0.5) > 1e-9) return false;
    return true;
  }
};

// A square side in a processor's "size" or "crop_size": a number, or
// {"height": h, "width": w} with h == w; `fallback` when absent.
int64_t square_side(const Json& p, const char* key, int64_t fallback, const std::string& source) {
  const Json v = p.value(key, Json());
  if (v.is_null()) return fallback;
  if (v.is_number_integer()) return v.get<int64_t>();
  QKV_CHECK(v.is_object() && v.contains("height") && v.contains("width") && v["height"].is_number_integer() &&
                v["width"].is_number_integer(),
            source, ": \"", key, "\" ", v.dump(), " is not a number or {\"height\", \"width\"}");
  QKV_CHECK(v["height"] == v["width"], source, ": \"", key, "\" ", v.dump(), " is not square");
  return v["height"].get<int64_t>();
}

// What a folder's preprocessor_config.json asks of the pixels: their
// normalization, and how a picture is brought to image_size (the resize and
// crop of ViTImageProcessor and DeiTImageProcessor).
struct Preprocessor {
  PixelNormalization pixels;
  int64_t resize_to = 0;
  std::string resample = "bilinear";
};

Preprocessor read_preprocessor(const std::filesystem::path& dir, int64_t image_size, int64_t channels) {
  const std::string source = (dir / "preprocessor_config.json").string();
  Preprocessor out;
  PixelNormalization& n = out.pixels;
  n = {std::vector<double>(channels, 0.5), std::vector<double>(channels, 0.5)};
  const Json p = folder_json(source);
  if (p.is_null()) return out;
  QKV_CHECK(p.is_object(), source, ": expected a JSON object");
  if (p.value("do_normalize", true)) {
    n.mean = per_channel(p.value("image_mean", Json(0.5)), channels, source, "image_mean");
    n.std = per_channel(p.value("image_std", Json(0.5)), channels, source, "image_std");
    for (double s : n.std) QKV_CHECK(s > 0, source, ": \"image_std\" must be positive");
  } else {
    n.mean.assign(channels, 0.0), n.std.assign(channels, 1.0);
  }
  if (!p.value("do_rescale", true)) unsupported(source, "\"do_rescale\": false");
  const double rescale = p.value("rescale_factor", 1.0 / 255);
  if (std::abs(rescale - 1.0 / 255) > 1e-9) unsupported(source, "\"rescale_factor\": " + std::to_string(rescale));
  if (!p.value("do_resize", true)) unsupported(source, "\"do_resize\": false");
  const Json resample = p.value("resample", Json(2));  // PIL's codes: 2 bilinear, 3 bicubic
  if (resample == Json(3)) {
    out.resample = "bicubic";
  } else if (resample != Json(2)) {
    unsupported(source, "\"resample\": " + resample.dump());
  }
  const int64_t size = square_side(p, "size", image_size, source);
  if (p.value("do_center_crop", false)) {
    const int64_t crop = square_side(p, "crop_size", size, source);
    QKV_CHECK(crop == image_size, source, ": \"crop_size\" ", crop, " differs from the model's image_size ",
              image_size);
    QKV_CHECK(size >= crop, source, ": \"size\" ", size, " is smaller than \"crop_size\" ", crop);
    if (size != image_size) out.resize_to = size;
  } else {
    QKV_CHECK(size == image_size, source, ": \"size\" ", p.value("size", Json()).dump(), " differs from the model's image_size ",
              image_size);
  }
  return out;
}

// qkv feeds a ViT x = (p / 255 - 0.5) / 0.5; the folder's model was trained on
// (p / 255 - mean_c) / std_c = x * 0.5 / std_c + (0.5 - mean_c) / std_c. The
// patch embedding is linear, so that per-channel scale and shift go into its
// weight and bias once, at load: W'[:, c, .] = W[:, c, .] * 0.5 / std_c and
// b' = b + sum over c and the patch of W[:, c, .] * (0.5 - mean_c) / std_c.
void fold_normalization(StateDict& state, const PixelNormalization& n) {
  Tensor& w = state.at("patch_embed.weight");  // [D, C*p*p], channel-major (patchify's order)
  Tensor& b = state.at("patch_embed.bias");
  const int64_t D = w.size(0), C = (int64_t)n.mean.size(), per = w.size(1) / C;
  QKV_CHECK(w.dim() == 2 && w.size(1) == C * per && b.numel() == D, "patch_embed: shape ", shape_str(w.shape()),
            " does not fit ", C, " channels");
  std::vector<float> wv = w.to(DType::F32).contiguous().to_vector(), bv = b.to(DType::F32).contiguous().to_vector();
  for (int64_t d = 0; d < D; ++d) {
    double shift = bv[(size_t)d];
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < per; ++k) {
        float& x = wv[(size_t)(d * C * per + c * per + k)];
        shift += (double)x * (0.5 - n.mean[c]) / n.std[c];
        x = (float)((double)x * 0.5 / n.std[c]);
      }
    bv[(size_t)d] = (float)shift;
  }
  w = Tensor::from_vector(wv, w.shape());
  b = Tensor::from_vector(bv, b.shape());
}

HfImport import_hf_vit(const std::string& text, const std::string& source) {
  const Json hf = parse_json(text, source);
  const std::string act = hf.value("hidden_act", std::string("gelu"));
  if (act != "gelu") unsupported(source, "\"hidden_act\": \"" + act + "\"");
  using config::limits::kWidth;
  const int64_t d = whole(required(hf, "hidden_size", source), "hidden_size", source, 1, kWidth);
  const int64_t ff = whole(required(hf, "intermediate_size", source), "intermediate_size", source, 1, kWidth);
  const int64_t image_size = whole(required(hf, "image_size", source), "image_size", source, 1, kWidth);
  const int64_t channels = whole(field(hf, "num_channels", 3), "num_channels", source, 1, kWidth);
  Json c = {{"arch", "vit"},
            {"image_size", image_size},
            {"patch_size", required(hf, "patch_size", source)},
            {"channels", channels},
            {"d_model", d},
            {"nhead", required(hf, "num_attention_heads", source)},
            {"num_layers", required(hf, "num_hidden_layers", source)},
            {"mlp_ratio", (double)ff / (double)d},
            {"qkv_bias", hf.value("qkv_bias", true)},
            {"qkv_layout", "separate"},
            {"norm_eps", hf.value("layer_norm_eps", 1e-12)},
            {"dropout", hf.value("hidden_dropout_prob", 0.0)},
            {"positions", "learned"},
            {"pool", "cls"}};
  // id2label {"0": "cat", ...}: the class names in id order; every id from 0 must be there.
  const Json labels = required(hf, "id2label", source);
  QKV_CHECK(labels.is_object() && !labels.empty(), source, ": id2label must name the classes");
  std::vector<std::string> names(labels.size());
  for (auto& [id, name] : labels.items()) {
    size_t i = 0;
    const auto [end, error] = std::from_chars(id.data(), id.data() + id.size(), i);
    QKV_CHECK(error == std::errc() && end == id.data() + id.size() && i < names.size() && name.is_string(), source,
              ": id2label: '", id, "' is not one of the ids 0 to ", names.size() - 1, " with a name");
    names[i] = name.get<std::string>();
  }
  c["num_classes"] = names.size();
  c["class_names"] = names;
  QKV_CHECK((int64_t)std::llround(c["mlp_ratio"].get<double>() * (double)d) == ff, source,
            ": intermediate_size ", ff, " is not a whole multiple qkv's mlp_ratio keeps");
  const Preprocessor pre = read_preprocessor(std::filesystem::path(source).parent_path(), image_size, channels);
  c["resize_to"] = pre.resize_to;
  c["resample"] = pre.resample;
  const PixelNormalization& pixels = pre.pixels;
  HfImport import{.config_json = c.dump(), .weight_name = vit_weight_name, .convert = vit_convert};
  if (!pixels.is_qkvs()) import.finish = [pixels](StateDict& state) { fold_normalization(state, pixels); };
  return import;
}

}  // namespace

Family vit() {
  Family f = family_of<VisionTransformer, ViTConfig>("vit", "a Vision Transformer", Domain::Vision,
                                                     {Task::Classify, Task::Eval});
  f.hf_architectures = {"ViTForImageClassification"};
  f.from_hf = import_hf_vit;
  return f;
}

}  // namespace qkv::builtin
