// This variant's row of the kernel table: compiled, like the rest of
// src/kernels/cpu, once per instruction-set level (QKV_CPU_NS, QKV_CPU_ISA).
#include "src/kernels/cpu/flash_attention.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {

const Kernels& table() {
  static constexpr Kernels k{
      CpuIsa::QKV_CPU_ISA,   &gemm,
      &binary,               &masked_fill,
      &unary_forward,        &unary_backward,
      &sum_middle,           &softmax_forward,
      &softmax_backward,     &log_softmax_forward,
      &log_softmax_backward, &layer_norm_forward,
      &layer_norm_backward,  &rms_norm_forward,
      &rms_norm_backward,    &embedding_forward,
      &embedding_backward,   &cross_entropy_forward,
      &cross_entropy_backward, &flash_attention_forward,
      &flash_attention_backward,
  };
  return k;
}

}  // namespace qkv::cpu::QKV_CPU_NS
