// This variant's row of the kernel table: compiled, like the rest of
// src/kernels/cpu, once per instruction-set level (QKV_CPU_NS, QKV_CPU_ISA).
#include "src/kernels/kernels.h"

#define QKV_STRINGIFY_(x) #x
#define QKV_STRINGIFY(x) QKV_STRINGIFY_(x)

namespace qkv::cpu::QKV_CPU_NS {

const Kernels& table() {
  static constexpr Kernels k{
      .name = "cpu " QKV_STRINGIFY(QKV_CPU_NS),
      .device = Device::Cpu,
      .isa = CpuIsa::QKV_CPU_ISA,
      QKV_KERNEL_ENTRIES
  };
  return k;
}

}  // namespace qkv::cpu::QKV_CPU_NS
