// Cross-entropy with ignore_index and label smoothing, fused with log-softmax:
//   loss_r = (1-eps) (lse_r - x_r[t_r]) + eps/V sum_v (lse_r - x_r[v]),  mean over kept rows
//   dlogits_r = (softmax(x_r) - (1-eps) onehot(t_r) - eps/V) / kept_rows
// Only the per-row log-sum-exp is saved; probabilities are never stored.
#include <cmath>

#include "src/ops/dispatch.h"

namespace qkv {

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in, CrossEntropyOptions options) {
  require_f32(logits_in, "cross_entropy", "logits");
  QKV_CHECK(logits_in.dim() == 2, "cross_entropy: logits must be [N, V], got ", shape_str(logits_in.shape()));
  QKV_CHECK(targets_in.defined() && (targets_in.dtype() == DType::I64 || targets_in.dtype() == DType::I32),
            "cross_entropy: targets must be an I64 or I32 tensor");
  QKV_CHECK(targets_in.shape() == Shape{logits_in.size(0)}, "cross_entropy: targets of shape ",
            shape_str(targets_in.shape()), " for logits of shape ", shape_str(logits_in.shape()));
  QKV_CHECK(options.label_smoothing >= 0.0f && options.label_smoothing <= 1.0f,
            "cross_entropy: label_smoothing must be in [0, 1], got ", options.label_smoothing);
  Tensor logits = contiguous_values(logits_in);
  Tensor targets = targets_in.to(DType::I64).contiguous();
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const int64_t* t = targets.data<int64_t>();
  int64_t kept = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == options.ignore_index) continue;
    QKV_CHECK(t[r] >= 0 && t[r] < vocab, "cross_entropy: target ", t[r], " at row ", r, " is outside [0, ", vocab, ")");
    ++kept;
  }
  Tensor row_loss = Tensor::empty({rows}), lse = Tensor::empty({rows});
  QKV_KERNEL(cross_entropy_forward)(logits.data<float>(), t, row_loss.data<float>(), lse.data<float>(), rows, vocab,
                                    options.ignore_index, options.label_smoothing);
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) total += row_loss.data<float>()[r];
  // As PyTorch: the mean over zero kept rows is NaN.
  Tensor out = Tensor::scalar(kept ? (float)(total / kept) : NAN);
  record_op(out, "cross_entropy", {logits_in}, [logits, targets, lse, kept, rows, vocab, options](
                                                   const BackwardArgs& a) -> std::vector<Tensor> {
    Tensor d = Tensor::empty({rows, vocab});
    float s = kept ? a.grad_out.item() / (float)kept : 0.0f;
    QKV_KERNEL(cross_entropy_backward)(logits.data<float>(), targets.data<int64_t>(), lse.data<float>(), s,
                                       d.data<float>(), rows, vocab, options.ignore_index, options.label_smoothing);
    return {d};
  });
  return out;
}

}  // namespace qkv
