// Loads OpenBLAS with the kernel set that matches the CPU's features (see blas.h).
#include "src/kernels/blas.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "qkv/cpu.h"
#include "qkv/error.h"

#ifndef QKV_OPENBLAS_PATH
#error "QKV_OPENBLAS_PATH (the OpenMP build of libopenblas.so.0) is set by CMake"
#endif

namespace qkv {
namespace {

// OpenBLAS's name for the fastest of its kernel sets that the level `isa`
// allows. For sgemm, Cooperlake runs SkylakeX's AVX-512 kernels and Zen runs
// Haswell's AVX2 ones with its own blocking parameters; below AVX2 the
// choice follows the features the CPU has.
std::string core_for(CpuIsa isa, const CpuInfo& cpu) {
  switch (isa) {
    case CpuIsa::Avx512: return cpu.has("avx512_bf16") ? "Cooperlake" : "SkylakeX";
    case CpuIsa::Avx2: return cpu.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
    case CpuIsa::Generic: break;
  }
  if (cpu.has("avx")) return "Sandybridge";
  return cpu.has("sse4_2") ? "Nehalem" : "Prescott";
}

struct Loaded {
  BlasInfo info;
  blas::SgemmFn sgemm = nullptr;
};

Loaded load() {
  Loaded l;
  l.info.path = QKV_OPENBLAS_PATH;
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const bool user_set = user && *user;
  if (user_set) {
    l.info.chosen_by = std::string("OPENBLAS_CORETYPE=") + user + " from the environment";
  } else {
    const std::string core = core_for(cpu_isa(), cpu_info());
    l.info.chosen_by = std::string("CPU features (") + isa_name(cpu_isa()) + " -> " + core + ")";
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  }
  void* lib = dlopen(QKV_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!user_set) unsetenv("OPENBLAS_CORETYPE");
  QKV_CHECK(lib, "cannot load OpenBLAS: ", dlerror(), " (scripts/install-deps.sh installs libopenblas0-openmp)");
  l.sgemm = (blas::SgemmFn)dlsym(lib, "cblas_sgemm");
  QKV_CHECK(l.sgemm, "OpenBLAS at ", QKV_OPENBLAS_PATH, " has no cblas_sgemm");
  auto text = [&](const char* fn) -> std::string {
    auto f = (char* (*)())dlsym(lib, fn);
    const char* s = f ? f() : nullptr;
    return s ? s : "?";
  };
  l.info.library = text("openblas_get_config");
  while (!l.info.library.empty() && l.info.library.back() == ' ') l.info.library.pop_back();
  l.info.core = text("openblas_get_corename");
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const BlasInfo& blas_info() { return loaded().info; }

namespace blas {
SgemmFn sgemm() { return loaded().sgemm; }
}  // namespace blas

}  // namespace qkv
