// The reference twins as a kernel table: what kernels_for(Device::Cpu) gives
// inside a ReferenceKernelsGuard.
#include "src/kernels/kernels.h"

namespace qkv::ref {

const Kernels& table() {
  // Designated, so that a field of the same type cannot take the wrong kernel.
  static constexpr Kernels k{
      .name = "reference",
      .device = Device::Cpu,
      .isa = CpuIsa::Generic,
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

}  // namespace qkv::ref
