// softmax and log-softmax over the last axis (kernels: src/kernels/*/softmax.cpp).
#include "src/ops/dispatch.h"

namespace qkv {

using RowKernel = void (*)(const float*, float*, int64_t, int64_t);
using RowBackward = void (*)(const float*, const float*, float*, int64_t, int64_t);

static Tensor rowwise(const char* name, const Tensor& x_in, RowKernel fwd_ref, RowKernel fwd_cpu,
                      RowBackward bwd_ref, RowBackward bwd_cpu) {
  require_f32(x_in, name, "x");
  QKV_CHECK(x_in.dim() >= 1, name, ": needs at least one dimension");
  Tensor x = contiguous_values(x_in);
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  Tensor y = Tensor::empty(x.shape());
  (reference_kernels() ? fwd_ref : fwd_cpu)(x.data<float>(), y.data<float>(), rows, cols);
  record_op(y, name, {x_in}, [bwd_ref, bwd_cpu, rows, cols](const BackwardArgs& a) -> std::vector<Tensor> {
    Tensor dy = a.grad_out.contiguous();
    Tensor dx = Tensor::empty(dy.shape());
    (reference_kernels() ? bwd_ref : bwd_cpu)(a.out.data<float>(), dy.data<float>(), dx.data<float>(), rows, cols);
    return {dx};
  });
  return y;
}

Tensor softmax(const Tensor& x) {
  const cpu::Kernels& k = cpu::kernels();
  return rowwise("softmax", x, ref::softmax_forward, k.softmax_forward, ref::softmax_backward, k.softmax_backward);
}

Tensor log_softmax(const Tensor& x) {
  const cpu::Kernels& k = cpu::kernels();
  return rowwise("log_softmax", x, ref::log_softmax_forward, k.log_softmax_forward, ref::log_softmax_backward,
                 k.log_softmax_backward);
}

}  // namespace qkv
