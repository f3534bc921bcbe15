// LayerNorm and RMSNorm over the last axis. The forward saves exactly what the
// backward needs: mean and rstd per row (LayerNorm), rstd per row (RMSNorm).
#include "src/ops/dispatch.h"

namespace qkv {

static void check_param(const Tensor& p, int64_t cols, const char* op, const char* what) {
  if (!p.defined()) return;
  require_f32(p, op, what);
  QKV_CHECK(p.shape() == Shape{cols}, op, ": ", what, " of shape ", shape_str(p.shape()), ", expected [", cols, "]");
}

Tensor layer_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, float eps) {
  require_f32(x_in, "layer_norm", "x");
  QKV_CHECK(x_in.dim() >= 1, "layer_norm: needs at least one dimension");
  const int64_t cols = x_in.size(-1), rows = cols ? x_in.numel() / cols : 0;
  check_param(weight, cols, "layer_norm", "weight");
  check_param(bias, cols, "layer_norm", "bias");
  Tensor x = contiguous_values(x_in);
  Tensor w = contiguous_values(weight);
  Tensor b = contiguous_values(bias);
  Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
  QKV_KERNEL(layer_norm_forward)(x.data<float>(), w.defined() ? w.data<float>() : nullptr,
                                 b.defined() ? b.data<float>() : nullptr, y.data<float>(), mean.data<float>(),
                                 rstd.data<float>(), rows, cols, eps);
  record_op(y, "layer_norm", {x_in, weight, bias}, [x, w, mean, rstd, rows, cols](const BackwardArgs& a) -> std::vector<Tensor> {
    Tensor dy = a.grad_out.contiguous();
    Tensor dx = a.needs_grad[0] ? Tensor::empty(x.shape()) : Tensor();
    Tensor dw = a.needs_grad[1] ? Tensor::empty({cols}) : Tensor();
    Tensor db = a.needs_grad[2] ? Tensor::empty({cols}) : Tensor();
    QKV_KERNEL(layer_norm_backward)(x.data<float>(), w.defined() ? w.data<float>() : nullptr, mean.data<float>(),
                                    rstd.data<float>(), dy.data<float>(), dx.defined() ? dx.data<float>() : nullptr,
                                    dw.defined() ? dw.data<float>() : nullptr,
                                    db.defined() ? db.data<float>() : nullptr, rows, cols);
    return {dx, dw, db};
  });
  return y;
}

Tensor rms_norm(const Tensor& x_in, const Tensor& weight, float eps) {
  require_f32(x_in, "rms_norm", "x");
  QKV_CHECK(x_in.dim() >= 1, "rms_norm: needs at least one dimension");
  const int64_t cols = x_in.size(-1), rows = cols ? x_in.numel() / cols : 0;
  check_param(weight, cols, "rms_norm", "weight");
  Tensor x = contiguous_values(x_in);
  Tensor w = contiguous_values(weight);
  Tensor y = Tensor::empty(x.shape()), rstd = Tensor::empty({rows});
  QKV_KERNEL(rms_norm_forward)(x.data<float>(), w.defined() ? w.data<float>() : nullptr, y.data<float>(),
                               rstd.data<float>(), rows, cols, eps);
  record_op(y, "rms_norm", {x_in, weight}, [x, w, rstd, rows, cols](const BackwardArgs& a) -> std::vector<Tensor> {
    Tensor dy = a.grad_out.contiguous();
    Tensor dx = a.needs_grad[0] ? Tensor::empty(x.shape()) : Tensor();
    Tensor dw = a.needs_grad[1] ? Tensor::empty({cols}) : Tensor();
    QKV_KERNEL(rms_norm_backward)(x.data<float>(), w.defined() ? w.data<float>() : nullptr, rstd.data<float>(),
                                  dy.data<float>(), dx.defined() ? dx.data<float>() : nullptr,
                                  dw.defined() ? dw.data<float>() : nullptr, rows, cols);
    return {dx, dw};
  });
  return y;
}

}  // namespace qkv
