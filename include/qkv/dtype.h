// qkv/dtype.h — element types.
//
// Compute ops work on F32 today; the other types exist so that checkpoints of
// any precision load, and so that bf16/int8 inference kernels can follow
// without changing the Tensor layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qkv {

enum class DType : uint8_t { F32, F16, BF16, I64, I32, U8 };

size_t dtype_size(DType t);
// The safetensors spelling: "F32", "F16", "BF16", "I64", "I32", "U8".
const char* dtype_name(DType t);
// Returns false when `name` is not one of the spellings above.
bool parse_dtype(const std::string& name, DType* out);

// IEEE half and bfloat16 conversions (round to nearest even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);

}  // namespace qkv
