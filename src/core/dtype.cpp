#include "qkv/dtype.h"

#include <cmath>
#include <cstring>

namespace qkv {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I64: return 8;
    case DType::I32: return 4;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
  }
  return "?";
}

bool parse_dtype(const std::string& name, DType* out) {
  static const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8};
  for (DType t : all) {
    if (name == dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

static uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    float v = std::ldexp((float)man, -24);
    return sign ? -v : v;
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (man << 13));  // inf / nan
  return float_of(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t float_to_half(float f) {
  uint32_t u = bits_of(f);
  uint16_t sign = (u >> 16) & 0x8000;
  uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u) return sign | 0x7c00 | (absu > 0x7f800000u ? 0x200 : 0);  // inf / nan
  if (absu >= 0x477ff000u) return sign | 0x7c00;  // rounds to beyond max half: inf
  if (absu < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    float a = float_of(absu);
    // subnormal unit is 2^-24; nearbyint rounds half to even in the default mode
    return sign | (uint16_t)std::nearbyint(a * 16777216.0f);
  }
  // normal: rebias exponent, round mantissa 23 -> 10 bits to nearest even
  uint32_t mant_round = absu + 0xfffu + ((absu >> 13) & 1u);
  return sign | (uint16_t)((mant_round - (112u << 23)) >> 13);
}

float bf16_to_float(uint16_t b) { return float_of((uint32_t)b << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet nan
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

}  // namespace qkv
