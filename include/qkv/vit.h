// qkv/vit.h — the Vision Transformer (Dosovitskiy et al. 2021): an image cut
// into non-overlapping patches is a sequence of tokens.
//
//   patches  x_p [B, N, C p p]  (N = (image_size / p)^2, row-major)
//   tokens   z = x_p W_E^T + b_E + E_pos          [B, N, D]
//   blocks   L Pre-Norm encoder layers, no mask
//   output   logits = W_head mean_n(LN(z_n)) + b  [B, classes]   ("pool": "mean")
//            or the class token's output            ("pool": "cls")
#pragma once

#include <string>
#include <vector>

#include "qkv/blocks.h"
#include "qkv/vision.h"

namespace qkv {

// What the classifier head reads: the mean of the patch outputs, or a class token's.
enum class Pool { Mean, Cls };

struct ViTConfig {
  int64_t image_size = 28, patch_size = 4, channels = 1;
  int64_t d_model = 64, nhead = 4, num_layers = 4;
  double mlp_ratio = 2.0;  // dim_feedforward = mlp_ratio * d_model
  int64_t num_classes = 10;
  float dropout = 0.0f;
  bool qkv_bias = true;  // biases of the q, k and v projections (as Hugging Face's ViTConfig.qkv_bias)
  QkvLayout qkv_layout = QkvLayout::Fused;  // one q/k/v matrix, or three (as Hugging Face's checkpoints)
  float norm_eps = 1e-5f;                   // of every LayerNorm (Hugging Face's layer_norm_eps: 1e-12)
  PositionKind positions = PositionKind::Learned;  // Learned | Sinusoidal2d
  Pool pool = Pool::Mean;
  std::vector<std::string> class_names;  // shown by qkv classify; default "0", "1", ...
  // How a picture of another size is brought to image_size (qkv/vision.h):
  // resized to resize_to (0: image_size) with `resample`, then centre-cropped.
  int64_t resize_to = 0;
  Resample resample = Resample::Bilinear;

  int64_t grid() const { return image_size / patch_size; }
  int64_t patches() const { return grid() * grid(); }
  int64_t dim_feedforward() const { return (int64_t)(mlp_ratio * d_model + 0.5); }
  ImageResize image_resize() const { return {.size = image_size, .resize = resize_to, .resample = resample}; }
  // Unknown keys and bad values are errors naming `source`; "train" is skipped.
  static ViTConfig from_json(const std::string& text, const std::string& source);
  std::string to_json() const;
};

// Parameters: patch_embed.{weight [D, C p p], bias}, pos_embed [N(+1), D] (learned),
// cls_token [D] (pool "cls"), layers.i.* (TransformerEncoderLayer, norm_first),
// norm.{weight,bias}, head.{weight [classes, D], bias}.
class VisionTransformer : public Module {
public:
  VisionTransformer(const ViTConfig& config, Rng& rng);
  // images [B, C, H, W] -> logits [B, classes]. With need_weights every
  // layer keeps its attention weights (layers[i]->last_self_weights).
  Tensor forward(const Tensor& images, bool need_weights = false);
  // Attention rollout (Abnar and Zuidema 2020) of the last forward with
  // need_weights: R = prod_l (0.5 I + 0.5 mean_heads A_l), a product of
  // row-stochastic matrices, so its rows sum to 1;
  // -> [B, grid, grid], what the pooled output draws from each patch
  // (the mean of R's patch rows, or the class token's row without its own column).
  Tensor rollout() const;
  const ViTConfig& config() const { return config_; }
  std::string summary() const;

  std::shared_ptr<Linear> patch_embed, head;
  Tensor pos_embed, cls_token;
  std::vector<std::shared_ptr<TransformerEncoderLayer>> layers;
  std::shared_ptr<Norm> norm;
  std::shared_ptr<Dropout> dropout;

private:
  ViTConfig config_;
};

// images [B, C, H, W] -> [B, N, C p p]: patch (gy, gx) is token gy * grid + gx,
// its values in (c, y, x) order (the order of a Conv2d kernel of size p).
Tensor patchify(const Tensor& images, int64_t patch_size);

}  // namespace qkv
