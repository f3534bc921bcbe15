// Internal helpers shared by the op files: the single dispatch point between
// the fast and the reference kernels, and input checks.
#pragma once

#include "qkv/ops.h"
#include "src/kernels/kernels.h"

// The kernel `name` of the twin selected for this thread.
#define QKV_KERNEL(name) (::qkv::reference_kernels() ? &::qkv::ref::name : &::qkv::cpu::name)

namespace qkv {

inline void require_f32(const Tensor& t, const char* op, const char* what) {
  QKV_CHECK(t.defined(), op, ": ", what, " is undefined");
  QKV_CHECK(t.dtype() == DType::F32, op, ": ", what, " has dtype ", dtype_name(t.dtype()), ", expected F32");
}

// Broadcast strides of `t` for an output of shape `out` (0 along broadcast dims).
Shape broadcast_strides(const Tensor& t, const Shape& out);

}  // namespace qkv
