// qkv/optim.h — optimizers, learning-rate schedules, gradient clipping.
#pragma once

#include <string>
#include <vector>

#include "qkv/nn.h"
#include "qkv/tensor.h"

namespace qkv {

// How a training run ended: at its last step, or before it (early stopping,
// or a caller that had what it wanted), and why.
struct TrainOutcome {
  int64_t last_step = 0;
  std::string stopped_early;  // empty when every step ran
  // Across processes (qkv/process_group.h): the seconds of the steps, and of
  // those the seconds this process waited for the sums of the others (the
  // gradients after backward, and each step's loss and token count).
  double step_seconds = 0, wait_seconds = 0;
};

struct SGDOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;  // L2, added to the gradient (as torch.optim.SGD)
};

// v = momentum v + (g + wd p);  p -= lr v   (torch.optim.SGD with dampening 0)
class SGD {
public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  void step();
  void zero_grad();
  void set_lr(float lr) { options_.lr = lr; }
  float lr() const { return options_.lr; }

private:
  std::vector<Tensor> params_;
  std::vector<Tensor> velocity_;
  SGDOptions options_;
};

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// Loshchilov & Hutter, decoupled weight decay (as torch.optim.AdamW):
//   p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// Parameters without a gradient are skipped.
class AdamW {
public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  void step();
  void zero_grad();
  void set_lr(float lr) { options_.lr = lr; }
  float lr() const { return options_.lr; }
  int64_t steps() const { return step_; }

  // The moments and step count, named "exp_avg.<i>", "exp_avg_sq.<i>", for
  // checkpoints; load_state expects the same names and shapes.
  StateDict state() const;
  void load_state(const StateDict& state, int64_t step);

private:
  std::vector<Tensor> params_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

// Scales all gradients so that their global L2 norm is at most max_norm.
// Returns the norm before clipping (inf or nan when a gradient is not finite;
// then nothing is scaled).
float clip_grad_norm(const std::vector<Tensor>& params, float max_norm);

// lr = peak * min(step / warmup, sqrt(warmup / step)) (Vaswani et al. 2017, as fairseq).
struct WarmupInverseSqrt {
  float peak_lr = 1e-3f;
  int64_t warmup_steps = 1000;
  float lr_at(int64_t step) const;  // step counts from 1
};

// Linear warmup to peak, then half a cosine down to min_lr at total_steps.
struct WarmupCosine {
  float peak_lr = 1e-3f;
  float min_lr = 0.0f;
  int64_t warmup_steps = 1000;
  int64_t total_steps = 10000;
  float lr_at(int64_t step) const;  // step counts from 1
};

}  // namespace qkv
