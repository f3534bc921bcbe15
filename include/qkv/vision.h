// qkv/vision.h — images for the Vision Transformer: IDX files (the format of
// MNIST and Fashion-MNIST), PNG and JPEG files, batches and augmentation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/rng.h"
#include "qkv/tensor.h"

namespace qkv {

// Images of one size as bytes, N x C x H x W, with their labels.
struct ImageSet {
  int64_t count = 0, channels = 1, height = 0, width = 0;
  std::vector<uint8_t> pixels;   // count * channels * height * width
  std::vector<int64_t> labels;   // count
  const uint8_t* image(int64_t i) const { return pixels.data() + i * channels * height * width; }
};

// IDX files (LeCun et al.): a big-endian header (two zero bytes, the type
// 0x08 = unsigned byte, the number of dimensions, one uint32 per dimension),
// then the bytes. Images are 3-D (N, H, W), labels 1-D (N). Either file may be
// gzipped. A wrong magic number, a truncated file, a count mismatch between
// images and labels, or trailing bytes are errors naming the file.
ImageSet load_idx(const std::string& images_path, const std::string& labels_path);

// The IDX pair of a folder for `split` ("train" or "t10k"):
// SPLIT-images-idx3-ubyte[.gz] and SPLIT-labels-idx1-ubyte[.gz].
ImageSet load_idx_folder(const std::string& dir, const std::string& split);

// The resampling filters of Pillow's Image.resize, which Hugging Face's
// image processors call ("resample": 2 and 3).
enum class Resample { Bilinear, Bicubic };

// How a picture of any size becomes a model's square input, as Hugging
// Face's ViT and DeiT processors make it: resized to `resize` x `resize`
// (0: `size`) with `resample`, then its centre `size` x `size` cut out.
// The resize is Pillow's to the byte: each axis in turn (width first), every
// output pixel a weighted sum of the input pixels under the filter, the
// filter widened by the scale when shrinking (so every input pixel counts),
// weights in 22-bit fixed point, each pass rounded and clipped to a byte.
struct ImageResize {
  int64_t size = 0;
  int64_t resize = 0;
  Resample resample = Resample::Bilinear;
};

// A PNG or JPEG file as bytes C x size x size: converted to `channels` (1:
// luminance, 3: RGB) after it is resized and cropped as `how` says.
std::vector<uint8_t> read_image(const std::string& path, int64_t channels, const ImageResize& how);
// The same from the bytes of a PNG or JPEG file; `source` names it in errors.
std::vector<uint8_t> decode_image(const std::string& bytes, const std::string& source, int64_t channels,
                                  const ImageResize& how);
// With a plain bilinear resize to `size` x `size`.
std::vector<uint8_t> read_image(const std::string& path, int64_t channels, int64_t size);
std::vector<uint8_t> decode_image(const std::string& bytes, const std::string& source, int64_t channels,
                                  int64_t size);
// Pillow's resize (as ImageResize describes it) of an interleaved image of
// `bands` bytes per pixel, w x h, to out_w x out_h.
std::vector<uint8_t> resize_image(const std::vector<uint8_t>& pixels, int64_t w, int64_t h, int64_t bands,
                                  int64_t out_w, int64_t out_h, Resample resample);

// Pixels to model inputs: x = (p / 255 - 0.5) / 0.5, in [-1, 1].
float pixel_to_input(uint8_t p);

// Training-time augmentation for small images, seeded: a random crop of the
// image padded by `pad` pixels on each side (zeros), and a horizontal flip
// with probability 1/2.
struct Augment {
  int64_t pad = 0;
  bool flip = false;
};

// The images `indices` of `set` as F32 [B, C, H, W]; with `augment` and
// `rng`, each image is cropped and flipped on its own draw.
Tensor image_batch(const ImageSet& set, const std::vector<int64_t>& indices, const Augment& augment = {},
                   Rng* rng = nullptr);

// Writes images with heat maps beside them as one PNG, a row per image: the
// image (C x size x size bytes, scaled up by `scale`) on the left, on the
// right the image in gray under its heat map (heat_h x heat_w values,
// stretched to their own min..max and upsampled bilinearly) in red.
void write_heatmap_png(const std::string& path, const std::vector<std::vector<uint8_t>>& images, int64_t channels,
                       int64_t size, const std::vector<std::vector<float>>& heats, int64_t heat_h, int64_t heat_w,
                       int64_t scale = 8);

}  // namespace qkv
