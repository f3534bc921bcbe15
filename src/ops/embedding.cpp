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

Tensor index_add_rows(const Tensor& src_in, const Tensor& ids_in, int64_t rows) {
  require_f32(src_in, "index_add_rows", "src");
  QKV_CHECK(src_in.dim() == 2, "index_add_rows: src must be [M, D], got ", shape_str(src_in.shape()));
  QKV_CHECK(ids_in.defined() && (ids_in.dtype() == DType::I64 || ids_in.dtype() == DType::I32) &&
                ids_in.shape() == Shape{src_in.size(0)},
            "index_add_rows: ids must be I64 [", src_in.size(0), "]");
  Tensor ids = ids_in.to(DType::I64).contiguous();
  const int64_t* p = ids.data<int64_t>();
  for (int64_t m = 0; m < ids.numel(); ++m)
    QKV_CHECK(p[m] >= 0 && p[m] < rows, "index_add_rows: row ", p[m], " outside [0, ", rows, ")");
  Tensor src = contiguous_values(src_in);
  const int64_t dim = src.size(1);
  Tensor out = Tensor::zeros({rows, dim});
  QKV_KERNEL(embedding_backward)(src.data<float>(), p, out.data<float>(), ids.numel(), dim);
  record_op(out, "index_add_rows", {src_in}, [ids](const BackwardArgs& a) -> std::vector<Tensor> {
    return {embedding(a.grad_out, ids)};  // d out[ids[m]] / d src[m] = 1: gather the rows back
  });
  return out;
}

}  // namespace qkv
