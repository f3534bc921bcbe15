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

namespace {

// The luminance of an RGB pixel (ITU-R BT.601 weights).
inline float luminance(float r, float g, float b) { return 0.299f * r + 0.587f * g + 0.114f * b; }

// Pillow's filters (libImaging/Resample.c): the triangle of bilinear and
// Keys' cubic with a = -0.5 of bicubic, over their supports of 1 and 2.
double filter_at(Resample r, double x) {
  x = std::fabs(x);
  if (r == Resample::Bilinear) return x < 1.0 ? 1.0 - x : 0.0;
  constexpr double a = -0.5;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's fixed point for 8-bit images

// The weights of one axis resized from `in` to `out` pixels: for output i,
// count[i] input pixels from first[i], their weights (summing to 1) in fixed
// point at weights[i * width ...].
struct Taps {
  int64_t width = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;
};

Taps taps_for(int64_t in, int64_t out, Resample r) {
  const double scale = (double)in / (double)out;
  const double stretch = std::max(scale, 1.0);  // shrinking widens the filter: every input pixel counts
  const double support = (r == Resample::Bilinear ? 1.0 : 2.0) * stretch;
  Taps t;
  t.width = (int64_t)std::ceil(support) * 2 + 1;
  t.first.resize((size_t)out);
  t.count.resize((size_t)out);
  t.weights.assign((size_t)(out * t.width), 0);
  std::vector<double> k((size_t)t.width);
  for (int64_t o = 0; o < out; ++o) {
    const double center = ((double)o + 0.5) * scale;
    const int64_t lo = std::max<int64_t>((int64_t)(center - support + 0.5), 0);
    const int64_t n = std::min<int64_t>((int64_t)(center + support + 0.5), in) - lo;
    QKV_CHECK(n >= 0 && n <= t.width, "resize_image: ", n, " taps for a filter of ", t.width);
    double sum = 0;
    for (int64_t x = 0; x < n; ++x) sum += k[(size_t)x] = filter_at(r, ((double)(x + lo) - center + 0.5) / stretch);
    for (int64_t x = 0; x < n; ++x) {
      const double w = (sum != 0.0 ? k[(size_t)x] / sum : k[(size_t)x]) * (double)(1 << kPrecisionBits);
      t.weights[(size_t)(o * t.width + x)] = (int32_t)(w < 0 ? w - 0.5 : w + 0.5);
    }
    t.first[(size_t)o] = lo;
    t.count[(size_t)o] = n;
  }
  return t;
}

// A weighted sum in fixed point, rounded and clipped to a byte.
uint8_t to_byte(int64_t sum) {
  return (uint8_t)std::clamp<int64_t>(sum >> kPrecisionBits, 0, 255);
}

}  // namespace

std::vector<uint8_t> resize_image(const std::vector<uint8_t>& pixels, int64_t w, int64_t h, int64_t bands,
                                  int64_t out_w, int64_t out_h, Resample resample) {
  QKV_CHECK(w > 0 && h > 0 && out_w > 0 && out_h > 0 && bands > 0 && (int64_t)pixels.size() == w * h * bands,
            "resize_image: ", w, "x", h, "x", bands, " bytes expected, got ", pixels.size());
  std::vector<uint8_t> wide = pixels;
  if (out_w != w) {  // along each row
    const Taps t = taps_for(w, out_w, resample);
    wide.assign((size_t)(out_w * h * bands), 0);
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < out_w; ++x)
        for (int64_t c = 0; c < bands; ++c) {
          int64_t sum = 1 << (kPrecisionBits - 1);
          const int32_t* k = &t.weights[(size_t)(x * t.width)];
          const uint8_t* in = &pixels[(size_t)((y * w + t.first[(size_t)x]) * bands + c)];
          for (int64_t i = 0; i < t.count[(size_t)x]; ++i) sum += (int64_t)in[i * bands] * k[i];
          wide[(size_t)((y * out_w + x) * bands + c)] = to_byte(sum);
        }
  }
  if (out_h == h) return wide;
  const Taps t = taps_for(h, out_h, resample);  // along each column
  std::vector<uint8_t> out((size_t)(out_w * out_h * bands));
  for (int64_t y = 0; y < out_h; ++y)
    for (int64_t x = 0; x < out_w; ++x)
      for (int64_t c = 0; c < bands; ++c) {
        int64_t sum = 1 << (kPrecisionBits - 1);
        const int32_t* k = &t.weights[(size_t)(y * t.width)];
        const uint8_t* in = &wide[(size_t)((t.first[(size_t)y] * out_w + x) * bands + c)];
        for (int64_t i = 0; i < t.count[(size_t)y]; ++i) sum += (int64_t)in[i * out_w * bands] * k[i];
        out[(size_t)((y * out_w + x) * bands + c)] = to_byte(sum);
      }
  return out;
}

std::vector<uint8_t> read_image(const std::string& path, int64_t channels, const ImageResize& how) {
  return decode_image(read_file(path), path, channels, how);
}

std::vector<uint8_t> read_image(const std::string& path, int64_t channels, int64_t size) {
  return read_image(path, channels, ImageResize{.size = size});
}

std::vector<uint8_t> decode_image(const std::string& bytes, const std::string& source, int64_t channels,
                                  int64_t size) {
  return decode_image(bytes, source, channels, ImageResize{.size = size});
}

std::vector<uint8_t> decode_image(const std::string& bytes, const std::string& source, int64_t channels,
                                  const ImageResize& how) {
  QKV_CHECK(channels == 1 || channels == 3, "read_image: channels must be 1 or 3, not ", channels);
  const int64_t size = how.size, resize = how.resize > 0 ? how.resize : how.size;
  QKV_CHECK(size > 0 && resize >= size, "read_image: a crop of ", size, " from a resize to ", resize);
  const images::Rgb image = images::decode(bytes, source);
  const std::vector<uint8_t> rgb =
      resize_image(image.pixels, (int64_t)image.width, (int64_t)image.height, 3, resize, resize, how.resample);
  const int64_t off = (resize - size) / 2;  // the centre crop, as transformers' center_crop places it
  std::vector<uint8_t> out((size_t)(channels * size * size));
  for (int64_t y = 0; y < size; ++y)
    for (int64_t x = 0; x < size; ++x) {
      const uint8_t* c = &rgb[(size_t)(((y + off) * resize + x + off) * 3)];
      if (channels == 1) {
        out[(size_t)(y * size + x)] = (uint8_t)std::clamp(std::lround(luminance(c[0], c[1], c[2])), 0L, 255L);
      } else {
        for (int64_t k = 0; k < 3; ++k) out[(size_t)((k * size + y) * size + x)] = c[k];
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
        float gray = luminance(px[0], px[1], px[2]);
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
