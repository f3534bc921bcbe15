// Element types: the conversions and the one table of per-type facts.
#include "qkv/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "qkv/error.h"

namespace qkv {

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

float int8_block_scale(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax / 127.0f;
}

void int8_quantize(const float* x, int64_t n, float scale, int8_t* q) {
  // A scale below the smallest normal float (every value under about 1e-37)
  // quantizes to zeros: its reciprocal would overflow. A NaN value is 0.
  const float inv = scale >= std::numeric_limits<float>::min() ? 1.0f / scale : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(x[i] * inv);
    q[i] = r == r ? (int8_t)std::clamp(r, -127.0f, 127.0f) : 0;
  }
}

namespace {

// float -> integer type T: truncation toward zero, saturating, NaN -> 0 (a
// plain cast is undefined behaviour outside T's range).
template <class T>
T saturate(double v) {
  if (!(v == v)) return 0;
  constexpr double lo = (double)std::numeric_limits<T>::min(), hi = (double)std::numeric_limits<T>::max();
  if (v <= lo) return std::numeric_limits<T>::min();
  if (v >= hi) return std::numeric_limits<T>::max();
  return (T)v;
}

// One row of the table for a type stored as T, with its conversions to and
// from float given as Load(T) -> float and Store(float) -> T.
template <class T, float (*Load)(T), T (*Store)(float)>
struct FloatRow {
  static void to_float(const void* src, float* dst, int64_t n) {
    const T* s = static_cast<const T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = Load(s[i]);
  }
  static void from_float(const float* src, void* dst, int64_t n) {
    T* d = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = Store(src[i]);
  }
  static void to_int64(const void* src, int64_t* dst, int64_t n) {
    const T* s = static_cast<const T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = saturate<int64_t>(Load(s[i]));
  }
  static void from_int64(const int64_t* src, void* dst, int64_t n) {
    T* d = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = Store((float)src[i]);
  }
};

template <class T>
struct IntRow {
  static void to_float(const void* src, float* dst, int64_t n) {
    const T* s = static_cast<const T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = (float)s[i];
  }
  static void from_float(const float* src, void* dst, int64_t n) {
    T* d = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = saturate<T>(src[i]);
  }
  static void to_int64(const void* src, int64_t* dst, int64_t n) {
    const T* s = static_cast<const T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = (int64_t)s[i];
  }
  static void from_int64(const int64_t* src, void* dst, int64_t n) {
    T* d = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = (T)(uint64_t)src[i];  // the low bits, as a cast does
  }
};

float f32_load(float v) { return v; }
float f32_store(float v) { return v; }

template <class Row>
constexpr DTypeTraits row(DType type, const char* name, size_t size, bool is_float) {
  return {type, name, size, is_float, &Row::to_float, &Row::from_float, &Row::to_int64, &Row::from_int64};
}

// In the enum's order.
const DTypeTraits kTraits[] = {
    row<FloatRow<float, f32_load, f32_store>>(DType::F32, "F32", 4, true),
    row<FloatRow<uint16_t, half_to_float, float_to_half>>(DType::F16, "F16", 2, true),
    row<FloatRow<uint16_t, bf16_to_float, float_to_bf16>>(DType::BF16, "BF16", 2, true),
    row<IntRow<int64_t>>(DType::I64, "I64", 8, false),
    row<IntRow<int32_t>>(DType::I32, "I32", 4, false),
    row<IntRow<int8_t>>(DType::I8, "I8", 1, false),
    row<IntRow<uint8_t>>(DType::U8, "U8", 1, false),
};

}  // namespace

const DTypeTraits& dtype_traits(DType t) {
  const size_t i = (size_t)t;
  QKV_CHECK(i < std::size(kTraits), "unknown dtype ", (int)i);
  return kTraits[i];
}

bool parse_dtype(const std::string& name, DType* out) {
  for (const DTypeTraits& t : kTraits) {
    if (name == t.name) {
      *out = t.type;
      return true;
    }
  }
  return false;
}

}  // namespace qkv
