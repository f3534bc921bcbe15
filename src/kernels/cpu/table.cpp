// This variant's row of the kernel table: compiled, like the rest of
// src/kernels/cpu, once per instruction-set level (QKV_CPU_NS, QKV_CPU_ISA).
#include "src/kernels/kernels.h"

#define QKV_STRINGIFY_(x) #x
#define QKV_STRINGIFY(x) QKV_STRINGIFY_(x)

namespace qkv::cpu::QKV_CPU_NS {

const Kernels& table() {
  // Designated, so that a field of the same type cannot take the wrong kernel.
  static constexpr Kernels k{
      .name = "cpu " QKV_STRINGIFY(QKV_CPU_NS),
      .device = Device::Cpu,
      .isa = CpuIsa::QKV_CPU_ISA,
      .gemm = &gemm,
      .binary = &binary,
      .masked_fill = &masked_fill,
      .unary_forward = &unary_forward,
      .unary_backward = &unary_backward,
      .sum_middle = &sum_middle,
      .softmax_forward = &softmax_forward,
      .softmax_backward = &softmax_backward,
      .log_softmax_forward = &log_softmax_forward,
      .log_softmax_backward = &log_softmax_backward,
      .layer_norm_forward = &layer_norm_forward,
      .layer_norm_backward = &layer_norm_backward,
      .rms_norm_forward = &rms_norm_forward,
      .rms_norm_backward = &rms_norm_backward,
      .embedding_forward = &embedding_forward,
      .embedding_backward = &embedding_backward,
      .cross_entropy_forward = &cross_entropy_forward,
      .cross_entropy_backward = &cross_entropy_backward,
      .rope = &rope,
      .gemm_batched = &gemm_batched,
      .strided_copy = &strided_copy,
      .accumulate = &accumulate,
      .dropout_mask = &dropout_mask,
      .flash_attention_forward = &flash_attention_forward,
      .flash_attention_backward = &flash_attention_backward,
      .adamw_step = &adamw_step,
      .sgd_step = &sgd_step,
      .sum_of_squares = &sum_of_squares,
      .scale_spans = &scale_spans,
  };
  return k;
}

}  // namespace qkv::cpu::QKV_CPU_NS
