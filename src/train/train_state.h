// Internal: the parts of a training checkpoint every trainer shares: the
// weights ("model.*"), the AdamW moments and step ("optimizer.*"), and every
// random stream of the model ("rng.model.*"), as safetensors tensors.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "qkv/io.h"
#include "qkv/nn.h"
#include "qkv/optim.h"
#include "src/train/gradient_reducer.h"

namespace qkv {

// An RNG's state as I64 [2] (seed, counter), and back.
inline Tensor rng_tensor(const Rng& rng) {
  Tensor t = Tensor::empty({2}, DType::I64);
  const uint64_t v[2] = {rng.seed_state(), rng.counter()};
  std::memcpy(t.data<int64_t>(), v, 16);
  return t;
}

inline void restore_rng(Rng& rng, const Tensor& t) {
  uint64_t v[2];
  std::memcpy(v, t.contiguous().data<int64_t>(), 16);
  rng.restore(v[0], v[1]);
}

inline void append_training_state(std::vector<std::pair<std::string, Tensor>>& t, Module& model, const AdamW& opt) {
  for (auto& [name, p] : model.named_parameters()) t.emplace_back("model." + name, p.detach());
  for (auto& [name, v] : opt.state()) t.emplace_back("optimizer." + name, v);
  t.emplace_back("optimizer.steps", Tensor::from_ints({opt.steps()}, {1}));
  for (auto& [name, r] : model.named_rngs()) t.emplace_back("rng.model." + name, rng_tensor(*r));
}

// The tensor `name` of a checkpoint, or an error saying the resume cannot go on.
inline const Tensor& checkpoint_tensor(const SafetensorsFile& f, const std::string& path, const std::string& name) {
  const Tensor* t = f.find(name);
  QKV_CHECK(t != nullptr, path, ": '", name, "' is missing; cannot resume");
  return *t;
}

inline void restore_training_state(const SafetensorsFile& f, const std::string& path, Module& model, AdamW& opt) {
  StateDict weights, moments;
  for (auto& [name, t] : f.tensors) {
    if (name.rfind("model.", 0) == 0) weights[name.substr(6)] = t;
    if (name.rfind("optimizer.exp_avg", 0) == 0) moments[name.substr(10)] = t;
  }
  try {
    model.load_state_dict(weights);
    opt.load_state(moments, checkpoint_tensor(f, path, "optimizer.steps").to_ints()[0]);
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
  for (auto& [name, r] : model.named_rngs()) restore_rng(*r, checkpoint_tensor(f, path, "rng.model." + name));
}

// The non-finite guard every trainer shares: backward, clip, and an AdamW
// step only when the loss and the gradient norm are finite; a skipped step
// leaves parameters and optimizer state untouched. Too many skips in a row
// stop training with an error naming the folder that holds the last good
// checkpoint. Returns whether the step was taken.
struct SkipCounter {
  int64_t total = 0, in_a_row = 0, max_in_a_row = 20;
};

//
// With a reducer (data parallelism), backward hands it each gradient as it
// is final and the gradients are then the sums over every process; the loss
// value is already the global one, so every process decides alike. An
// undefined loss (an empty shard) adds nothing but still joins the sums.
inline bool step_if_finite(const Tensor& loss, float loss_value, Module& model, AdamW& opt, float clip_norm,
                           SkipCounter& skips, int64_t step, const std::string& out_dir,
                           GradientReducer* reducer = nullptr) {
  bool finite = std::isfinite(loss_value);
  if (finite) {
    if (!reducer) {
      loss.backward();
    } else {
      if (loss.defined()) loss.backward(Tensor(), [reducer](const Tensor& leaf) { reducer->ready(leaf); });
      reducer->finish();
    }
    finite = std::isfinite(clip_grad_norm(model.parameters(), clip_norm));
  }
  if (!finite) {
    ++skips.total;
    QKV_CHECK(++skips.in_a_row <= skips.max_in_a_row, "train: ", skips.in_a_row,
              " steps in a row had a non-finite loss or gradient (step ", step,
              "); stopping. The last good checkpoint is in ", out_dir);
    return false;
  }
  skips.in_a_row = 0;
  opt.step();
  return true;
}

// Writes a trainer state file: the shared state, "step" and "skipped", any
// `extra` tensors, and `metadata` (with its "format").
inline void save_trainer_state(const std::string& path, Module& model, const AdamW& opt, int64_t step,
                               int64_t skipped, std::vector<std::pair<std::string, Tensor>> extra,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, Tensor>> t;
  append_training_state(t, model, opt);
  t.emplace_back("step", Tensor::from_ints({step}, {1}));
  t.emplace_back("skipped", Tensor::from_ints({skipped}, {1}));
  for (auto& e : extra) t.push_back(std::move(e));
  save_safetensors(path, t, metadata);
}

// A double as text that reads back exactly (for metadata).
inline std::string exact_text(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

}  // namespace qkv
