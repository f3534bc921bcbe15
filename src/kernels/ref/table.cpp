// The reference twins as a kernel table: what kernels_for(Device::Cpu) gives
// inside a ReferenceKernelsGuard.
#include "src/kernels/kernels.h"

namespace qkv::ref {

const Kernels& table() {
  static constexpr Kernels k{
      .name = "reference",
      .device = Device::Cpu,
      .isa = CpuIsa::Generic,
      QKV_KERNEL_ENTRIES
  };
  return k;
}

}  // namespace qkv::ref
