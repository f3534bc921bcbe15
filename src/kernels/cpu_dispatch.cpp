// The one place that picks a kernel table: for the CPU, the variant of the
// level qkv::cpu_isa() names (the CPU's best, or QKV_ISA), checked against
// what the CPU can run, or the reference twins inside a ReferenceKernelsGuard.
#include <omp.h>

#include <sstream>

#include "qkv/error.h"
#include "qkv/tensor.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu {

namespace generic { const Kernels& table(); }
namespace avx2 { const Kernels& table(); }
namespace avx512 { const Kernels& table(); }

const Kernels& kernels(CpuIsa isa) {
  QKV_CHECK(isa_supported(isa), "kernels for ", isa_name(isa), ": this CPU (", cpu_info().model_name,
            ") supports at most ", isa_name(cpu_info().best));
  switch (isa) {
    case CpuIsa::Generic: return generic::table();
    case CpuIsa::Avx2: return avx2::table();
    case CpuIsa::Avx512: return avx512::table();
  }
  fail("kernels: unknown instruction-set level");
}

bool has_feature(const char* feature) { return feature_usable(feature); }

const Kernels& kernels() {
  static const Kernels& k = []() -> const Kernels& {
    const Kernels& chosen = kernels(cpu_isa());
    features_turned_off();  // an invalid QKV_CPU_FEATURES_OFF is an error here, not inside a kernel
    // Load the BLAS now, from the first op, rather than from inside a kernel's
    // parallel region: a library that cannot be loaded is then an error the
    // caller sees, not an exception thrown inside an OpenMP region.
    blas_info();
    return chosen;
  }();
  return k;
}

}  // namespace qkv::cpu

namespace qkv {

const Kernels& kernels_for(Device device) {
  QKV_CHECK(device == Device::Cpu, "ops do not run on the ", device_name(device), " device: its tensors have no values");
  return reference_kernels() ? ref::table() : cpu::kernels();
}

const char* gemm_bf16_path() { return kernels_for(Device::Cpu).gemm_bf16_path(); }
const char* gemm_f16_path() { return kernels_for(Device::Cpu).gemm_f16_path(); }
const char* gemm_int8_path() { return kernels_for(Device::Cpu).gemm_int8_path(); }
const char* gemm_decode_path() { return kernels_for(Device::Cpu).gemm_decode_path(); }
const char* gemm_f32_path() { return kernels_for(Device::Cpu).gemm_f32_path(); }

std::string runtime_summary() {
  const CpuInfo& cpu = cpu_info();
  const BlasInfo& blas = blas_info();
  std::ostringstream os;
  os << "cpu:      " << (cpu.model_name.empty() ? "(no brand string)" : cpu.model_name) << " (" << cpu.vendor
     << ", family " << cpu.family << " model " << cpu.model << ")\n";
  os << "features:";
  for (const std::string& f : cpu.features) os << " " << f;
  if (!features_turned_off().empty()) {
    os << "\n          turned off by QKV_CPU_FEATURES_OFF:";
    for (const std::string& f : features_turned_off()) os << " " << f;
  }
  os << "\nkernels:  " << isa_name(cpu_isa());
  if (cpu_isa() != cpu.best) os << " (forced by QKV_ISA; this CPU runs up to " << isa_name(cpu.best) << ")";
  else os << " (the best this CPU runs; QKV_ISA=generic|avx2|avx512 forces a lower level)";
  os << "\ngemm:     " << gemm_f32_path() << "\n";
  os << "blas:     " << blas.library << "; kernel " << blas.core << ", chosen by " << blas.chosen_by << "\n";
  os << "decode:   " << gemm_decode_path() << "\n";
  os << "bf16:     " << gemm_bf16_path() << "\n";
  os << "f16:      " << gemm_f16_path() << "\n";
  os << "int8:     " << gemm_int8_path() << "\n";
  os << "threads:  " << omp_get_max_threads() << "\n";
  return os.str();
}

}  // namespace qkv
