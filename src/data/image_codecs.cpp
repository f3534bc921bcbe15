// PNG through libpng's simplified API, JPEG through libjpeg-turbo.
//
// libjpeg reports errors by calling a function that must not return; here it
// longjmps back to the decoding function, which frees the decoder and throws.
// Nothing with a destructor is created between the setjmp and a libjpeg call,
// so the jump skips no C++ cleanup.
#include "src/data/image_codecs.h"

#include <png.h>
// jpeglib.h needs size_t and FILE declared first.
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <jpeglib.h>

#include "qkv/error.h"

namespace qkv::images {
namespace {

bool is_png(const std::string& b) { return b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0; }
bool is_jpeg(const std::string& b) { return b.size() >= 3 && std::memcmp(b.data(), "\xff\xd8\xff", 3) == 0; }

void check_size(int64_t width, int64_t height, const std::string& source) {
  QKV_CHECK(width > 0 && height > 0, source, ": the image is ", width, " x ", height, " pixels");
  QKV_CHECK(width <= kMaxPixels / height, source, ": the image is ", width, " x ", height, " pixels, more than qkv's limit of ",
            kMaxPixels, " (8192 x 8192)");
}

Rgb decode_png(const std::string& bytes, const std::string& source) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  QKV_CHECK(png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()), source, ": broken PNG (",
            image.message, ")");
  Rgb out;
  out.width = image.width, out.height = image.height;
  try {
    check_size(out.width, out.height, source);
    image.format = PNG_FORMAT_RGB;
    out.pixels.resize(PNG_IMAGE_SIZE(image));
  } catch (...) {
    png_image_free(&image);
    throw;
  }
  const png_color black{0, 0, 0};
  // png_image_finish_read frees the decoder, whether it succeeds or not.
  QKV_CHECK(png_image_finish_read(&image, &black, out.pixels.data(), 0, nullptr), source, ": broken PNG (", image.message,
            ")");
  return out;
}

struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_error(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

// Level -1 is a warning about corrupt data (libjpeg would carry on and fill in
// gray): an error here. Higher levels are trace messages.
void jpeg_message(j_common_ptr c, int level) {
  if (level < 0) jpeg_error(c);
}

// Called between scans: a progressive file of very many scans is refused.
void jpeg_progress(j_common_ptr c) {
  auto* d = reinterpret_cast<j_decompress_ptr>(c);
  if (c->is_decompressor && d->input_scan_number > kMaxJpegScans) {
    auto* e = reinterpret_cast<JpegErrors*>(c->err);
    std::snprintf(e->message, sizeof e->message, "more than %d scans", kMaxJpegScans);
    std::longjmp(e->jump, 1);
  }
}

Rgb decode_jpeg(const std::string& bytes, const std::string& source) {
  Rgb out;
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  jpeg_progress_mgr progress{};
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_error;
  errors.mgr.emit_message = jpeg_message;
  errors.message[0] = 0;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    fail(source, ": broken JPEG (", errors.message, ")");
  }
  jpeg_create_decompress(&cinfo);
  progress.progress_monitor = jpeg_progress;
  cinfo.progress = &progress;
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), (unsigned long)bytes.size());
  jpeg_read_header(&cinfo, TRUE);
  if (int64_t w = cinfo.image_width, h = cinfo.image_height; w <= 0 || h <= 0 || w > kMaxPixels / h) {
    jpeg_destroy_decompress(&cinfo);
    check_size(w, h, source);
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  if (cinfo.output_components != 3) {
    jpeg_destroy_decompress(&cinfo);
    fail(source, ": JPEG decoded to ", cinfo.output_components, " channels, not RGB");
  }
  out.width = cinfo.output_width, out.height = cinfo.output_height;
  // Sized before the scanlines are read; its size bounded by the check above.
  try {
    out.pixels.resize((size_t)(out.width * out.height * 3));
  } catch (...) {
    jpeg_destroy_decompress(&cinfo);
    throw;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.pixels.data() + (size_t)cinfo.output_scanline * (size_t)out.width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return out;
}

}  // namespace

Rgb decode(const std::string& bytes, const std::string& source) {
  if (is_png(bytes)) return decode_png(bytes, source);
  if (is_jpeg(bytes)) return decode_jpeg(bytes, source);
  fail(source, ": not a PNG or JPEG image (the file does not start with either's signature)");
}

std::string encode_png(const uint8_t* rgb, int64_t width, int64_t height) {
  check_size(width, height, "encode_png");
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = (png_uint_32)width, image.height = (png_uint_32)height;
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  QKV_CHECK(png_image_write_get_memory_size(image, size, 0, rgb, 0, nullptr), "encode_png: ", image.message);
  std::string out(size, '\0');
  QKV_CHECK(png_image_write_to_memory(&image, out.data(), &size, 0, rgb, 0, nullptr), "encode_png: ", image.message);
  out.resize(size);
  return out;
}

std::string encode_jpeg(const uint8_t* rgb, int64_t width, int64_t height, int quality) {
  check_size(width, height, "encode_jpeg");
  jpeg_compress_struct cinfo;
  JpegErrors errors;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_error;
  errors.message[0] = 0;
  if (setjmp(errors.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(buffer);
    fail("encode_jpeg: ", errors.message);
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = (JDIMENSION)width, cinfo.image_height = (JDIMENSION)height;
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(rgb) + (size_t)cinfo.next_scanline * (size_t)width * 3;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<const char*>(buffer), size);
  std::free(buffer);
  return out;
}

}  // namespace qkv::images
