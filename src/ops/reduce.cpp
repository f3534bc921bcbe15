// sum and mean over axes. The backward of a sum broadcasts the gradient back.
#include <algorithm>

#include "src/core/strided.h"
#include "src/ops/dispatch.h"

namespace qkv {

// g (shape with size-1 reduced dims) repeated up to `shape`.
static Tensor broadcast_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  auto view = std::make_shared<TensorImpl>(g.impl());
  view->grad_fn.reset();
  view->requires_grad = false;
  view->strides = broadcast_strides(g, shape);
  view->shape = shape;
  Tensor out = Tensor::empty(shape);
  strided_copy(*view, out.impl());
  return out;
}

static std::vector<int64_t> normalize_axes(const std::vector<int64_t>& axes_in, int64_t nd, const char* op) {
  std::vector<int64_t> axes;
  for (int64_t a : axes_in) {
    int64_t d = a < 0 ? a + nd : a;
    QKV_CHECK(d >= 0 && d < nd, op, ": axis ", a, " out of range for a ", nd, "-d tensor");
    axes.push_back(d);
  }
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  return axes;
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes_in, ReduceOptions options) {
  require_f32(x, "sum", "x");
  std::vector<int64_t> axes = normalize_axes(axes_in, x.dim(), "sum");
  Tensor cur = contiguous_values(x);
  Shape kept = x.shape();
  // One axis at a time, last first: view as [outer, n, inner] and reduce n.
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
    int64_t d = *it, outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i) outer *= kept[i];
    for (int64_t i = d + 1; i < (int64_t)kept.size(); ++i) inner *= kept[i];
    int64_t n = kept[d];
    kept[d] = 1;
    Tensor next = Tensor::empty(kept);
    QKV_KERNEL(sum_middle)(cur.data<float>(), next.data<float>(), outer, n, inner);
    cur = next;
  }
  Shape out_shape;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (options.keepdim || !std::binary_search(axes.begin(), axes.end(), i)) out_shape.push_back(kept[i]);
  Tensor out = cur.reshape(out_shape);
  record_op(out, "sum", {x}, [in_shape = x.shape(), kept](const BackwardArgs& g) -> std::vector<Tensor> {
    return {broadcast_to(g.grad_out.reshape(kept), in_shape)};
  });
  return out;
}

Tensor sum(const Tensor& x) {
  std::vector<int64_t> all(x.dim());
  for (int64_t i = 0; i < x.dim(); ++i) all[i] = i;
  return sum(x, all);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, ReduceOptions options) {
  int64_t count = 1;
  for (int64_t d : normalize_axes(axes, x.dim(), "mean")) count *= x.shape()[d];
  return scale(sum(x, axes, options), 1.0f / (float)count);
}

Tensor mean(const Tensor& x) { return scale(sum(x), 1.0f / (float)x.numel()); }

}  // namespace qkv
