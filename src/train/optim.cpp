#include "qkv/optim.h"

#include <cmath>

#include "src/kernels/kernels.h"

namespace qkv {
namespace {

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
  std::vector<int64_t> sizes;
  const std::vector<Tensor> grads = contiguous_grads(params_, &sizes);
  std::vector<ParamSpan> spans;
  for (size_t i = 0; i < params_.size(); ++i)
    if (grads[i].defined())
      spans.push_back({.p = params_[i].data<float>(), .grad = grads[i].data<float>(),
                       .m = velocity_[i].data<float>(), .n = sizes[i]});
  kernels_for(Device::Cpu).sgd_step({.lr = options_.lr, .momentum = options_.momentum,
                                     .weight_decay = options_.weight_decay}, spans);
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
  std::vector<ParamSpan> spans;
  for (size_t i = 0; i < params_.size(); ++i)
    if (sizes[i] > 0)
      spans.push_back({.p = params_[i].data<float>(), .grad = grads[i].data<float>(), .m = exp_avg_[i].data<float>(),
                       .v = exp_avg_sq_[i].data<float>(), .n = sizes[i]});
  kernels_for(Device::Cpu).adamw_step(
      {.beta1 = b1, .beta2 = b2, .eps = eps, .step_size = step_size, .bc2_sqrt = bc2_sqrt, .decay = decay}, spans);
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
  std::vector<FloatSpan> spans;
  for (size_t i = 0; i < grads.size(); ++i)
    if (sizes[i] > 0) spans.push_back({grads[i].data<float>(), sizes[i]});
  const Kernels& k = kernels_for(Device::Cpu);
  const float norm = (float)std::sqrt(k.sum_of_squares(spans));
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  k.scale_spans(spans, max_norm / (norm + 1e-6f));
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
