// CPU features from CPUID and XGETBV (Intel SDM vol. 2A "CPUID", AMD APM
// vol. 3 appendix E): a feature counts only when the CPU reports it and the
// operating system saves its registers on a context switch (XCR0), since an
// AVX-512 instruction on an OS that does not save ZMM state faults.
#include <cpuid.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "qkv/cpu.h"
#include "qkv/error.h"

namespace qkv {
namespace {

struct Regs {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs cpuid(uint32_t leaf, uint32_t subleaf = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) return Regs{};  // leaf not supported
  return r;
}

bool bit(uint32_t reg, int b) { return (reg >> b) & 1u; }

uint64_t xcr0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

CpuInfo read_cpu() {
  CpuInfo info;
  const Regs v = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor + 0, &v.ebx, 4);
  std::memcpy(vendor + 4, &v.edx, 4);
  std::memcpy(vendor + 8, &v.ecx, 4);
  info.vendor = vendor;

  char brand[49] = {};
  if (cpuid(0x80000000).eax >= 0x80000004)
    for (uint32_t i = 0; i < 3; ++i) {
      const Regs b = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i + 0, &b.eax, 4);
      std::memcpy(brand + 16 * i + 4, &b.ebx, 4);
      std::memcpy(brand + 16 * i + 8, &b.ecx, 4);
      std::memcpy(brand + 16 * i + 12, &b.edx, 4);
    }
  info.model_name = brand;
  info.model_name.erase(0, info.model_name.find_first_not_of(' '));
  info.model_name.erase(info.model_name.find_last_not_of(' ') + 1);

  const Regs l1 = cpuid(1);
  const uint32_t base_family = (l1.eax >> 8) & 0xF, base_model = (l1.eax >> 4) & 0xF;
  info.family = (int)(base_family == 0xF ? base_family + ((l1.eax >> 20) & 0xFF) : base_family);
  info.model = (int)(base_family == 0x6 || base_family == 0xF ? base_model + (((l1.eax >> 16) & 0xF) << 4) : base_model);
  info.stepping = (int)(l1.eax & 0xF);

  const uint32_t max_leaf = v.eax;
  const Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const Regs l7s1 = max_leaf >= 7 && l7.eax >= 1 ? cpuid(7, 1) : Regs{};
  const Regs e1 = cpuid(0x80000001);

  // The OS enables a register state in XCR0: SSE (bit 1) and AVX (bit 2) for
  // YMM; opmask, ZMM_Hi256 and Hi16_ZMM (bits 5-7) for AVX-512; XTILECFG and
  // XTILEDATA (17-18) for AMX (Linux also wants arch_prctl permission before
  // the first tile instruction; qkv uses no AMX yet).
  const bool osxsave = bit(l1.ecx, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool os_avx = (xcr & 0x6) == 0x6;
  const bool os_avx512 = os_avx && (xcr & 0xE0) == 0xE0;
  const bool os_amx = (xcr & 0x60000) == 0x60000;

  auto add = [&](const char* name, bool present) {
    if (present) info.features.push_back(name);
  };
  add("sse2", bit(l1.edx, 26));
  add("sse3", bit(l1.ecx, 0));
  add("ssse3", bit(l1.ecx, 9));
  add("sse4_1", bit(l1.ecx, 19));
  add("sse4_2", bit(l1.ecx, 20));
  add("popcnt", bit(l1.ecx, 23));
  add("movbe", bit(l1.ecx, 22));
  add("lzcnt", bit(e1.ecx, 5));
  add("bmi1", bit(l7.ebx, 3));
  add("bmi2", bit(l7.ebx, 8));
  add("avx", os_avx && bit(l1.ecx, 28));
  add("f16c", os_avx && bit(l1.ecx, 29));
  add("fma", os_avx && bit(l1.ecx, 12));
  add("avx2", os_avx && bit(l7.ebx, 5));
  add("avx_vnni", os_avx && bit(l7s1.eax, 4));
  add("avx512f", os_avx512 && bit(l7.ebx, 16));
  add("avx512dq", os_avx512 && bit(l7.ebx, 17));
  add("avx512cd", os_avx512 && bit(l7.ebx, 28));
  add("avx512bw", os_avx512 && bit(l7.ebx, 30));
  add("avx512vl", os_avx512 && bit(l7.ebx, 31));
  add("avx512_vnni", os_avx512 && bit(l7.ecx, 11));
  add("avx512_bf16", os_avx512 && bit(l7s1.eax, 5));
  add("avx512_fp16", os_avx512 && bit(l7.edx, 23));
  add("amx_tile", os_amx && bit(l7.edx, 24));
  add("amx_bf16", os_amx && bit(l7.edx, 22));
  add("amx_int8", os_amx && bit(l7.edx, 25));

  auto all = [&](std::initializer_list<const char*> names) {
    return std::all_of(names.begin(), names.end(), [&](const char* n) { return info.has(n); });
  };
  // The levels are GCC's -march=x86-64-v3 and -v4, which the kernels are compiled for.
  if (all({"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe"})) {
    info.best = CpuIsa::Avx2;
    if (all({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})) info.best = CpuIsa::Avx512;
  }
  return info;
}

}  // namespace

const char* isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Generic: return "generic";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
  }
  return "?";
}

CpuIsa parse_isa(const std::string& name) {
  for (CpuIsa isa : {CpuIsa::Generic, CpuIsa::Avx2, CpuIsa::Avx512})
    if (name == isa_name(isa)) return isa;
  fail("unknown instruction-set level '", name, "': expected generic, avx2 or avx512");
}

std::vector<std::string> parse_features_off(const std::string& list) {
  static const std::vector<std::string> kSwitchable = {"amx_tile", "amx_bf16", "amx_int8", "avx512_bf16",
                                                       "avx512_vnni"};
  std::vector<std::string> names;
  size_t from = 0;
  while (from <= list.size() && !list.empty()) {
    const size_t comma = std::min(list.find(',', from), list.size());
    const std::string name = list.substr(from, comma - from);
    if (std::find(kSwitchable.begin(), kSwitchable.end(), name) == kSwitchable.end())
      fail("cannot turn off '", name, "': expected a comma-separated list of amx_tile, amx_bf16, amx_int8, ",
           "avx512_bf16, avx512_vnni");
    names.push_back(name);
    from = comma + 1;
  }
  return names;
}

const std::vector<std::string>& features_turned_off() {
  static const std::vector<std::string> off = [] {
    const char* value = std::getenv("QKV_CPU_FEATURES_OFF");
    try {
      return parse_features_off(value ? value : "");
    } catch (const Error& e) {
      fail("QKV_CPU_FEATURES_OFF: ", e.what());
    }
  }();
  return off;
}

bool feature_usable(const std::string& feature) {
  const std::vector<std::string>& off = features_turned_off();
  return cpu_info().has(feature) && std::find(off.begin(), off.end(), feature) == off.end();
}

bool CpuInfo::has(const std::string& feature) const {
  return std::find(features.begin(), features.end(), feature) != features.end();
}

const CpuInfo& cpu_info() {
  static const CpuInfo info = read_cpu();
  return info;
}

bool isa_supported(CpuIsa isa) { return (int)isa <= (int)cpu_info().best; }

CpuIsa cpu_isa() {
  static const CpuIsa isa = [] {
    const char* forced = std::getenv("QKV_ISA");
    if (!forced || !*forced) return cpu_info().best;
    const CpuIsa want = [&] {
      try {
        return parse_isa(forced);
      } catch (const Error& e) {
        fail("QKV_ISA: ", e.what());
      }
    }();
    QKV_CHECK(isa_supported(want), "QKV_ISA=", forced, ": this CPU (", cpu_info().model_name, ") supports at most ",
              isa_name(cpu_info().best));
    return want;
  }();
  return isa;
}

}  // namespace qkv
