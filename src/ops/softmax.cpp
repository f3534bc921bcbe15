// softmax and log-softmax over the last axis (kernels: src/kernels/*/softmax.cpp).
#include "src/ops/dispatch.h"

namespace qkv {

// The forward and backward kernels of one row-wise op, as table fields.
using RowKernel = void (*Kernels::*)(const float*, float*, int64_t, int64_t);
using RowBackward = void (*Kernels::*)(const float*, const float*, float*, int64_t, int64_t);

static Tensor rowwise(const char* name, const Tensor& x_in, RowKernel forward, RowBackward backward) {
  require_f32(x_in, name, "x");
  QKV_CHECK(x_in.dim() >= 1, name, ": needs at least one dimension");
  Tensor x = contiguous_values(x_in);
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  Tensor y = Tensor::empty(x.shape());
  (kernels_for(Device::Cpu).*forward)(x.data<float>(), y.data<float>(), rows, cols);
  record_op(y, name, {x_in}, [backward, rows, cols](const BackwardArgs& a) -> std::vector<Tensor> {
    Tensor dy = a.grad_out.contiguous();
    Tensor dx = Tensor::empty(dy.shape());
    (kernels_for(Device::Cpu).*backward)(a.out.data<float>(), dy.data<float>(), dx.data<float>(), rows, cols);
    return {dx};
  });
  return y;
}

Tensor softmax(const Tensor& x) { return rowwise("softmax", x, &Kernels::softmax_forward, &Kernels::softmax_backward); }

Tensor log_softmax(const Tensor& x) {
  return rowwise("log_softmax", x, &Kernels::log_softmax_forward, &Kernels::log_softmax_backward);
}

}  // namespace qkv
