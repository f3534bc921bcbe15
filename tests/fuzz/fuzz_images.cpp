// PNG and JPEG bytes (src/data/image_codecs.cpp).
#include "src/data/image_codecs.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = qkv::fuzz::as_string(data, size);
  qkv::fuzz::expect_clean([&] {
    qkv::images::Rgb image = qkv::images::decode(bytes, "fuzz.img");
    if (image.width <= 0 || image.height <= 0 || image.width * image.height > qkv::images::kMaxPixels ||
        image.pixels.size() != (size_t)(image.width * image.height * 3))
      std::abort();
  });
  return 0;
}
