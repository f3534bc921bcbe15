// Embedding lookup (gather rows) and its backward (scatter-add rows).
#include "src/ops/dispatch.h"

namespace qkv {

Tensor embedding(const Tensor& weight, const Tensor& ids_in) {
  require_f32(weight, "embedding", "weight");
  QKV_CHECK(weight.dim() == 2, "embedding: weight must be [V, D], got ", shape_str(weight.shape()));
  QKV_CHECK(ids_in.defined() && (ids_in.dtype() == DType::I64 || ids_in.dtype() == DType::I32),
            "embedding: ids must be an I64 or I32 tensor");
  Tensor ids = ids_in.to(DType::I64).contiguous();
  const int64_t vocab = weight.size(0), dim = weight.size(1), tokens = ids.numel();
  const int64_t* p = ids.data<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    QKV_CHECK(p[t] >= 0 && p[t] < vocab, "embedding: id ", p[t], " at position ", t, " is outside the vocabulary [0, ",
              vocab, ")");
  Tensor w = contiguous_values(weight);
  Shape out_shape = ids.shape();
  out_shape.push_back(dim);
  Tensor out = Tensor::empty(out_shape);
  QKV_KERNEL(embedding_forward)(w.data<float>(), p, out.data<float>(), tokens, dim);
  record_op(out, "embedding", {weight}, [ids, vocab, dim, tokens](const BackwardArgs& a) -> std::vector<Tensor> {
    Tensor dout = a.grad_out.contiguous();
    Tensor dw = Tensor::zeros({vocab, dim});
    QKV_KERNEL(embedding_backward)(dout.data<float>(), ids.data<int64_t>(), dw.data<float>(), tokens, dim);
    return {dw};
  });
  return out;
}

}  // namespace qkv
