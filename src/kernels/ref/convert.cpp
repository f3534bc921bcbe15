// Reference dtype conversions and int8 quantization: the scalar functions of
// qkv/dtype.h, one element after another.
#include <algorithm>

#include "qkv/dtype.h"
#include "src/kernels/kernels.h"

namespace qkv::ref {

void convert_floats(DType from, const void* x, DType to, void* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v;
    if (from == DType::F32)
      v = static_cast<const float*>(x)[i];
    else if (from == DType::F16)
      v = half_to_float(static_cast<const uint16_t*>(x)[i]);
    else
      v = bf16_to_float(static_cast<const uint16_t*>(x)[i]);
    if (to == DType::F32)
      static_cast<float*>(y)[i] = v;
    else
      static_cast<uint16_t*>(y)[i] = to == DType::F16 ? float_to_half(v) : float_to_bf16(v);
  }
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
