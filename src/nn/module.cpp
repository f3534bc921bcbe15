#include <cmath>
#include <set>

#include "qkv/nn.h"

namespace qkv {

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  for (auto& [n, p] : params_) QKV_CHECK(n != name, "module: parameter '", name, "' registered twice");
  value.set_requires_grad(true);
  params_.emplace_back(name, value);
  return value;
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>* out) const {
  for (auto& [name, p] : params_) out->emplace_back(prefix + name, p);
  for (auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", &out);
  return out;
}

int64_t Module::convert_linear_weights(DType dtype) {
  int64_t converted = 0;
  if (auto* lin = dynamic_cast<Linear*>(this)) {
    lin->weight.convert_(dtype);
    ++converted;
  }
  for (auto& [name, child] : children_) converted += child->convert_linear_weights(dtype);
  return converted;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (auto& [name, p] : named_parameters()) n += p.numel();
  return n;
}

uint64_t Module::parameter_bytes() const {
  uint64_t n = 0;
  for (auto& [name, p] : named_parameters()) n += (uint64_t)p.numel() * dtype_size(p.dtype());
  return n;
}

void Module::set_training(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->set_training(on);
}
void Module::train() { set_training(true); }
void Module::eval() { set_training(false); }

std::vector<std::pair<std::string, Rng*>> Module::named_rngs() {
  std::vector<std::pair<std::string, Rng*>> out = rngs_;
  for (auto& [name, child] : children_)
    for (auto& [n, r] : child->named_rngs()) out.emplace_back(name + "." + n, r);
  return out;
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [name, p] : named_parameters()) out[name] = p.detach();
  return out;
}

void Module::load_state_dict(const StateDict& state) {
  std::set<std::string> used;
  for (auto& [name, p] : named_parameters()) {
    auto it = state.find(name);
    QKV_CHECK(it != state.end(), "load_state_dict: parameter '", name, "' is missing");
    QKV_CHECK(it->second.shape() == p.shape(), "load_state_dict: tensor '", name, "' has shape ",
              shape_str(it->second.shape()), ", model expects ", shape_str(p.shape()));
    Tensor dst = p.detach();
    dst.copy_(it->second);
    used.insert(name);
  }
  for (auto& [name, t] : state)
    QKV_CHECK(used.count(name), "load_state_dict: unexpected tensor '", name, "' (the model has no such parameter)");
}

void xavier_uniform_(Tensor& w, Rng& rng) {
  QKV_CHECK(w.dim() == 2, "xavier_uniform_: expects a 2-d weight");
  float bound = std::sqrt(6.0f / (float)(w.size(0) + w.size(1)));
  w.detach().copy_(Tensor::uniform(w.shape(), rng, -bound, bound));
}

void uniform_fan_in_(Tensor& w, int64_t fan_in, Rng& rng) {
  float bound = fan_in > 0 ? 1.0f / std::sqrt((float)fan_in) : 0.0f;
  w.detach().copy_(Tensor::uniform(w.shape(), rng, -bound, bound));
}

void normal_(Tensor& w, Rng& rng, float stddev) { w.detach().copy_(Tensor::randn(w.shape(), rng, stddev)); }

Linear::Linear(LinearOptions o, Rng& rng) {
  QKV_CHECK(o.in_features > 0 && o.out_features > 0, "Linear: in_features and out_features must be positive");
  weight = register_parameter("weight", Tensor::empty({o.out_features, o.in_features}));
  uniform_fan_in_(weight, o.in_features, rng);
  if (o.bias) {
    bias = register_parameter("bias", Tensor::empty({o.out_features}));
    uniform_fan_in_(bias, o.in_features, rng);
  }
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Rng& rng) {
  weight = register_parameter("weight", Tensor::randn({num_embeddings, embedding_dim}, rng));
}

LayerNorm::LayerNorm(int64_t dim, float eps) : eps(eps) {
  weight = register_parameter("weight", Tensor::ones({dim}));
  bias = register_parameter("bias", Tensor::zeros({dim}));
}

RMSNorm::RMSNorm(int64_t dim, float eps) : eps(eps) { weight = register_parameter("weight", Tensor::ones({dim})); }

GRUCell::GRUCell(int64_t input_size, int64_t hidden_size, Rng& rng) : hidden_(hidden_size) {
  QKV_CHECK(input_size > 0 && hidden_size > 0, "GRUCell: sizes must be positive");
  weight_ih = register_parameter("weight_ih", Tensor::empty({3 * hidden_size, input_size}));
  weight_hh = register_parameter("weight_hh", Tensor::empty({3 * hidden_size, hidden_size}));
  bias_ih = register_parameter("bias_ih", Tensor::empty({3 * hidden_size}));
  bias_hh = register_parameter("bias_hh", Tensor::empty({3 * hidden_size}));
  for (Tensor* p : {&weight_ih, &weight_hh, &bias_ih, &bias_hh}) uniform_fan_in_(*p, hidden_size, rng);  // as torch
}

Tensor GRUCell::step(const Tensor& gi, const Tensor& h) const {
  Tensor gh = linear(h, weight_hh, bias_hh);
  const int64_t H = hidden_;
  std::vector<Tensor> i = split(gi, {H, H, H}, -1), g = split(gh, {H, H, H}, -1);
  Tensor r = sigmoid(add(i[0], g[0]));
  Tensor z = sigmoid(add(i[1], g[1]));
  Tensor n = tanh(add(i[2], mul(r, g[2])));
  return add(n, mul(z, sub(h, n)));  // (1 - z) n + z h
}

Tensor activate(const Tensor& x, Activation activation) {
  switch (activation) {
    case Activation::Relu: return relu(x);
    case Activation::Gelu: return gelu(x);
    case Activation::GeluTanh: return gelu(x, GeluApproximation::Tanh);
    case Activation::Silu: return silu(x);
    case Activation::Tanh: return tanh(x);
  }
  return x;
}

MLP::MLP(MLPOptions o, Rng& rng) : activation(o.activation) {
  fc1 = register_module("fc1", std::make_shared<Linear>(LinearOptions{o.in_features, o.hidden_features}, rng));
  fc2 = register_module("fc2", std::make_shared<Linear>(LinearOptions{o.hidden_features, o.out_features}, rng));
}

}  // namespace qkv
