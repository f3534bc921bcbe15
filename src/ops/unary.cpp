// exp, log, tanh, sigmoid, relu, gelu (exact and tanh form), silu.
// Forward y = f(x); backward dx = dy * f'(x), with f' from the kernels.
#include "src/ops/dispatch.h"

namespace qkv {

static Tensor unary(UnaryOp op, const char* name, const Tensor& x_in) {
  require_f32(x_in, name, "x");
  Tensor x = contiguous_values(x_in);
  Tensor y = Tensor::empty(x.shape());
  QKV_KERNEL(unary_forward)(op, x.data<float>(), y.data<float>(), x.numel());
  record_op(y, name, {x_in}, [op, x](const BackwardArgs& g) -> std::vector<Tensor> {
    Tensor dy = g.grad_out.contiguous();
    Tensor dx = Tensor::empty(x.shape());
    QKV_KERNEL(unary_backward)(op, x.data<float>(), g.out.data<float>(), dy.data<float>(), dx.data<float>(), x.numel());
    return {dx};
  });
  return y;
}

Tensor exp(const Tensor& x) { return unary(UnaryOp::Exp, "exp", x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::Log, "log", x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::Tanh, "tanh", x); }
Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::Sigmoid, "sigmoid", x); }
Tensor relu(const Tensor& x) { return unary(UnaryOp::Relu, "relu", x); }
Tensor silu(const Tensor& x) { return unary(UnaryOp::Silu, "silu", x); }
Tensor gelu(const Tensor& x, GeluApproximation approximation) {
  return approximation == GeluApproximation::Tanh ? unary(UnaryOp::GeluTanh, "gelu_tanh", x)
                                                  : unary(UnaryOp::Gelu, "gelu", x);
}

}  // namespace qkv
