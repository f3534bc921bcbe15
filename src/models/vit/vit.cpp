// The Vision Transformer, its config, and attention rollout.
#include "qkv/vit.h"

#include "qkv/position.h"
#include "src/config/names.h"

template <>
struct qkv::config::EnumNames<qkv::Pool> {
  static constexpr std::pair<Pool, const char*> values[] = {{Pool::Mean, "mean"}, {Pool::Cls, "cls"}};
};

template <>
struct qkv::config::EnumNames<qkv::Resample> {
  static constexpr std::pair<Resample, const char*> values[] = {{Resample::Bilinear, "bilinear"},
                                                                {Resample::Bicubic, "bicubic"}};
};

namespace qkv {

static const config::Fields<ViTConfig>& vit_fields() {
  using C = ViTConfig;
  static const config::Fields<C> fields =
      config::Fields<C>()
          .constant("arch", "vit")
          .add("image_size", &C::image_size).at_least(1).at_most(1 << 16)  // patches() squares image_size / patch_size
          .add("patch_size", &C::patch_size).at_least(1)
          .add("channels", &C::channels).at_least(1)
          .add("d_model", &C::d_model).at_least(1).at_most(config::limits::kWidth)
          .add("nhead", &C::nhead).at_least(1).at_most(config::limits::kHeads)
          .add("num_layers", &C::num_layers).at_least(1).at_most(config::limits::kLayers)
          .add("mlp_ratio", &C::mlp_ratio).positive()
          .add("num_classes", &C::num_classes).at_least(2).at_most(config::limits::kClasses)
          .add("dropout", &C::dropout).fraction()
          .add("qkv_bias", &C::qkv_bias)
          .add("qkv_layout", &C::qkv_layout)
          .add("norm_eps", &C::norm_eps).positive()
          .add("positions", &C::positions).only({PositionKind::Learned, PositionKind::Sinusoidal2d})
          .add("pool", &C::pool)
          .add("class_names", &C::class_names)
          .add("resize_to", &C::resize_to).at_least(0).at_most(1 << 16)
          .written_if([](const C& c) { return c.resize_to != 0; })
          .add("resample", &C::resample)
          .written_if([](const C& c) { return c.resample != Resample::Bilinear; })
          .skip("train");
  return fields;
}

ViTConfig ViTConfig::from_json(const std::string& text, const std::string& source) {
  ViTConfig c = vit_fields().parse(text, source);
  QKV_CHECK(c.image_size % c.patch_size == 0, source, ": image_size ", c.image_size,
            " must be a positive multiple of patch_size ", c.patch_size);
  QKV_CHECK(c.channels == 1 || c.channels == 3, source, ": channels must be 1 or 3");
  QKV_CHECK(c.resize_to == 0 || c.resize_to >= c.image_size, source, ": resize_to ", c.resize_to,
            " is smaller than image_size ", c.image_size, " (the centre crop would not fit)");
  QKV_CHECK(c.d_model % c.nhead == 0, source, ": d_model ", c.d_model, " must be a positive multiple of nhead ", c.nhead);
  QKV_CHECK(c.positions != PositionKind::Sinusoidal2d || c.d_model % 4 == 0, source,
            ": 2-D sinusoidal positions need d_model divisible by 4");
  QKV_CHECK(c.dim_feedforward() >= 1, source, ": mlp_ratio ", c.mlp_ratio, " leaves no MLP width");
  QKV_CHECK(c.class_names.empty() || (int64_t)c.class_names.size() == c.num_classes, source, ": ",
            c.class_names.size(), " class_names for ", c.num_classes, " classes");
  if (c.class_names.empty())
    for (int64_t i = 0; i < c.num_classes; ++i) c.class_names.push_back(std::to_string(i));
  return c;
}

std::string ViTConfig::to_json() const { return vit_fields().write(*this).dump(2); }

Tensor patchify(const Tensor& images, int64_t p) {
  QKV_CHECK(images.dim() == 4 && images.size(2) % p == 0 && images.size(3) % p == 0, "patchify: images ",
            shape_str(images.shape()), " do not split into ", p, "x", p, " patches");
  const int64_t B = images.size(0), C = images.size(1), gh = images.size(2) / p, gw = images.size(3) / p;
  return images.reshape({B, C, gh, p, gw, p}).permute({0, 2, 4, 1, 3, 5}).reshape({B, gh * gw, C * p * p});
}

VisionTransformer::VisionTransformer(const ViTConfig& c, Rng& rng) : config_(c) {
  const int64_t D = c.d_model, tokens = c.patches() + (c.pool == Pool::Cls ? 1 : 0);
  patch_embed = register_module(
      "patch_embed", std::make_shared<Linear>(LinearOptions{c.channels * c.patch_size * c.patch_size, D}, rng));
  if (c.positions == PositionKind::Learned) pos_embed = register_parameter("pos_embed", Tensor::randn({tokens, D}, rng, 0.02f));
  if (c.pool == Pool::Cls) cls_token = register_parameter("cls_token", Tensor::randn({D}, rng, 0.02f));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout, rng.next_bits()));
  TransformerLayerOptions o;
  o.d_model = D, o.dim_feedforward = c.dim_feedforward(), o.dropout = c.dropout;
  o.attention.nhead = c.nhead;
  o.attention.bias.q = o.attention.bias.k = o.attention.bias.v = c.qkv_bias;
  o.attention.qkv_layout = c.qkv_layout;
  o.norm_eps = c.norm_eps;
  o.activation = Activation::Gelu, o.norm_first = true;
  for (int64_t i = 0; i < c.num_layers; ++i)
    layers.push_back(register_module("layers." + std::to_string(i), std::make_shared<TransformerEncoderLayer>(o, rng)));
  norm = register_module("norm", std::make_shared<Norm>(NormKind::LayerNorm, D, c.norm_eps));
  head = register_module("head", std::make_shared<Linear>(LinearOptions{D, c.num_classes}, rng));
}

Tensor VisionTransformer::forward(const Tensor& images, bool need_weights) {
  const ViTConfig& c = config_;
  QKV_CHECK(images.dim() == 4 && images.size(1) == c.channels && images.size(2) == c.image_size &&
                images.size(3) == c.image_size,
            "vit: expected images [B, ", c.channels, ", ", c.image_size, ", ", c.image_size, "], got ",
            shape_str(images.shape()));
  const int64_t B = images.size(0), D = c.d_model;
  Tensor x = patch_embed->forward(patchify(images, c.patch_size));  // [B, N, D]
  if (c.pool == Pool::Cls) x = concat({add(Tensor::zeros({B, 1, D}), cls_token), x}, 1);
  if (pos_embed.defined()) {
    x = add(x, pos_embed);
  } else {
    Tensor pe = sinusoidal_encoding_2d(c.grid(), c.grid(), D);
    if (c.pool == Pool::Cls) pe = concat({Tensor::zeros({1, D}), pe}, 0);  // the class token has no position
    x = add(x, pe);
  }
  x = dropout->forward(x);
  for (auto& layer : layers) x = layer->forward(x, {.need_weights = need_weights});
  x = norm->forward(x);
  Tensor pooled = c.pool == Pool::Cls ? x.slice(1, 0, 1).reshape({B, D}) : mean(x, {1});
  return head->forward(pooled);
}

Tensor VisionTransformer::rollout() const {
  NoGradGuard no_grad;
  Tensor r;
  for (auto& layer : layers) {
    QKV_CHECK(layer->last_self_weights.defined(), "vit: rollout needs a forward with need_weights");
    Tensor a = mean(layer->last_self_weights, {1});  // [B, T, T]
    const int64_t B = a.size(0), T = a.size(1);
    std::vector<float> m = a.contiguous().to_vector();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i) {
        float* row = m.data() + (b * T + i) * T;
        for (int64_t j = 0; j < T; ++j) row[j] = 0.5f * row[j] + (i == j ? 0.5f : 0.0f);
      }
    Tensor step = Tensor::from_vector(m, {B, T, T});
    r = r.defined() ? matmul(step, r) : step;  // later layers apply after earlier ones
  }
  const int64_t B = r.size(0), T = r.size(1), N = config_.patches();
  // Rows of the pooled output: the class token, or the mean over patches.
  Tensor rows = config_.pool == Pool::Cls ? r.slice(1, 0, 1) : mean(r, {1}, {.keepdim = true});  // [B, 1, T]
  Tensor patches = rows.slice(2, T - N, T).contiguous();
  return patches.reshape({B, config_.grid(), config_.grid()});
}

std::string VisionTransformer::summary() const {
  const ViTConfig& c = config_;
  return "vit: " + std::to_string(c.image_size) + "x" + std::to_string(c.image_size) + " images, " +
         std::to_string(c.patches()) + " patches of " + std::to_string(c.patch_size) + "x" +
         std::to_string(c.patch_size) + ", d_model " + std::to_string(c.d_model) + ", " +
         std::to_string(c.num_layers) + " layers, " + std::to_string(c.nhead) + " heads, " +
         std::to_string(parameter_count()) + " parameters, " + std::to_string(c.num_classes) + " classes";
}

}  // namespace qkv
