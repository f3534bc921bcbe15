// PNG and JPEG decoding (src/data/image_codecs.cpp): pixels right, and every
// broken or oversized file an error before it can cost memory or time. Each
// bad file is made here from a good one.
#include <cstddef>  // jpeglib.h uses size_t and FILE without including them
#include <cstdio>
#include <jpeglib.h>
#include <zlib.h>

#include <cstring>

#include "qkv/vision.h"
#include "src/data/image_codecs.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::error_of;

std::vector<uint8_t> gradient(int64_t w, int64_t h) {
  std::vector<uint8_t> rgb((size_t)(w * h * 3));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int k = 0; k < 3; ++k) rgb[(size_t)((y * w + x) * 3 + k)] = (uint8_t)(x * 40 + y * 20 + k * 70);
  return rgb;
}

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t)(uint8_t)s[at] << 24 | (uint32_t)(uint8_t)s[at + 1] << 16 | (uint32_t)(uint8_t)s[at + 2] << 8 |
         (uint32_t)(uint8_t)s[at + 3];
}

void put_be32(std::string* s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*s)[at + i] = (char)(v >> (24 - 8 * i));
}

// The offset of a PNG chunk's length field.
size_t png_chunk(const std::string& png, const char* type) {
  for (size_t at = 8; at + 8 <= png.size(); at += 12 + be32(png, at))
    if (png.compare(at + 4, 4, type) == 0) return at;
  ADD_FAILURE() << "no " << type << " chunk";
  return 0;
}

void fix_png_crc(std::string* png, size_t chunk) {
  const uint32_t n = be32(*png, chunk);
  put_be32(png, chunk + 8 + n, (uint32_t)crc32(0, reinterpret_cast<const Bytef*>(png->data() + chunk + 4), n + 4));
}

// The offset of a JPEG marker (0xFF then `code`).
size_t jpeg_marker(const std::string& jpeg, uint8_t code) {
  for (size_t at = 0; at + 1 < jpeg.size(); ++at)
    if ((uint8_t)jpeg[at] == 0xff && (uint8_t)jpeg[at + 1] == code) return at;
  ADD_FAILURE() << "no marker 0xff" << std::hex << (int)code;
  return 0;
}

TEST(Images, PngRoundTripsExactly) {
  const std::vector<uint8_t> rgb = gradient(5, 3);
  const images::Rgb back = images::decode(images::encode_png(rgb.data(), 5, 3), "test.png");
  EXPECT_EQ(back.width, 5);
  EXPECT_EQ(back.height, 3);
  EXPECT_EQ(back.pixels, rgb);
}

TEST(Images, JpegDecodesCloseToTheOriginal) {
  std::vector<uint8_t> rgb(16 * 16 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = (uint8_t)(i % 3 == 0 ? 200 : i % 3 == 1 ? 100 : 50);
  const images::Rgb back = images::decode(images::encode_jpeg(rgb.data(), 16, 16, 95), "test.jpg");
  ASSERT_EQ(back.pixels.size(), rgb.size());
  for (size_t i = 0; i < rgb.size(); ++i) EXPECT_NEAR(back.pixels[i], rgb[i], 3) << i;
}

TEST(Images, ReadImageResizesAndConverts) {
  const std::string dir = testing::temp_dir("images");
  std::vector<uint8_t> rgb(4 * 4 * 3, 0);
  for (size_t i = 0; i < rgb.size(); i += 3) rgb[i] = 255;  // pure red
  write_file_atomic(dir + "/red.png", images::encode_png(rgb.data(), 4, 4));
  const std::vector<uint8_t> gray = read_image(dir + "/red.png", 1, 2);
  ASSERT_EQ(gray.size(), 4u);
  for (uint8_t g : gray) EXPECT_EQ(g, 76);  // 0.299 x 255
  const std::vector<uint8_t> color = read_image(dir + "/red.png", 3, 2);
  ASSERT_EQ(color.size(), 12u);
  EXPECT_EQ(color[0], 255);  // planes: red first
  EXPECT_EQ(color[4], 0);
}

TEST(Images, NotAnImageIsAnError) {
  EXPECT_NE(error_of([] { images::decode("{\"d_model\": 8}", "x.png"); }).find("not a PNG or JPEG"), std::string::npos);
  EXPECT_NE(error_of([] { images::decode("", "x.png"); }).find("not a PNG or JPEG"), std::string::npos);
}

TEST(Images, PngClaimingHugeDimensionsIsRefusedFromItsHeader) {
  const std::vector<uint8_t> rgb = gradient(4, 4);
  std::string png = images::encode_png(rgb.data(), 4, 4);
  const size_t ihdr = png_chunk(png, "IHDR");
  put_be32(&png, ihdr + 8, 30000);
  put_be32(&png, ihdr + 12, 20000);
  fix_png_crc(&png, ihdr);
  const std::string e = error_of([&] { images::decode(png, "big.png"); });
  EXPECT_NE(e.find("30000 x 20000 pixels, more than qkv's limit"), std::string::npos) << e;
}

TEST(Images, JpegClaimingHugeDimensionsIsRefusedFromItsHeader) {
  const std::vector<uint8_t> rgb = gradient(8, 8);
  std::string jpeg = images::encode_jpeg(rgb.data(), 8, 8, 90);
  const size_t sof = jpeg_marker(jpeg, 0xc0);
  // SOF0: marker, length (2), precision (1), height (2), width (2).
  jpeg[sof + 5] = (char)(20000 >> 8), jpeg[sof + 6] = (char)(20000 & 0xff);
  jpeg[sof + 7] = (char)(30000 >> 8), jpeg[sof + 8] = (char)(30000 & 0xff);
  const std::string e = error_of([&] { images::decode(jpeg, "big.jpg"); });
  EXPECT_NE(e.find("30000 x 20000 pixels, more than qkv's limit"), std::string::npos) << e;
}

TEST(Images, PngWithABadCrcIsAnError) {
  const std::vector<uint8_t> rgb = gradient(4, 4);
  std::string png = images::encode_png(rgb.data(), 4, 4);
  const size_t idat = png_chunk(png, "IDAT");
  png[idat + 8 + be32(png, idat) - 1] ^= 0x55;  // the last data byte, CRC left as it was
  const std::string e = error_of([&] { images::decode(png, "crc.png"); });
  EXPECT_NE(e.find("crc.png: broken PNG"), std::string::npos) << e;
}

TEST(Images, TruncatedFilesAreErrors) {
  const std::vector<uint8_t> rgb = gradient(16, 16);
  const std::string png = images::encode_png(rgb.data(), 16, 16), jpeg = images::encode_jpeg(rgb.data(), 16, 16, 90);
  EXPECT_NE(error_of([&] { images::decode(png.substr(0, png.size() / 2), "cut.png"); }).find("broken PNG"),
            std::string::npos);
  const std::string e = error_of([&] { images::decode(jpeg.substr(0, jpeg.size() / 2), "cut.jpg"); });
  EXPECT_NE(e.find("cut.jpg: broken JPEG"), std::string::npos) << e;
}

// stb_image (Debian's 2022 snapshot) wrote past its tables for this file: a
// Huffman table whose 16 counts sum to 272 symbols, more than the 256 a table holds.
TEST(Images, HuffmanTableOfMoreThan256SymbolsIsAnError) {
  std::string jpeg = "\xff\xd8";  // SOI
  const int counts[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 17, 255};
  const int symbols = 272, length = 2 + 1 + 16 + symbols;
  jpeg += "\xff\xc4";  // DHT
  jpeg += (char)(length >> 8), jpeg += (char)(length & 0xff);
  jpeg += '\0';  // DC table 0
  for (int c : counts) jpeg += (char)c;
  for (int i = 0; i < symbols; ++i) jpeg += (char)(i & 0xff);
  jpeg += "\xff\xd9";
  const std::string e = error_of([&] { images::decode(jpeg, "dht.jpg"); });
  EXPECT_NE(e.find("dht.jpg: broken JPEG"), std::string::npos) << e;
}

// A progressive JPEG of 1 + 1 + 2 x 3 x 63 = 380 scans: each AC coefficient of
// each component in its own scan, first at half precision, then refined.
std::string many_scan_jpeg() {
  const std::vector<uint8_t> rgb = gradient(8, 8);
  std::vector<jpeg_scan_info> scans;
  scans.push_back({3, {0, 1, 2, 0}, 0, 0, 0, 1});
  for (int c = 0; c < 3; ++c)
    for (int k = 1; k < 64; ++k) scans.push_back({1, {c, 0, 0, 0}, k, k, 0, 1});
  scans.push_back({3, {0, 1, 2, 0}, 0, 0, 1, 0});
  for (int c = 0; c < 3; ++c)
    for (int k = 1; k < 64; ++k) scans.push_back({1, {c, 0, 0, 0}, k, k, 1, 0});
  jpeg_compress_struct cinfo;
  jpeg_error_mgr errors;
  cinfo.err = jpeg_std_error(&errors);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = 8, cinfo.image_height = 8, cinfo.input_components = 3, cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  cinfo.scan_info = scans.data();
  cinfo.num_scans = (int)scans.size();
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(rgb.data()) + cinfo.next_scanline * 8 * 3;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<const char*>(buffer), size);
  free(buffer);
  return out;
}

TEST(Images, ProgressiveJpegOfTooManyScansIsRefused) {
  const std::string jpeg = many_scan_jpeg();
  const std::string e = error_of([&] { images::decode(jpeg, "scans.jpg"); });
  EXPECT_NE(e.find("scans.jpg: broken JPEG (more than 256 scans)"), std::string::npos) << e;
}

}  // namespace
}  // namespace qkv
