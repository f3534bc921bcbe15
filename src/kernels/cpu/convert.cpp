// Conversions between the float dtypes and blockwise int8 quantization: the
// loops that loading a model in another dtype, `qkv convert` and
// Tensor::to spend their time in. Each gives the scalar conversions' bits
// (qkv/dtype.h: float_to_bf16, float_to_half, half_to_float,
// int8_block_scale, int8_quantize), in vectors where the level has them,
// split between threads when large. (Element by element on one core,
// loading an 855M-parameter bfloat16 Llama with --dtype int8 took 6.1 s
// and with f16 8.1 s; 1.4 and 1.5 s now: docs/benchmarks.md.)
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "qkv/dtype.h"
#include "src/kernels/cpu/simd.h"
#include "src/kernels/cpu/vec_math.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {

namespace {

// Below this many elements a conversion runs on the calling thread.
constexpr int64_t kParallelElements = 1 << 16;

// Runs body(begin, end) over [0, n) in chunks, split between the threads
// when n is large.
template <class Body>
void in_chunks(int64_t n, Body&& body) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelElements && chunks > 1 && !omp_in_parallel())
  for (int64_t c = 0; c < chunks; ++c) body(c * kChunk, std::min(n, (c + 1) * kChunk));
}

#if defined(__AVX512F__)
// 16 float16 values widened exactly, as half_to_float widens them (F16C's
// conversion makes a signalling NaN quiet; half_to_float keeps its bits).
inline __m512 widen_halves(__m256i h) {
  const __m512 f = _mm512_maskz_cvtph_ps(kAll, h);
  const __m512i wide = _mm512_maskz_cvtepu16_epi32(kAll, h);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(wide, _mm512_set1_epi32(0x7fff)), _mm512_set1_epi32(0x7c00));
  const __m512i sign = _mm512_maskz_slli_epi32(kAll, _mm512_and_si512(wide, _mm512_set1_epi32(0x8000)), 16);
  const __m512i man = _mm512_maskz_slli_epi32(kAll, _mm512_and_si512(wide, _mm512_set1_epi32(0x3ff)), 13);
  const __m512i bits = _mm512_or_si512(_mm512_or_si512(sign, man), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_blend_ps(nan, f, _mm512_castsi512_ps(bits));
}
// 16 floats rounded to float16 (to nearest, ties to even, subnormals kept;
// past the range infinity), as float_to_half rounds them: a NaN becomes
// sign | 0x7e00 (F16C would keep part of its payload).
inline __m256i narrow_to_halves(__m512 f) {
  const __m256i h = _mm512_maskz_cvtps_ph(kAll, f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  const __m256i sign =
      _mm256_and_si256(_mm512_maskz_cvtepi32_epi16(kAll, _mm512_maskz_srli_epi32(kAll, _mm512_castps_si512(f), 16)),
                       _mm256_set1_epi16((short)0x8000));
  return _mm256_mask_blend_epi16(nan, h, _mm256_or_si256(sign, _mm256_set1_epi16(0x7e00)));
}
inline __m512 widen_bf16(__m256i b) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, b), 16));
}
inline __m512 load16(DType from, const void* x, int64_t i) {
  if (from == DType::F32) return _mm512_loadu_ps(static_cast<const float*>(x) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(x) + i));
  return from == DType::F16 ? widen_halves(h) : widen_bf16(h);
}
inline void store16(DType to, __m512 v, void* y, int64_t i) {
  if (to == DType::F32) return _mm512_storeu_ps(static_cast<float*>(y) + i, v);
  const __m256i h = to == DType::F16 ? narrow_to_halves(v) : bf16_of(v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(y) + i), h);
}
#elif defined(__AVX2__)
// The same on the avx2 level (x86-64-v3 has F16C), 8 values at a time: see
// widen_halves and narrow_to_halves above.
inline __m256 widen_halves(__m128i h) {
  const __m256 f = _mm256_cvtph_ps(h);
  const __m256i wide = _mm256_cvtepu16_epi32(h);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x7fff)), _mm256_set1_epi32(0x7c00));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x8000)), 16);
  const __m256i man = _mm256_slli_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x3ff)), 13);
  const __m256i bits = _mm256_or_si256(_mm256_or_si256(sign, man), _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_ps(f, _mm256_castsi256_ps(bits), _mm256_castsi256_ps(nan));
}
inline __m128i narrow_to_halves(__m256 f) {
  const __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  const __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
  const __m256i top = _mm256_srli_epi32(_mm256_castps_si256(f), 16);  // each value's sign in bit 15
  const __m128i sign = _mm_and_si128(_mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1)),
                                     _mm_set1_epi16((short)0x8000));
  return _mm_blendv_epi8(h, _mm_or_si128(sign, _mm_set1_epi16(0x7e00)), nan);
}
inline __m256 widen_bf16(__m128i b) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16)); }
// 8 floats rounded to bfloat16 (round_to_bf16's integer operations).
inline __m128i bf16_of(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
  const __m256i top = _mm256_srli_epi32(r, 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
}
inline __m256 load8(DType from, const void* x, int64_t i) {
  if (from == DType::F32) return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
  return from == DType::F16 ? widen_halves(h) : widen_bf16(h);
}
inline void store8(DType to, __m256 v, void* y, int64_t i) {
  if (to == DType::F32) return _mm256_storeu_ps(static_cast<float*>(y) + i, v);
  const __m128i h = to == DType::F16 ? narrow_to_halves(v) : bf16_of(v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(y) + i), h);
}
#endif

// [i, end) one value at a time through float, by the dtype table's own
// scalar conversions (the reference's, and Tensor::to's for the other dtypes).
void convert_scalar(DType from, const void* x, DType to, void* y, int64_t i, int64_t end) {
  const DTypeTraits &a = dtype_traits(from), &b = dtype_traits(to);
  float staged[256];
  for (; i < end; i += 256) {
    const int64_t n = std::min<int64_t>(256, end - i);
    a.to_float(static_cast<const char*>(x) + i * a.size, staged, n);
    b.from_float(staged, static_cast<char*>(y) + i * b.size, n);
  }
}

// [begin, end): whole vectors, then the tail (all of it on the generic level, but bfloat16) one value at a time.
void convert_range(DType from, const void* x, DType to, void* y, int64_t begin, int64_t end) {
  int64_t i = begin;
#if defined(__AVX512F__)
  for (; i + 16 <= end; i += 16) store16(to, load16(from, x, i), y, i);
#elif defined(__AVX2__)
  for (; i + 8 <= end; i += 8) store8(to, load8(from, x, i), y, i);
#else
  if (from == DType::F32 && to == DType::BF16) {  // round_to_bf16's integer operations, which the compiler vectorizes
    const float* s = static_cast<const float*>(x);
    uint16_t* d = static_cast<uint16_t*>(y);
    for (; i < end; ++i) d[i] = (uint16_t)(std::bit_cast<uint32_t>(round_to_bf16(s[i])) >> 16);
  }
#endif
  convert_scalar(from, x, to, y, i, end);
}

}  // namespace

void convert_floats(DType from, const void* x, DType to, void* y, int64_t n) {
  in_chunks(n, [&](int64_t begin, int64_t end) { convert_range(from, x, to, y, begin, end); });
}

void quantize_int8_rows(const float* x, int8_t* q, float* scales, int64_t rows, int64_t cols) {
  const int64_t blocks = (cols + kInt8Block - 1) / kInt8Block;
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements && rows > 1 && !omp_in_parallel())
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t p0 = b * kInt8Block, len = std::min(kInt8Block, cols - p0);
      const float* v = x + r * cols + p0;
      int8_t* out = q + r * cols + p0;
      float& scale = scales[r * blocks + b];
#if defined(__AVX512F__)
      if (len == 32) {  // kInt8Block: two vectors
        const __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
        // |x|, the running maximum second: a NaN is passed over, as int8_block_scale passes it
        const __m512 abs_max = _mm512_maskz_max_ps(kAll, _mm512_abs_ps(hi),
                                                   _mm512_maskz_max_ps(kAll, _mm512_abs_ps(lo), _mm512_setzero_ps()));
        scale = _mm512_cvtss_f32(max_lanes(abs_max)) / 127.0f;
        const float inv = scale >= std::numeric_limits<float>::min() ? 1.0f / scale : 0.0f;
        for (int half = 0; half < 2; ++half) {
          const __m512 s = _mm512_mul_ps(half ? hi : lo, _mm512_set1_ps(inv));
          __m512 t = _mm512_maskz_roundscale_ps(kAll, s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          t = _mm512_maskz_min_ps(kAll, _mm512_maskz_max_ps(kAll, t, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
          const __mmask16 number = _mm512_cmp_ps_mask(s, s, _CMP_ORD_Q);  // a NaN quantizes to 0
          const __m512i i32 = _mm512_maskz_cvtps_epi32(number, t);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * half), _mm512_maskz_cvtepi32_epi8(kAll, i32));
        }
        continue;
      }
#elif defined(__AVX2__)
      if (len == 32) {  // four vectors of 8, as above
        __m256 x4[4];
        __m256 amax = _mm256_setzero_ps();
        for (int p = 0; p < 4; ++p) {
          x4[p] = _mm256_loadu_ps(v + 8 * p);
          amax = _mm256_max_ps(_mm256_and_ps(x4[p], _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))), amax);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        scale = _mm_cvtss_f32(h) / 127.0f;
        const float inv = scale >= std::numeric_limits<float>::min() ? 1.0f / scale : 0.0f;
        __m256i i32[4];
        for (int p = 0; p < 4; ++p) {
          const __m256 s = _mm256_mul_ps(x4[p], _mm256_set1_ps(inv));
          __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
          t = _mm256_and_ps(t, _mm256_cmp_ps(s, s, _CMP_ORD_Q));  // a NaN quantizes to 0
          i32[p] = _mm256_cvtps_epi32(t);
        }
        // The packs interleave the 128-bit lanes: 4-byte groups a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7.
        const __m256i bytes =
            _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        continue;
      }
#endif
      scale = int8_block_scale(v, len);
      int8_quantize(v, len, scale, out);
    }
}

}  // namespace qkv::cpu::QKV_CPU_NS
