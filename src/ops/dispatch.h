// Internal helpers shared by the op files: the single dispatch point to the
// kernel table, and input checks.
#pragma once

#include "qkv/ops.h"
#include "src/kernels/kernels.h"

// The kernel `name` of the CPU table selected for this thread: the reference
// twins, or the fast ones of the instruction-set level in use. Every op runs on
// the CPU today; an op for another device would ask kernels_for(its device).
#define QKV_KERNEL(name) (::qkv::kernels_for(::qkv::Device::Cpu).name)

namespace qkv {

inline void require_f32(const Tensor& t, const char* op, const char* what) {
  QKV_CHECK(t.defined(), op, ": ", what, " is undefined");
  QKV_CHECK(t.dtype() == DType::F32, op, ": ", what, " has dtype ", dtype_name(t.dtype()), ", expected F32");
}

// The values of `t`, contiguous and without history: what kernels read and
// backward functions save (a saved tensor never keeps the graph behind it alive).
inline Tensor contiguous_values(const Tensor& t) {
  if (!t.defined()) return t;
  NoGradGuard no_grad;
  return t.contiguous().detach();
}

// Broadcast strides of `t` for an output of shape `out` (0 along broadcast dims).
Shape broadcast_strides(const Tensor& t, const Shape& out);

}  // namespace qkv
