// Internal: summing the gradients of data-parallel training across the
// processes of a group while backward runs (docs/distributed.md).
//
// The parameters are split into buckets of about `bucket_bytes`, in reverse
// order of registration (about the order backward finishes them). When every
// gradient of a bucket is final (Tensor::backward's leaf_ready), the bucket
// is copied into one buffer and its sum is started without waiting; buckets
// start strictly in order, so every process issues the same collectives in
// the same order whatever its data. finish() starts the rest (a parameter no
// node reached counts as a zero gradient), waits, and writes each sum back as
// the parameter's gradient.
#pragma once

#include <unordered_map>
#include <vector>

#include "qkv/process_group.h"
#include "qkv/tensor.h"

namespace qkv {

class GradientReducer {
public:
  GradientReducer(std::vector<Tensor> parameters, ProcessGroup& group, int64_t bucket_bytes = 4 << 20);
  void ready(const Tensor& leaf);  // from backward's leaf_ready; others are ignored
  void finish();
  double waited_seconds() const { return waited_; }  // in finish(), for the bench
  size_t buckets() const { return buckets_.size(); }

private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    std::vector<float> buffer;
    size_t pending = 0;  // gradients not yet final
  };
  void start(Bucket& b);

  std::vector<Tensor> params_;
  ProcessGroup& group_;
  std::unordered_map<const TensorImpl*, size_t> index_;  // parameter -> position in params_
  std::vector<size_t> bucket_of_;
  std::vector<size_t> offset_;  // each parameter's place in its bucket's buffer
  std::vector<Bucket> buckets_;
  size_t next_ = 0;  // the first bucket not started
  double waited_ = 0;
};

}  // namespace qkv
