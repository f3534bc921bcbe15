#include <algorithm>
#include <bit>
#include <optional>
#include <cmath>
#include <set>
#include <type_traits>

#include "qkv/nn.h"

namespace qkv {

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  for (auto& [n, p] : params_) QKV_CHECK(n != name, "module: parameter '", name, "' registered twice");
  if (value.dtype() == DType::F32) value.set_requires_grad(true);  // one built in BF16 or F16 is for inference
  params_.emplace_back(name, value);
  return value;
}

void Module::remove_parameter(const std::string& name) {
  auto it = std::find_if(params_.begin(), params_.end(), [&](const auto& p) { return p.first == name; });
  QKV_CHECK(it != params_.end(), "module: no parameter '", name, "' to remove");
  params_.erase(it);
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
  QKV_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::I8,
            "convert_linear_weights: Linear weights are F32, BF16, F16 or I8, not ", dtype_name(dtype));
  int64_t converted = 0;
  if (auto* lin = dynamic_cast<Linear*>(this)) {
    lin->convert_weight(dtype);
    ++converted;
  }
  for (auto& [name, child] : children_) converted += child->convert_linear_weights(dtype);
  linear_weights_converted(dtype);
  return converted;
}

std::optional<DType> linear_dtype_named(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name == "f32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "f16") return DType::F16;
  if (name == "int8") return DType::I8;
  fail("dtype '", name, "': expected f32, bf16, f16 or int8");
}

int64_t Module::convert_linear_weights(const std::string& dtype) {
  const std::optional<DType> d = linear_dtype_named(dtype);
  return d ? convert_linear_weights(*d) : 0;
}

DType Module::linear_weight_dtype() const {
  if (auto* lin = dynamic_cast<const Linear*>(this))
    if (lin->weight.dtype() != DType::F32) return lin->weight.dtype();
  for (auto& [name, child] : children_) {
    const DType d = child->linear_weight_dtype();
    if (d != DType::F32) return d;
  }
  return DType::F32;
}

void Module::adopt_linear_dtypes(const StateDict& state) { adopt_linear_dtypes("", state); }

void Module::adopt_linear_dtypes(const std::string& prefix, const StateDict& state) {
  if (auto* lin = dynamic_cast<Linear*>(this)) {
    auto it = state.find(prefix + "weight");
    if (it != state.end() && it->second.dtype() == DType::I8) {
      auto scale = state.find(prefix + "weight_scale");
      QKV_CHECK(scale != state.end(), "load_state_dict: the int8 weight '", prefix, "weight' has no '", prefix,
                "weight_scale'");
      check_int8_weight({it->second, scale->second}, "load_state_dict: '" + prefix + "weight'");
    }
    // A weight built without values (on the meta device) takes the file's dtype whatever it is.
    const DType dtype = it != state.end() ? it->second.dtype() : DType::F32;
    if (it != state.end() && (dtype != DType::F32 || lin->weight.device() == Device::Meta))
      lin->expect_weight(dtype,
                         dtype == DType::I8 ? state.at(prefix + "weight_scale").shape() : std::vector<int64_t>{});
  }
  for (auto& [name, child] : children_) child->adopt_linear_dtypes(prefix + name + ".", state);
}

Linear* Module::linear_of(const std::string& weight_name) {
  if (weight_name == "weight") return dynamic_cast<Linear*>(this);
  for (auto& [name, child] : children_)
    if (weight_name.size() > name.size() + 1 && weight_name.compare(0, name.size(), name) == 0 &&
        weight_name[name.size()] == '.')
      if (Linear* found = child->linear_of(weight_name.substr(name.size() + 1))) return found;
  return nullptr;
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
  unpacked_weights("", out);
  return out;
}

void Module::unpacked_weights(const std::string& prefix, StateDict& out) const {
  if (auto* lin = dynamic_cast<const Linear*>(this))
    if (lin->held_packed_only())
      out[prefix + "weight"] = unpack_bf16_weight(lin->weight_packed, lin->weight.size(0), lin->weight.size(1));
  for (auto& [name, child] : children_) child->unpacked_weights(prefix + name + ".", out);
}

void Module::unpack_linear_weights() {
  if (auto* lin = dynamic_cast<Linear*>(this)) lin->unpack_weight();
  for (auto& [name, child] : children_) child->unpack_linear_weights();
}

namespace {

// load_state_dict's checks of one tensor for its parameter.
void check_loadable(const std::string& name, const Tensor& p, const Tensor& t) {
  QKV_CHECK(t.shape() == p.shape(), "load_state_dict: tensor '", name, "' has shape ", shape_str(t.shape()),
            ", model expects ", shape_str(p.shape()));
  QKV_CHECK((t.dtype() == DType::I8) == (p.dtype() == DType::I8), "load_state_dict: tensor '", name, "' is ",
            dtype_name(t.dtype()), ", model expects ", dtype_name(p.dtype()),
            " (an int8 Linear weight loads into a model that adopt_linear_dtypes prepared)");
}

// The largest of v's n values with the sign bit cleared, up to `inf` (the
// NaNs above it passed over), compared as signed integers (every value fits
// once its sign bit is cleared), which SSE2 compares in vectors. (Written as
// 16 running maxima without `omp simd`, GCC kept the loop scalar: a third of
// loading a bfloat16 model in float16.)
template <class Bits>
Bits largest_bits(const Bits* v, int64_t n, Bits inf) {
  using Signed = std::make_signed_t<Bits>;
  const Bits no_sign = (Bits)((Bits)~Bits{0} >> 1);
  Signed largest = 0;
#pragma omp simd reduction(max : largest)
  for (int64_t i = 0; i < n; ++i) {
    const Signed m = (Signed)(v[i] & no_sign);
    largest = std::max(largest, m <= (Signed)inf ? m : Signed{0});
  }
  return (Bits)largest;
}

// The largest magnitude in `t`, a float tensor; NaNs passed over. A float's
// magnitude orders as its bits without the sign, so a 16-bit tensor is
// scanned as it lies (a float32 copy of it and one chain of std::max were
// an eighth of loading a bfloat16 model in float16).
float largest_magnitude(const Tensor& t) {
  const Tensor c = t.contiguous();
  const int64_t n = c.numel();
  if (c.dtype() == DType::F32)
    return std::bit_cast<float>(largest_bits(static_cast<const uint32_t*>(c.raw_data()), n, 0x7f800000u));
  QKV_CHECK(c.dtype() == DType::BF16 || c.dtype() == DType::F16, "largest_magnitude: ", dtype_name(c.dtype()),
            " is not a float dtype");
  const uint16_t* v = static_cast<const uint16_t*>(c.raw_data());
  return c.dtype() == DType::BF16 ? bf16_to_float(largest_bits<uint16_t>(v, n, 0x7f80))
                                  : half_to_float(largest_bits<uint16_t>(v, n, 0x7c00));
}

constexpr float kFloat16Max = 65504.0f;

// A value past float16's range would become infinite: refused instead.
void check_fits_float16(const Tensor& t, const std::string& what) {
  const float largest = largest_magnitude(t);
  QKV_CHECK(!(largest > kFloat16Max), what, " holds a value of magnitude ", largest,
            ", which float16 cannot hold (largest finite value 65504); use bf16");
}

// Every check of a tensor for parameter `p` before anything is copied.
void check_tensor_for(const std::string& name, const Tensor& p, const Tensor& t) {
  check_loadable(name, p, t);
  if (p.dtype() == DType::F16 && t.dtype() != DType::F16)
    check_fits_float16(t, "load_state_dict: tensor '" + name + "'");
}

// `memory` as the parameter p's values from now on (p is the parameter's
// tensor, shared); p stays trainable if it was (set_ clears the flag).
void set_values(Tensor p, const Tensor& memory) {
  const bool requires_grad = p.requires_grad();
  p.set_(memory);
  if (requires_grad) p.set_requires_grad(true);
}

}  // namespace

void Module::load_state_dict(const StateDict& state) {
  // Everything is checked before a parameter changes: a refused state
  // leaves the model as it was.
  const auto params = named_parameters();
  std::set<std::string> used;
  for (auto& [name, p] : params) {
    auto it = state.find(name);
    QKV_CHECK(it != state.end(), "load_state_dict: parameter '", name, "' is missing");
    check_tensor_for(name, p, it->second);
    used.insert(name);
  }
  for (auto& [name, t] : state)
    QKV_CHECK(used.count(name), "load_state_dict: unexpected tensor '", name, "' (the model has no such parameter)");
  unpack_linear_weights();  // memory of their own for the values, which are packed again below
  for (auto& [name, p] : params) {
    if (p.device() == Device::Meta) {  // a weight without values yet (Linear::expect_weight)
      DefaultDeviceGuard cpu(Device::Cpu);
      set_values(p, Tensor::empty(p.shape(), p.dtype()));
    }
    p.detach().copy_(state.at(name));
  }
  pack_linear_weights();
}

void Module::pack_linear_weights() {
  if (auto* lin = dynamic_cast<Linear*>(this)) lin->pack_weight();
  for (auto& [name, child] : children_) child->pack_linear_weights();
}

StateLoader::StateLoader(Module& module) : module_(module) {
  for (auto& [name, p] : module.named_parameters()) params_.emplace(name, p);
}

void StateLoader::load(const std::string& name, Tensor t) {
  auto it = params_.find(name);
  QKV_CHECK(it != params_.end(), "load_state_dict: unexpected tensor '", name, "' (the model has no such parameter)");
  QKV_CHECK(loaded_.insert(name).second, "load_state_dict: tensor '", name, "' is given twice");
  Tensor& p = it->second;
  check_tensor_for(name, p, t);
  const bool sole_owner = t.impl_ptr().use_count() == 1 && t.impl().storage.use_count() == 1;
  const bool as_is = t.dtype() == p.dtype() && t.device() == Device::Cpu && t.is_contiguous() && !t.requires_grad();
  if ((sole_owner && as_is) || p.device() == Device::Meta) {
    Tensor memory = t;
    if (!as_is || !sole_owner) {  // converted, or copied: the parameter's memory is its own
      DefaultDeviceGuard cpu(Device::Cpu);
      memory = Tensor::empty(p.shape(), p.dtype());
      memory.copy_(t);
    }
    set_values(p, memory);
    return;
  }
  p.detach().copy_(t);
}

void StateLoader::finish() const {
  for (auto& [name, p] : params_) QKV_CHECK(loaded_.count(name), "load_state_dict: parameter '", name, "' is missing");
  module_.pack_linear_weights();
}

void xavier_uniform_(Tensor& w, Rng& rng) {
  QKV_CHECK(w.dim() == 2, "xavier_uniform_: expects a 2-d weight");
  float bound = std::sqrt(6.0f / (float)(w.size(0) + w.size(1)));
  Tensor values = Tensor::uniform(w.shape(), rng, -bound, bound);
  if (!skipping_init()) w.detach().copy_(values);
}

void uniform_fan_in_(Tensor& w, int64_t fan_in, Rng& rng) {
  float bound = fan_in > 0 ? 1.0f / std::sqrt((float)fan_in) : 0.0f;
  Tensor values = Tensor::uniform(w.shape(), rng, -bound, bound);
  if (!skipping_init()) w.detach().copy_(values);
}

void normal_(Tensor& w, Rng& rng, float stddev) {
  Tensor values = Tensor::randn(w.shape(), rng, stddev);
  if (!skipping_init()) w.detach().copy_(values);
}

Tensor Linear::forward(const Tensor& x) const {
  if (weight.dtype() == DType::I8) return linear_int8(x, {weight, weight_scale}, bias);
  if (weight.dtype() == DType::BF16) return linear_bf16(x, weight, weight_packed, bias);
  return linear(x, weight, bias);
}

Tensor Linear::forward(const Tensor& x, Activation activation) const {
  if (weight.dtype() == DType::I8) return linear_int8(x, {weight, weight_scale}, bias, &activation);
  if (weight.dtype() == DType::BF16) return linear_bf16(x, weight, weight_packed, bias, &activation);
  return linear(x, weight, bias, activation);
}

Tensor Linear::forward_add(const Tensor& x, const Tensor& residual) const {
  if (weight.dtype() == DType::F32) return linear_add(x, weight, bias, residual);
  return add(residual, forward(x));
}

void Linear::pack_weight() {
  if (held_packed_only()) return;  // packed already, the values gone
  weight_packed = Tensor();
  if (weight.dtype() == DType::BF16 && weight.dim() == 2 && weight.device() == Device::Cpu)
    weight_packed = pack_bf16_weight(weight);
  if (weight_packed.defined()) {  // the packed copy serves every product: the values' memory goes
    DefaultDeviceGuard meta(Device::Meta);
    weight.set_(Tensor::empty(weight.shape(), DType::BF16));
  }
}

void Linear::unpack_weight() {
  if (held_packed_only()) weight.set_(unpack_bf16_weight(weight_packed, weight.size(0), weight.size(1)));
}

void Linear::convert_weight(DType dtype) {
  QKV_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::I8,
            "Linear: a weight is F32, BF16, F16 or I8, not ", dtype_name(dtype));
  if (dtype == weight.dtype()) return;
  unpack_weight();
  weight_packed = Tensor();
  if (weight.dtype() == DType::I8) {  // back to float first
    weight.set_(dequantize_int8({weight, weight_scale}));
    remove_parameter("weight_scale");
    weight_scale = Tensor();
  }
  if (dtype == DType::F16) check_fits_float16(weight, "Linear: a weight");
  if (dtype != DType::I8) {
    weight.convert_(dtype);
    if (dtype == DType::F32) weight.set_requires_grad(true);  // a trainable parameter again, as built
    pack_weight();
    return;
  }
  Int8Weight q = quantize_int8(weight);
  weight.set_(q.values);
  weight_scale = register_parameter("weight_scale", q.scales);
  weight_scale.set_requires_grad(false);
}

void Linear::expect_weight(DType dtype, const std::vector<int64_t>& scale_shape) {
  QKV_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::I8,
            "Linear: a weight is F32, BF16, F16 or I8, not ", dtype_name(dtype));
  weight_packed = Tensor();  // made from the values when they have loaded (StateLoader::finish)
  DefaultDeviceGuard meta(Device::Meta);
  weight.set_(Tensor::empty(weight.shape(), dtype));
  if (dtype == DType::F32) weight.set_requires_grad(true);  // a trainable parameter, as built
  if (dtype != DType::I8) {
    if (weight_scale.defined()) remove_parameter("weight_scale");
    weight_scale = Tensor();
    return;
  }
  if (weight_scale.defined())
    weight_scale.set_(Tensor::empty(scale_shape, DType::F32));
  else
    weight_scale = register_parameter("weight_scale", Tensor::empty(scale_shape, DType::F32));
  weight_scale.set_requires_grad(false);
}

namespace {
thread_local std::optional<DType> t_linear_dtype;  // set by a LinearDTypeGuard
}  // namespace

LinearDTypeGuard::LinearDTypeGuard(DType dtype) : previous_(t_linear_dtype) {
  QKV_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
            "LinearDTypeGuard: Linear weights are built in F32, BF16 or F16, not ", dtype_name(dtype));
  QKV_CHECK(skipping_init(), "LinearDTypeGuard: only inside a SkipInitGuard (the weights load next)");
  t_linear_dtype = dtype;
}
LinearDTypeGuard::~LinearDTypeGuard() { t_linear_dtype = previous_; }

Linear::Linear(LinearOptions o, Rng& rng) {
  QKV_CHECK(o.in_features > 0 && o.out_features > 0, "Linear: in_features and out_features must be positive");
  {
    std::optional<DefaultDeviceGuard> meta;
    if (t_linear_dtype) meta.emplace(Device::Meta);
    weight = register_parameter("weight",
                                Tensor::empty({o.out_features, o.in_features}, t_linear_dtype.value_or(DType::F32)));
    uniform_fan_in_(weight, o.in_features, rng);  // without values under SkipInitGuard, but the same random stream
  }
  if (o.bias) {
    bias = register_parameter("bias", Tensor::empty({o.out_features}));
    uniform_fan_in_(bias, o.in_features, rng);
  }
}

Tensor TiedHead::forward(const Tensor& x, const Embedding& embedding) const {
  // x E^T as a linear layer with the embedding as its weight, so that it
  // takes the same GEMM (and, in mixed-precision training, bfloat16).
  return copy_ ? copy_->forward(x) : linear(x, embedding.weight);
}

void TiedHead::convert(const Embedding& embedding, DType dtype) {
  copy_.reset();
  if (dtype == DType::F32) return;
  Rng rng(0);
  SkipInitGuard uninitialized;  // the embedding is copied in next
  copy_ = std::make_shared<Linear>(LinearOptions{embedding.weight.size(1), embedding.weight.size(0), false}, rng);
  copy_->weight.detach().copy_(embedding.weight);
  copy_->convert_weight(dtype);
}

uint64_t TiedHead::bytes(const Embedding& embedding) const {
  return copy_ ? copy_->parameter_bytes() : embedding.parameter_bytes();
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

Tensor MLP::hidden(const Tensor& x) const {
  // Both weights BF16 (inference): the hidden layer is written in bfloat16,
  // the activation applied before its rounding, and fc2 reads it as it lies
  // (it would round a float32 one to the same values as it read it): half
  // the bytes of the widest activation, and no rounding pass.
  if (fc1->weight.dtype() == DType::BF16 && fc2->weight.dtype() == DType::BF16 && x.dtype() == DType::F32)
    return linear_bf16(x, fc1->weight, fc1->weight_packed, fc1->bias, &activation, DType::BF16);
  return fc1->forward(x, activation);
}

Tensor MLP::forward(const Tensor& x) const { return fc2->forward(hidden(x)); }

Tensor MLP::forward_add(const Tensor& x, const Tensor& residual) const { return fc2->forward_add(hidden(x), residual); }

}  // namespace qkv
