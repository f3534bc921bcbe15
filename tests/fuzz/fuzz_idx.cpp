// IDX image and label files, plain or gzipped. The input is split in two at
// its first byte's position (mod the size): the images file, then the labels.
#include "qkv/vision.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t cut = 1 + data[0] % size;
  const std::string images = qkv::fuzz::as_string(data + 1, cut - 1), labels = qkv::fuzz::as_string(data + cut, size - cut);
  const std::string ipath = qkv::fuzz::scratch_file("images", images), lpath = qkv::fuzz::scratch_file("labels", labels);
  qkv::fuzz::expect_clean([&] {
    qkv::ImageSet set = qkv::load_idx(ipath, lpath);
    if ((int64_t)set.labels.size() != set.count ||
        (int64_t)set.pixels.size() != set.count * set.channels * set.height * set.width)
      std::abort();
  });
  return 0;
}
