// PNG and JPEG bytes to pixels and back, through libpng and libjpeg-turbo:
// maintained, fuzzed decoders, with qkv's own limits checked from the header
// before any pixel is decoded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qkv::images {

// The most pixels (width x height) an image may have: 8192 x 8192, a 192 MiB
// RGB buffer. A file's header is checked against it before decoding, so a
// small file that claims to be 30000 x 20000 is an error, not 1.8 GB.
inline constexpr int64_t kMaxPixels = int64_t{1} << 26;
// The most scans a progressive JPEG may have: a few hundred-byte file of
// thousands of tiny scans would otherwise take minutes to decode.
inline constexpr int kMaxJpegScans = 256;

struct Rgb {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // height x width x 3, row by row
};

// A PNG or a JPEG (told apart by their first bytes) as 8-bit RGB. Gray images
// are spread to three channels; transparency is composited onto black.
// `source` names the bytes in errors.
Rgb decode(const std::string& bytes, const std::string& source);

// An 8-bit RGB image (height x width x 3) as PNG bytes.
std::string encode_png(const uint8_t* rgb, int64_t width, int64_t height);

// An 8-bit RGB image as baseline JPEG bytes: for tests and fuzz seeds.
std::string encode_jpeg(const uint8_t* rgb, int64_t width, int64_t height, int quality);

}  // namespace qkv::images
