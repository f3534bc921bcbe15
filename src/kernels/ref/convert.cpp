// Reference dtype conversions and int8 quantization: the scalar functions of
// qkv/dtype.h (its dtype table for the conversions), one element after another.
#include <algorithm>
#include <vector>

#include "qkv/dtype.h"
#include "src/kernels/kernels.h"

namespace qkv::ref {

void convert_floats(DType from, const void* x, DType to, void* y, int64_t n) {
  std::vector<float> f((size_t)n);
  dtype_traits(from).to_float(x, f.data(), n);
  dtype_traits(to).from_float(f.data(), y, n);
}

void quantize_int8_rows(const float* x, int8_t* q, float* scales, int64_t rows, int64_t cols) {
  const int64_t blocks = (cols + kInt8Block - 1) / kInt8Block;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t p0 = b * kInt8Block, len = std::min(kInt8Block, cols - p0);
      scales[r * blocks + b] = int8_block_scale(x + r * cols + p0, len);
      int8_quantize(x + r * cols + p0, len, scales[r * blocks + b], q + r * cols + p0);
    }
}

}  // namespace qkv::ref
