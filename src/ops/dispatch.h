// Internal helpers shared by the op files: the single dispatch point between
// the fast and the reference kernels, and input checks.
#pragma once

#include "qkv/ops.h"
#include "src/kernels/kernels.h"

// The kernel `name` of the twin selected for this thread: the reference, or
// the fast one of the instruction-set level in use.
#define QKV_KERNEL(name) (::qkv::reference_kernels() ? &::qkv::ref::name : ::qkv::cpu::kernels().name)

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
