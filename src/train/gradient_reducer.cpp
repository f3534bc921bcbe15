// Summing gradients across processes during backward (src/train/gradient_reducer.h).
#include "src/train/gradient_reducer.h"

#include <chrono>
#include <cstring>

namespace qkv {

GradientReducer::GradientReducer(std::vector<Tensor> parameters, ProcessGroup& group, int64_t bucket_bytes)
    : params_(std::move(parameters)), group_(group), bucket_of_(params_.size()), offset_(params_.size()) {
  int64_t filled = 0;
  for (size_t i = params_.size(); i-- > 0;) {
    index_[&params_[i].impl()] = i;
    const int64_t bytes = params_[i].numel() * (int64_t)sizeof(float);
    if (buckets_.empty() || filled + bytes > bucket_bytes) {
      buckets_.emplace_back();
      filled = 0;
    }
    Bucket& b = buckets_.back();
    bucket_of_[i] = buckets_.size() - 1;
    offset_[i] = b.buffer.size();
    b.params.push_back(i);
    b.buffer.resize(b.buffer.size() + (size_t)params_[i].numel());
    filled += bytes;
  }
  for (Bucket& b : buckets_) b.pending = b.params.size();
}

void GradientReducer::ready(const Tensor& leaf) {
  auto it = index_.find(&leaf.impl());
  if (it == index_.end()) return;
  Bucket& b = buckets_[bucket_of_[it->second]];
  if (b.pending > 0) --b.pending;
  while (next_ < buckets_.size() && buckets_[next_].pending == 0) start(buckets_[next_++]);
  group_.poll();  // lets the sums already started move on
}

void GradientReducer::start(Bucket& b) {
  for (size_t i : b.params) {
    float* dst = b.buffer.data() + offset_[i];
    const Tensor g = params_[i].grad();
    if (g.defined()) {
      const Tensor c = g.contiguous();
      std::memcpy(dst, c.data<float>(), (size_t)c.numel() * sizeof(float));
    } else {
      std::memset(dst, 0, (size_t)params_[i].numel() * sizeof(float));
    }
  }
  group_.start_sum(b.buffer.data(), (int64_t)b.buffer.size());
}

void GradientReducer::finish() {
  while (next_ < buckets_.size()) start(buckets_[next_++]);
  const auto t0 = std::chrono::steady_clock::now();
  group_.wait_all();
  waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < params_.size(); ++i) {
    // Into the gradient's own buffer (backward leaves it owned and
    // contiguous), or a new one for a parameter no node reached here.
    Tensor g = params_[i].grad();
    if (!g.defined() || !g.is_contiguous()) {
      g = Tensor::empty(params_[i].shape());
      params_[i].set_grad(g);
    }
    std::memcpy(g.data<float>(), buckets_[bucket_of_[i]].buffer.data() + offset_[i], (size_t)g.numel() * sizeof(float));
  }
  for (Bucket& b : buckets_) b.pending = b.params.size();
  next_ = 0;
}

}  // namespace qkv
