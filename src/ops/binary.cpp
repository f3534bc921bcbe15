// add, sub, mul, div with broadcasting; scale; sum_to (the adjoint of broadcasting).
#include <algorithm>

#include "src/ops/dispatch.h"

namespace qkv {

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    QKV_CHECK(da == db || da == 1 || db == 1, "cannot broadcast shapes ", shape_str(a), " and ", shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Tensor& t, const Shape& out) {
  Shape st(out.size(), 0);
  size_t lead = out.size() - t.shape().size();
  for (size_t i = 0; i < t.shape().size(); ++i)
    st[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  std::vector<int64_t> axes;
  size_t lead = g.shape().size() - shape.size();
  for (size_t i = 0; i < g.shape().size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) axes.push_back((int64_t)i);
  return sum(g, axes, {.keepdim = true}).reshape(shape);
}

static Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b) {
  BroadcastLoop loop;
  loop.shape = broadcast_shapes(a.shape(), b.shape());
  loop.a_strides = broadcast_strides(a, loop.shape);
  loop.b_strides = broadcast_strides(b, loop.shape);
  Tensor out = Tensor::empty(loop.shape);
  QKV_KERNEL(binary)(op, loop, a.data<float>(), b.data<float>(), out.data<float>());
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  require_f32(a, "add", "a");
  require_f32(b, "add", "b");
  Tensor out = binary_forward(BinaryOp::Add, a, b);
  record_op(out, "add", {a, b}, [sa = a.shape(), sb = b.shape()](const BackwardArgs& g) -> std::vector<Tensor> {
    return {g.needs_grad[0] ? sum_to(g.grad_out, sa) : Tensor(), g.needs_grad[1] ? sum_to(g.grad_out, sb) : Tensor()};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  require_f32(a, "sub", "a");
  require_f32(b, "sub", "b");
  Tensor out = binary_forward(BinaryOp::Sub, a, b);
  record_op(out, "sub", {a, b}, [sa = a.shape(), sb = b.shape()](const BackwardArgs& g) -> std::vector<Tensor> {
    return {g.needs_grad[0] ? sum_to(g.grad_out, sa) : Tensor(),
            g.needs_grad[1] ? scale(sum_to(g.grad_out, sb), -1.0f) : Tensor()};
  });
  return out;
}

// d(a*b) = b da + a db
Tensor mul(const Tensor& a, const Tensor& b) {
  require_f32(a, "mul", "a");
  require_f32(b, "mul", "b");
  Tensor out = binary_forward(BinaryOp::Mul, a, b);
  record_op(out, "mul", {a, b}, [a = a.detach(), b = b.detach()](const BackwardArgs& g) -> std::vector<Tensor> {
    return {g.needs_grad[0] ? sum_to(mul(g.grad_out, b), a.shape()) : Tensor(),
            g.needs_grad[1] ? sum_to(mul(g.grad_out, a), b.shape()) : Tensor()};
  });
  return out;
}

// d(a/b) = da / b - (a/b) db / b
Tensor div(const Tensor& a, const Tensor& b) {
  require_f32(a, "div", "a");
  require_f32(b, "div", "b");
  Tensor out = binary_forward(BinaryOp::Div, a, b);
  record_op(out, "div", {a, b}, [a = a.detach(), b = b.detach()](const BackwardArgs& g) -> std::vector<Tensor> {
    Tensor ga, gb;
    if (g.needs_grad[0]) ga = sum_to(div(g.grad_out, b), a.shape());
    if (g.needs_grad[1]) gb = sum_to(scale(div(mul(g.grad_out, g.out), b), -1.0f), b.shape());
    return {ga, gb};
  });
  return out;
}

Tensor scale(const Tensor& x, float s) {
  require_f32(x, "scale", "x");
  Tensor out = binary_forward(BinaryOp::Mul, x, Tensor::scalar(s));
  record_op(out, "scale", {x}, [s](const BackwardArgs& g) -> std::vector<Tensor> { return {scale(g.grad_out, s)}; });
  return out;
}

Tensor add_scalar(const Tensor& x, float s) {
  require_f32(x, "add_scalar", "x");
  Tensor out = binary_forward(BinaryOp::Add, x, Tensor::scalar(s));
  record_op(out, "add_scalar", {x}, [](const BackwardArgs& g) -> std::vector<Tensor> { return {g.grad_out}; });
  return out;
}

void add_(Tensor& acc, const Tensor& x) {
  require_f32(acc, "add_", "accumulator");
  require_f32(x, "add_", "x");
  QKV_CHECK(acc.is_contiguous(), "add_: accumulator must be contiguous");
  QKV_CHECK(broadcast_shapes(acc.shape(), x.shape()) == acc.shape(), "add_: cannot add shape ", shape_str(x.shape()),
            " into ", shape_str(acc.shape()));
  BroadcastLoop loop{acc.shape(), acc.strides(), broadcast_strides(x, acc.shape())};
  QKV_KERNEL(binary)(BinaryOp::Add, loop, acc.data<float>(), x.data<float>(), acc.data<float>());
}

// out = mask ? value : x; the gradient flows only where the mask is zero.
Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) {
  require_f32(x, "masked_fill", "x");
  QKV_CHECK(mask.defined() && mask.dtype() == DType::U8, "masked_fill: mask must be a U8 tensor");
  QKV_CHECK(broadcast_shapes(x.shape(), mask.shape()) == x.shape(), "masked_fill: mask of shape ",
            shape_str(mask.shape()), " does not broadcast to ", shape_str(x.shape()));
  BroadcastLoop loop{x.shape(), broadcast_strides(x, x.shape()), broadcast_strides(mask, x.shape())};
  Tensor out = Tensor::empty(x.shape());
  QKV_KERNEL(masked_fill)(loop, x.data<float>(), mask.data<uint8_t>(), value, out.data<float>());
  record_op(out, "masked_fill", {x}, [mask](const BackwardArgs& g) -> std::vector<Tensor> {
    return {masked_fill(g.grad_out, mask, 0.0f)};
  });
  return out;
}

}  // namespace qkv
