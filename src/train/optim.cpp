#include "qkv/optim.h"

#include <omp.h>

#include <cmath>

namespace qkv {
namespace {

// Runs f(i, begin, end, thread) on every tensor i's elements [0, sizes[i]) in
// one OpenMP region: each thread takes its share of every tensor, so no thread
// waits at a barrier between tensors (most of a model's tensors are too small
// to be worth a parallel region of their own). thread < omp_get_max_threads().
template <class F>
void for_each_share(const std::vector<int64_t>& sizes, F f) {
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  if (total < 65536 || omp_get_max_threads() == 1 || omp_in_parallel()) {
    for (size_t i = 0; i < sizes.size(); ++i) f(i, 0, sizes[i], 0);
    return;
  }
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    for (size_t i = 0; i < sizes.size(); ++i) f(i, sizes[i] * t / nt, sizes[i] * (t + 1) / nt, t);
  }
}

// The parameters' gradients, contiguous (undefined where a parameter has none).
std::vector<Tensor> contiguous_grads(const std::vector<Tensor>& params, std::vector<int64_t>* sizes) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    grads.push_back(g.defined() ? g.contiguous() : g);
    sizes->push_back(g.defined() ? g.numel() : 0);
  }
  return grads;
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : params_(std::move(params)), options_(options) {
  for (const Tensor& p : params_) velocity_.push_back(Tensor::zeros(p.shape()));
}

void SGD::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

void SGD::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    Tensor gc = g.contiguous();
    float* p = params_[i].data<float>();
    float* v = velocity_[i].data<float>();
    const float* d = gc.data<float>();
    const int64_t n = params_[i].numel();
    for (int64_t j = 0; j < n; ++j) {
      float grad = d[j] + options_.weight_decay * p[j];
      v[j] = options_.momentum * v[j] + grad;
      p[j] -= options_.lr * (options_.momentum != 0.0f ? v[j] : grad);
    }
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options) : params_(std::move(params)), options_(options) {
  for (const Tensor& p : params_) {
    QKV_CHECK(p.is_contiguous(), "AdamW: parameters must be contiguous");
    exp_avg_.push_back(Tensor::zeros(p.shape()));
    exp_avg_sq_.push_back(Tensor::zeros(p.shape()));
  }
}

void AdamW::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

void AdamW::step() {
  ++step_;
  const float b1 = options_.beta1, b2 = options_.beta2, lr = options_.lr, eps = options_.eps;
  const float bc1 = 1.0f - std::pow(b1, (float)step_);
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(b2, (float)step_));
  const float step_size = lr / bc1;
  const float decay = 1.0f - lr * options_.weight_decay;
  std::vector<int64_t> sizes;
  const std::vector<Tensor> grads = contiguous_grads(params_, &sizes);
  for_each_share(sizes, [&](size_t i, int64_t begin, int64_t end, int64_t) {
    if (begin == end) return;
    float* p = params_[i].data<float>();
    float* m = exp_avg_[i].data<float>();
    float* v = exp_avg_sq_[i].data<float>();
    const float* d = grads[i].data<float>();
    for (int64_t j = begin; j < end; ++j) {
      p[j] *= decay;
      m[j] = b1 * m[j] + (1.0f - b1) * d[j];
      v[j] = b2 * v[j] + (1.0f - b2) * d[j] * d[j];
      p[j] -= step_size * m[j] / (std::sqrt(v[j]) / bc2_sqrt + eps);
    }
  });
}

StateDict AdamW::state() const {
  StateDict s;
  for (size_t i = 0; i < params_.size(); ++i) {
    s["exp_avg." + std::to_string(i)] = exp_avg_[i];
    s["exp_avg_sq." + std::to_string(i)] = exp_avg_sq_[i];
  }
  return s;
}

void AdamW::load_state(const StateDict& state, int64_t step) {
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto* buffers : {&exp_avg_, &exp_avg_sq_}) {
      std::string name = (buffers == &exp_avg_ ? "exp_avg." : "exp_avg_sq.") + std::to_string(i);
      auto it = state.find(name);
      QKV_CHECK(it != state.end(), "AdamW state: '", name, "' is missing");
      QKV_CHECK(it->second.shape() == (*buffers)[i].shape(), "AdamW state: '", name, "' has shape ",
                shape_str(it->second.shape()), ", expected ", shape_str((*buffers)[i].shape()));
      (*buffers)[i].copy_(it->second);
    }
  }
  step_ = step;
}

float clip_grad_norm(const std::vector<Tensor>& params, float max_norm) {
  std::vector<int64_t> sizes;
  const std::vector<Tensor> grads = contiguous_grads(params, &sizes);
  std::vector<double> partial(omp_get_max_threads(), 0.0);  // per thread, added in thread order: the same total every run
  for_each_share(sizes, [&](size_t i, int64_t begin, int64_t end, int64_t thread) {
    const float* d = grads[i].defined() ? grads[i].data<float>() : nullptr;
    double s = 0;
    for (int64_t j = begin; j < end; ++j) s += (double)d[j] * d[j];
    partial[thread] += s;
  });
  double total = 0;
  for (double s : partial) total += s;
  float norm = (float)std::sqrt(total);
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  const float scale = max_norm / (norm + 1e-6f);
  for_each_share(sizes, [&](size_t i, int64_t begin, int64_t end, int64_t) {
    float* d = grads[i].defined() ? grads[i].data<float>() : nullptr;
    for (int64_t j = begin; j < end; ++j) d[j] *= scale;
  });
  for (size_t i = 0; i < params.size(); ++i)  // a gradient set from a view: replace it
    if (grads[i].defined() && !grads[i].same_storage(params[i].grad())) Tensor(params[i]).set_grad(grads[i]);
  return norm;
}

float WarmupInverseSqrt::lr_at(int64_t step) const {
  if (step < 1) step = 1;
  float s = (float)step, w = (float)std::max<int64_t>(warmup_steps, 1);
  return peak_lr * std::min(s / w, std::sqrt(w / s));
}

float WarmupCosine::lr_at(int64_t step) const {
  if (step < 1) step = 1;
  if (step <= warmup_steps) return peak_lr * (float)step / (float)warmup_steps;
  int64_t span = std::max<int64_t>(total_steps - warmup_steps, 1);
  float progress = std::min(1.0f, (float)(step - warmup_steps) / (float)span);
  return min_lr + 0.5f * (peak_lr - min_lr) * (1.0f + std::cos((float)M_PI * progress));
}

}  // namespace qkv
