// concat and split along a dimension. split returns views; concat copies.
#include "src/ops/dispatch.h"

namespace qkv {

Tensor concat(const std::vector<Tensor>& parts, int64_t dim) {
  QKV_CHECK(!parts.empty(), "concat: no tensors given");
  const Tensor& first = parts[0];
  int64_t nd = first.dim();
  int64_t d = dim < 0 ? dim + nd : dim;
  QKV_CHECK(d >= 0 && d < nd, "concat: dimension ", dim, " out of range for ", nd, "-d tensors");
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& p = parts[i];
    require_f32(p, "concat", "part");
    bool same = p.dim() == nd;
    for (int64_t k = 0; same && k < nd; ++k) same = k == d || p.shape()[k] == first.shape()[k];
    QKV_CHECK(same, "concat: part ", i, " has shape ", shape_str(p.shape()), ", incompatible with part 0 of shape ",
              shape_str(first.shape()), " along dimension ", d);
    sizes.push_back(p.shape()[d]);
    out_shape[d] += p.shape()[d];
  }
  Tensor out = Tensor::empty(out_shape);
  int64_t at = 0;
  for (const Tensor& p : parts) {
    Tensor dst = out.detach().slice(d, at, at + p.shape()[d]);
    dst.copy_(p);
    at += p.shape()[d];
  }
  record_op(out, "concat", parts, [d, sizes](const BackwardArgs& a) -> std::vector<Tensor> {
    std::vector<Tensor> grads;
    int64_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      grads.push_back(a.needs_grad[i] ? a.grad_out.slice(d, at, at + sizes[i]) : Tensor());
      at += sizes[i];
    }
    return grads;
  });
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  int64_t d = dim < 0 ? dim + x.dim() : dim;
  QKV_CHECK(d >= 0 && d < x.dim(), "split: dimension ", dim, " out of range for shape ", shape_str(x.shape()));
  int64_t total = 0;
  for (int64_t s : sizes) {
    QKV_CHECK(s >= 0, "split: negative size ", s);
    total += s;
  }
  QKV_CHECK(total == x.shape()[d], "split: sizes sum to ", total, " but dimension ", d, " has size ", x.shape()[d]);
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(x.slice(d, at, at + s));
    at += s;
  }
  return out;
}

}  // namespace qkv
