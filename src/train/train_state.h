// Internal: the parts of a training checkpoint every trainer shares: the
// weights ("model.*"), the AdamW moments and step ("optimizer.*"), and every
// random stream of the model ("rng.model.*"), as safetensors tensors.
#pragma once

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "qkv/io.h"
#include "qkv/nn.h"
#include "qkv/optim.h"

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

}  // namespace qkv
