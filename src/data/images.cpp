// IDX and PNG/JPEG images, batches, augmentation, heat-map pictures.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/vision.h"
#include "src/data/image_codecs.h"

namespace qkv {
namespace {

// A file's bytes in order, gunzipped on the fly when it starts with gzip's
// magic number: an IDX header is read and checked before the data behind it
// is inflated.
class ByteStream {
 public:
  explicit ByteStream(const std::string& path) : path_(path) {
    refuse_devices_and_folders(path);
    file_ = std::fopen(path.c_str(), "rb");
    QKV_CHECK(file_, path, ": cannot open: ", std::strerror(errno));
    have_ = std::fread(in_, 1, sizeof in_, file_);
    gzip_ = have_ >= 2 && (uint8_t)in_[0] == 0x1f && (uint8_t)in_[1] == 0x8b;
    if (gzip_ && inflateInit2(&z_, 16 + 15) != Z_OK) {
      std::fclose(file_);
      fail(path, ": cannot start gunzip");
    }
    z_.next_in = reinterpret_cast<Bytef*>(in_);
    z_.avail_in = (uInt)have_;
  }
  ~ByteStream() {
    if (gzip_) inflateEnd(&z_);
    std::fclose(file_);
  }
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  // Up to n bytes into `out`; fewer only at the end of the data.
  size_t read(char* out, size_t n) {
    if (!gzip_) {
      const size_t first = std::min(n, have_ - used_);
      std::memcpy(out, in_ + used_, first);
      used_ += first;
      return first + (first < n ? std::fread(out + first, 1, n - first, file_) : 0);
    }
    z_.next_out = reinterpret_cast<Bytef*>(out);
    z_.avail_out = (uInt)n;
    while (z_.avail_out > 0 && !ended_) {
      if (z_.avail_in == 0) {
        z_.next_in = reinterpret_cast<Bytef*>(in_);
        z_.avail_in = (uInt)std::fread(in_, 1, sizeof in_, file_);
        QKV_CHECK(z_.avail_in > 0, path_, ": truncated gzip data");
      }
      const int rc = inflate(&z_, Z_NO_FLUSH);
      QKV_CHECK(rc == Z_OK || rc == Z_STREAM_END, path_, ": broken gzip data (", z_.msg ? z_.msg : "truncated", ")");
      if (rc == Z_STREAM_END) {
        ended_ = true;
        QKV_CHECK(z_.avail_in == 0 && std::fread(in_, 1, 1, file_) == 0, path_,
                  ": bytes after the end of the gzip data");
      }
    }
    return n - z_.avail_out;
  }

 private:
  std::string path_;
  FILE* file_ = nullptr;
  bool gzip_ = false, ended_ = false;
  z_stream z_{};
  char in_[1 << 16];
  size_t have_ = 0, used_ = 0;
};

uint32_t big_endian_u32(const unsigned char* b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

// An IDX file of unsigned bytes with `want_dims` dimensions: its shape, then
// its data in `data`. The header is checked first (an image above the pixel
// limit is refused there); the data is read as it arrives, so a header that
// promises more than the file holds costs no more memory than the file.
std::vector<int64_t> read_idx(const std::string& path, int want_dims, std::vector<uint8_t>* data) {
  ByteStream in(path);
  unsigned char magic[4];
  const size_t got = in.read(reinterpret_cast<char*>(magic), 4);
  QKV_CHECK(got == 4, path, ": too short for an IDX header (", got, " bytes)");
  QKV_CHECK(magic[0] == 0 && magic[1] == 0, path, ": not an IDX file (bad magic number)");
  QKV_CHECK(magic[2] == 0x08, path, ": IDX data type 0x", std::hex, (int)magic[2], std::dec,
            " is not unsigned bytes (0x08)");
  const int dims = magic[3];
  QKV_CHECK(dims == want_dims, path, ": expected an IDX file of ", want_dims, " dimensions (magic 0x0000080", want_dims,
            "), found ", dims);
  unsigned char header[4 * 255];
  QKV_CHECK(in.read(reinterpret_cast<char*>(header), 4 * (size_t)dims) == 4 * (size_t)dims, path,
            ": truncated IDX header");
  std::vector<int64_t> shape;
  for (int d = 0; d < dims; ++d) shape.push_back(big_endian_u32(header + 4 * d));
  int64_t item = 1;  // bytes per image (or per label)
  for (int d = 1; d < dims; ++d) {
    QKV_CHECK(shape[d] == 0 || item <= images::kMaxPixels / shape[d], path, ": images of ", shape[1], " x ", shape[2],
              " pixels, more than qkv's limit of ", images::kMaxPixels);
    item *= shape[d];
  }
  const int64_t expected = shape[0] * item;  // below 2^32 x 2^26
  data->clear();
  for (int64_t done = 0; done < expected;) {
    const size_t chunk = (size_t)std::min<int64_t>(expected - done, int64_t{1} << 24);
    data->resize((size_t)done + chunk);
    const size_t n = in.read(reinterpret_cast<char*>(data->data()) + done, chunk);
    done += (int64_t)n;
    QKV_CHECK(n == chunk, path, ": truncated: the header promises ", expected, " bytes of data, the file has ", done);
  }
  size_t extra = 0;
  for (char rest[4096]; size_t n = in.read(rest, sizeof rest);) extra += n;
  QKV_CHECK(extra == 0, path, ": ", extra, " bytes after the data");
  return shape;
}

}  // namespace

ImageSet load_idx(const std::string& images_path, const std::string& labels_path) {
  ImageSet set;
  std::vector<uint8_t> labels;
  const std::vector<int64_t> ishape = read_idx(images_path, 3, &set.pixels);
  const std::vector<int64_t> lshape = read_idx(labels_path, 1, &labels);
  QKV_CHECK(ishape[0] == lshape[0], images_path, " has ", ishape[0], " images but ", labels_path, " has ", lshape[0],
            " labels");
  QKV_CHECK(ishape[0] > 0 && ishape[1] > 0 && ishape[2] > 0, images_path, ": no images");
  set.count = ishape[0], set.channels = 1, set.height = ishape[1], set.width = ishape[2];
  set.labels.assign(labels.begin(), labels.end());
  return set;
}

ImageSet load_idx_folder(const std::string& dir, const std::string& split) {
  QKV_CHECK(std::filesystem::is_directory(dir), dir, " is not a folder");
  auto find = [&](const std::string& stem) {
    for (const char* ext : {"", ".gz"})
      if (std::filesystem::exists(dir + "/" + stem + ext)) return dir + "/" + stem + ext;
    fail(dir, ": no ", stem, " or ", stem, ".gz");
  };
  return load_idx(find(split + "-images-idx3-ubyte"), find(split + "-labels-idx1-ubyte"));
}

std::vector<uint8_t> read_image(const std::string& path, int64_t channels, int64_t size) {
  return decode_image(read_file(path), path, channels, size);
}

std::vector<uint8_t> decode_image(const std::string& bytes, const std::string& source, int64_t channels,
                                  int64_t size) {
  QKV_CHECK(channels == 1 || channels == 3, "read_image: channels must be 1 or 3, not ", channels);
  const images::Rgb image = images::decode(bytes, source);
  const int w = (int)image.width, h = (int)image.height;
  const std::vector<uint8_t>& rgb = image.pixels;
  // Bilinear resize to size x size, pixel centres aligned, then to the channels.
  std::vector<uint8_t> out((size_t)(channels * size * size));
  for (int64_t y = 0; y < size; ++y) {
    float sy = std::clamp((y + 0.5f) * h / size - 0.5f, 0.0f, (float)(h - 1));
    int y0 = (int)sy, y1 = std::min(y0 + 1, h - 1);
    float fy = sy - y0;
    for (int64_t x = 0; x < size; ++x) {
      float sx = std::clamp((x + 0.5f) * w / size - 0.5f, 0.0f, (float)(w - 1));
      int x0 = (int)sx, x1 = std::min(x0 + 1, w - 1);
      float fx = sx - x0;
      float c[3];
      for (int k = 0; k < 3; ++k) {
        auto at = [&](int yy, int xx) { return rgb[((size_t)yy * w + xx) * 3 + k]; };
        c[k] = (1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x1)) + fy * ((1 - fx) * at(y1, x0) + fx * at(y1, x1));
      }
      auto byte = [](float v) { return (uint8_t)std::clamp(std::lround(v), 0L, 255L); };
      if (channels == 1) {
        out[y * size + x] = byte(0.299f * c[0] + 0.587f * c[1] + 0.114f * c[2]);
      } else {
        for (int k = 0; k < 3; ++k) out[(k * size + y) * size + x] = byte(c[k]);
      }
    }
  }
  return out;
}

float pixel_to_input(uint8_t p) { return (p / 255.0f - 0.5f) / 0.5f; }

Tensor image_batch(const ImageSet& set, const std::vector<int64_t>& indices, const Augment& augment, Rng* rng) {
  const int64_t B = (int64_t)indices.size(), C = set.channels, H = set.height, W = set.width;
  Tensor out = Tensor::empty({B, C, H, W});
  float* o = out.data<float>();
  const float zero = pixel_to_input(0);
  for (int64_t b = 0; b < B; ++b) {
    QKV_CHECK(indices[b] >= 0 && indices[b] < set.count, "image_batch: index ", indices[b], " outside [0, ",
              set.count, ")");
    const uint8_t* img = set.image(indices[b]);
    int64_t dy = 0, dx = 0;
    bool flip = false;
    if (rng && augment.pad > 0) {
      dy = (int64_t)rng->next_below(2 * augment.pad + 1) - augment.pad;
      dx = (int64_t)rng->next_below(2 * augment.pad + 1) - augment.pad;
    }
    if (rng && augment.flip) flip = rng->next_below(2) == 1;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x) {
          const int64_t sy = y + dy, sx = (flip ? W - 1 - x : x) + dx;
          o[((b * C + c) * H + y) * W + x] =
              sy < 0 || sy >= H || sx < 0 || sx >= W ? zero : pixel_to_input(img[(c * H + sy) * W + sx]);
        }
  }
  return out;
}

void write_heatmap_png(const std::string& path, const std::vector<std::vector<uint8_t>>& images, int64_t channels,
                       int64_t size, const std::vector<std::vector<float>>& heats, int64_t heat_h, int64_t heat_w,
                       int64_t scale) {
  QKV_CHECK(!images.empty() && images.size() == heats.size(), "write_heatmap_png: ", images.size(), " images and ",
            heats.size(), " heat maps");
  const int64_t S = size * scale, gap = scale, W = 2 * S + 3 * gap, rows = (int64_t)images.size();
  const int64_t H = rows * (S + gap) + gap;
  std::vector<uint8_t> rgb((size_t)(W * H * 3), 255);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<uint8_t>& image = images[r];
    const std::vector<float>& heat = heats[r];
    QKV_CHECK((int64_t)image.size() == channels * size * size && (int64_t)heat.size() == heat_h * heat_w,
              "write_heatmap_png: image ", r, " or its heat map has the wrong size");
    // The map's own range: rollout is close to uniform, so its min..max carries the picture.
    const float lo = *std::min_element(heat.begin(), heat.end());
    const float span = std::max(*std::max_element(heat.begin(), heat.end()) - lo, 1e-12f);
    const int64_t top = gap + r * (S + gap);
    for (int64_t y = 0; y < S; ++y)
      for (int64_t x = 0; x < S; ++x) {
        const int64_t iy = y / scale, ix = x / scale;
        float px[3];
        for (int k = 0; k < 3; ++k) px[k] = image[((channels == 3 ? k : 0) * size + iy) * size + ix];
        float hy = std::clamp((y + 0.5f) * heat_h / S - 0.5f, 0.0f, (float)(heat_h - 1));
        float hx = std::clamp((x + 0.5f) * heat_w / S - 0.5f, 0.0f, (float)(heat_w - 1));
        int y0 = (int)hy, x0 = (int)hx;
        int y1 = std::min<int>(y0 + 1, (int)heat_h - 1), x1 = std::min<int>(x0 + 1, (int)heat_w - 1);
        float fy = hy - y0, fx = hx - x0;
        auto at = [&](int a, int b) { return (heat[a * heat_w + b] - lo) / span; };
        float h = (1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x1)) + fy * ((1 - fx) * at(y1, x0) + fx * at(y1, x1));
        float gray = 0.299f * px[0] + 0.587f * px[1] + 0.114f * px[2];
        const float red[3] = {255, 30, 10};
        uint8_t* left = &rgb[((top + y) * W + gap + x) * 3];
        uint8_t* right = &rgb[((top + y) * W + 2 * gap + S + x) * 3];
        for (int k = 0; k < 3; ++k) {
          left[k] = (uint8_t)px[k];
          right[k] = (uint8_t)std::clamp(0.5f * gray * (1 - h) + h * red[k], 0.0f, 255.0f);
        }
      }
  }
  const std::string bytes = images::encode_png(rgb.data(), W, H);
  write_file_atomic(path, bytes);
}

}  // namespace qkv
