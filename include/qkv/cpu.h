// qkv/cpu.h — which CPU this is, and which kernels run on it.
//
// qkv's fast kernels are compiled once per instruction-set level and one is
// chosen at start-up from what CPUID and the operating system say the CPU can
// run, never from a table of CPU models:
//
//   generic  x86-64 baseline (SSE2): runs anywhere
//   avx2     x86-64-v3: AVX2, FMA, F16C, BMI1/2
//   avx512   x86-64-v4: AVX-512 F, BW, CD, DQ, VL (with the ZMM state enabled by the OS)
//
// The environment variable QKV_ISA=generic|avx2|avx512 forces a level at or
// below the best one the CPU supports (the tests run the kernel table under
// each); a level above it is refused with an error. The GEMM runs on
// OpenBLAS, whose kernel ("core") qkv chooses from the same features
// (OpenBLAS's own choice goes by CPU model and falls back to 2005-era SSE3
// kernels on models it does not know); OPENBLAS_CORETYPE set by the user wins.
//
// Within a level, the bfloat16 and int8 kernels take the extensions the CPU
// has (AMX, AVX512-BF16, AVX512-VNNI) and other paths without them. The
// environment variable QKV_CPU_FEATURES_OFF=name,name,... turns extensions
// off, so that the kernels take the paths of a CPU without them (make test
// runs the low-precision tests that way too: plain_extensions): amx_tile, amx_bf16, amx_int8,
// avx512_bf16, avx512_vnni; any other name is refused with an error.
#pragma once

#include <string>
#include <vector>

namespace qkv {

enum class CpuIsa { Generic, Avx2, Avx512 };

const char* isa_name(CpuIsa isa);
// "generic" | "avx2" | "avx512" -> the level; anything else is a qkv::Error.
CpuIsa parse_isa(const std::string& name);

// QKV_CPU_FEATURES_OFF's value as a list of names ("" -> none); a name that
// cannot be turned off is a qkv::Error naming the ones that can.
std::vector<std::string> parse_features_off(const std::string& list);
// The extensions QKV_CPU_FEATURES_OFF turns off (read once; an invalid value
// is an error at the first call, which the first kernel makes).
const std::vector<std::string>& features_turned_off();
// The CPU has `feature` and it is not turned off: what the kernels may use.
bool feature_usable(const std::string& feature);

struct CpuInfo {
  std::string vendor;      // "GenuineIntel", "AuthenticAMD", ...
  std::string model_name;  // the brand string, e.g. "AMD EPYC 9R14 96-Core Processor"
  int family = 0, model = 0, stepping = 0;
  // Instruction-set features the CPU reports and the OS has enabled, in
  // CPUID's names ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", ...).
  std::vector<std::string> features;
  CpuIsa best = CpuIsa::Generic;  // the highest level both CPU and OS support

  bool has(const std::string& feature) const;
};

// Read once, on first use.
const CpuInfo& cpu_info();

// The kernel level in use: QKV_ISA if set, else cpu_info().best.
CpuIsa cpu_isa();
bool isa_supported(CpuIsa isa);

// What runs the GEMM: the library, its kernel, and how that kernel was chosen.
struct BlasInfo {
  std::string library;  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..." (its own config string)
  std::string path;     // the shared library loaded
  std::string core;     // the kernel set in use, as OpenBLAS names it ("Haswell", "SkylakeX", ...)
  std::string chosen_by;  // "CPU features (avx512)" or "OPENBLAS_CORETYPE from the environment"
};
const BlasInfo& blas_info();  // loads the BLAS library if it is not loaded yet

// How a bfloat16 GEMM runs at the level in use: "AMX-BF16 tiles",
// "AVX512-BF16" or "float32 BLAS on widened inputs".
const char* gemm_bf16_path();
// How a float16-weight GEMM runs: "F16C widening in registers (rows
// streamed up to 4), ..." or "plain widening ...".
const char* gemm_f16_path();
// How an int8-weight GEMM runs: "AVX512-VNNI (rows streamed up to 4, ...)" or
// "int32 loops for up to 4 rows, ...".
const char* gemm_int8_path();
// How the float32 GEMM runs a decoding step's products (up to 64 rows against
// W^T in inference): "register tiles, 16 lanes, ..." on the avx512 level, 8
// lanes on avx2, BLAS on the generic level.
const char* gemm_decode_path();
// How it runs every other product: "own panels, 8 x 48 register tiles ..." on
// the avx512 level, 6 x 16 on avx2, with BLAS for the smallest; BLAS alone on
// the generic level.
const char* gemm_f32_path();

// Several lines, "name: value", for `qkv info` and every `qkv bench` header:
// the CPU, its features, the kernel level, the float32 GEMM, the BLAS and its
// kernel, the decoding products' kernel, the low-precision paths, threads.
std::string runtime_summary();

}  // namespace qkv
