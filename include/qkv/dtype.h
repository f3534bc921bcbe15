// qkv/dtype.h — element types and what code needs to know about each.
//
// Compute ops work on F32 today; the other types exist so that checkpoints of
// any precision load, and so that bf16/int8 inference kernels can follow
// without changing the Tensor layout. Everything type-specific -- its size,
// its name, how its values convert to and from float -- lives in one table
// row per type (dtype_traits), so a new type is one row, not a switch in
// every file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qkv {

enum class DType : uint8_t { F32, F16, BF16, I64, I32, I8, U8 };

struct DTypeTraits {
  DType type;
  const char* name;  // the safetensors spelling: "F32", "F16", "BF16", "I64", "I32", "I8", "U8"
  size_t size;       // bytes per element
  bool is_float;
  // n contiguous elements of this type to float (integers: exactly up to 2^24)
  // and back (floats round to nearest even; integers truncate toward zero and
  // saturate at the type's range, NaN becoming 0).
  void (*to_float)(const void* src, float* dst, int64_t n);
  void (*from_float)(const float* src, void* dst, int64_t n);
  // The same through int64, exact between the integer types (narrowing keeps
  // the low bits, as a C++ cast does); floats truncate toward zero, saturating.
  void (*to_int64)(const void* src, int64_t* dst, int64_t n);
  void (*from_int64)(const int64_t* src, void* dst, int64_t n);
};

const DTypeTraits& dtype_traits(DType t);
inline size_t dtype_size(DType t) { return dtype_traits(t).size; }
inline const char* dtype_name(DType t) { return dtype_traits(t).name; }
// Returns false when `name` is not one of the spellings above.
bool parse_dtype(const std::string& name, DType* out);

// IEEE half and bfloat16 conversions (round to nearest even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);

// Blockwise int8 (docs/low-precision.md): a run of up to 32 floats becomes
// int8 values q and one float32 scale d = max|x| / 127, with x ~= q * d and
// q = round(x / d) (to nearest, ties to even; computed as x * (1 / d) in
// float32, so every path gets the same q), which lies in [-127, 127]. The
// error is at most d / 2 per element, 1/254 of the block's largest magnitude.
// An all-zero block has d = 0 and q = 0.
float int8_block_scale(const float* x, int64_t n);
void int8_quantize(const float* x, int64_t n, float scale, int8_t* q);

}  // namespace qkv
