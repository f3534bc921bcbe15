// qkv/nn.h — modules: parameters with hierarchical names, train/eval mode,
// state dicts, and the basic layers (Linear, Embedding, LayerNorm, RMSNorm,
// Dropout, MLP).
//
// A model is a tree of Modules. Parameter names join the child names with
// dots, as in PyTorch: "encoder.layers.0.self_attn.q_proj.weight". A state
// dict is the flat name -> tensor map that checkpoints store.
#pragma once

#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qkv/device.h"
#include "qkv/ops.h"
#include "qkv/rng.h"
#include "qkv/tensor.h"

namespace qkv {

using StateDict = std::map<std::string, Tensor>;

// A Linear weight dtype by the name the commands take (--dtype): "f32",
// "bf16", "f16" or "int8"; none for "" (as stored). Any other name is an error
// listing these.
std::optional<DType> linear_dtype_named(const std::string& name);

class Linear;

class Module {
public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of this module and its children, in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t parameter_count() const;
  uint64_t parameter_bytes() const;  // numel x dtype size, summed

  // Train mode turns dropout on; eval mode turns it off. Applies to children.
  void train();
  void eval();
  bool is_training() const { return training_; }

  // Every random stream of this module and its children (dropout), by
  // hierarchical name, for checkpoints that resume exactly.
  std::vector<std::pair<std::string, Rng*>> named_rngs();

  // For inference in low precision: the weight of every Linear here and in
  // the children converted in place to `dtype` (F32, BF16, or I8: blockwise
  // int8, Linear::convert_weight). Embeddings, norms and biases stay float32
  // (a module may keep a converted copy of one: linear_weights_converted).
  // Returns how many weights were converted. In BF16, F16 or I8 the module runs
  // only without gradients (linear refuses them); back in F32 the weights
  // are trainable parameters again.
  int64_t convert_linear_weights(DType dtype);
  // The same by the name the commands take (--dtype, linear_dtype_named);
  // "" converts nothing (the weights stay as loaded).
  int64_t convert_linear_weights(const std::string& dtype);
  // The dtype of the first Linear weight (in registration order) that is not
  // F32, else F32: what convert_linear_weights last made of the model.
  DType linear_weight_dtype() const;

  // Before loading a converted model's weights (StateLoader): each Linear
  // whose weight `state` holds in BF16, F16 or I8 (with its weight_scale,
  // checked) takes that dtype without values (Linear::expect_weight), so the
  // weights load as they are stored, with no float32 copy on the way.
  void adopt_linear_dtypes(const StateDict& state);
  // The Linear whose weight has the parameter name `weight_name` here
  // ("layers.0.attn.wq.weight"), or null when it is not a Linear weight.
  Linear* linear_of(const std::string& weight_name);

  StateDict state_dict() const;
  // Copies values into the existing parameters (so optimizers keep their
  // references). Every parameter must be present with its exact shape; a
  // name in `state` that the module does not have is an error too.
  void load_state_dict(const StateDict& state);
  // Remakes each BF16 Linear weight's packed copy (Linear::weight_packed)
  // from its values: after they are loaded (load_state_dict and
  // StateLoader::finish call it).
  void pack_linear_weights();
  // Gives each Linear weight held packed only its values back (Linear::unpack_weight).
  void unpack_linear_weights();

protected:
  // Called by convert_linear_weights on every module, after its own Linear
  // weights and its children's are converted: a module that keeps a copy of
  // another weight for low-precision inference (a decoder's head tied to
  // its embedding) makes it here, or drops it for F32.
  virtual void linear_weights_converted(DType dtype) { (void)dtype; }
  // state_dict's values of the Linear weights held packed only, unpacked.
  void unpacked_weights(const std::string& prefix, StateDict& out) const;
  Tensor register_parameter(const std::string& name, Tensor value);
  void remove_parameter(const std::string& name);
  void register_rng(const std::string& name, Rng* rng) { rngs_.emplace_back(name, rng); }
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> child) {
    children_.emplace_back(name, child);
    return child;
  }

private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>* out) const;
  void adopt_linear_dtypes(const std::string& prefix, const StateDict& state);
  void set_training(bool on);
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<std::string, Rng*>> rngs_;
  bool training_ = true;
};

// Fills a module's parameters from tensors that arrive one at a time (a
// checkpoint read tensor by tensor, so that the whole file is never held),
// with load_state_dict's checks. A tensor of its parameter's dtype and shape,
// contiguous, whose memory nothing else holds becomes the parameter's memory
// (no copy; the parameter keeps its requires_grad); any other is copied in,
// converted to the parameter's dtype (a parameter on the meta device gets
// memory of its own for it). A value past float16's range headed for a
// float16 parameter is an error rather than an infinity.
class StateLoader {
public:
  explicit StateLoader(Module& module);
  // `name` must be a parameter not loaded before.
  void load(const std::string& name, Tensor t);
  // Every parameter was loaded, else an error naming the first that was
  // not; then the module's packed BF16 weights are made again.
  void finish() const;

private:
  Module& module_;
  std::map<std::string, Tensor> params_;
  std::set<std::string> loaded_;
};

// --- initializers (in place, not recorded) ---
// U(-bound, bound) with bound = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010).
void xavier_uniform_(Tensor& w, Rng& rng);
// PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void uniform_fan_in_(Tensor& w, int64_t fan_in, Rng& rng);
void normal_(Tensor& w, Rng& rng, float stddev);

// While one is alive on this thread, Linear builds its weight in `dtype`
// (F32, BF16 or F16) on the meta device: no memory, no values, and no
// gradient unless F32. Only inside a SkipInitGuard: for a model whose weights
// load next through a StateLoader (load_model_folder with a dtype), which
// gives each its memory. So a bfloat16 checkpoint run in bfloat16 never has
// a float32 copy of its Linear weights, nor memory set aside for one.
class LinearDTypeGuard {
public:
  explicit LinearDTypeGuard(DType dtype);
  ~LinearDTypeGuard();
  LinearDTypeGuard(const LinearDTypeGuard&) = delete;
  LinearDTypeGuard& operator=(const LinearDTypeGuard&) = delete;
private:
  std::optional<DType> previous_;
};

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
};
// y = x W^T + b; weight [out, in], bias [out]. For inference the weight may
// be BF16, or I8 with its scales in weight_scale [out, ceil(in / 32)]
// (blockwise int8, qkv::Int8Weight), a parameter only while the weight is I8.
// A BF16 weight also gets weight_packed (pack_bf16_weight: the layout of the
// AMX and AVX512-BF16 tiles, made once instead of on every product; not a
// parameter) when it is converted to BF16 or loaded
// (Module::pack_linear_weights), where the CPU reads one and memory allows.
// The packed copy then serves every product, and `weight` keeps only its
// shape (the meta device) so that the model holds each weight once;
// state_dict() and convert_weight() unpack it, the same bits.
class Linear : public Module {
public:
  Linear(LinearOptions options, Rng& rng);
  Tensor forward(const Tensor& x) const;
  // act(x W^T + b), the activation applied by the GEMM (qkv::linear).
  Tensor forward(const Tensor& x, Activation activation) const;
  // residual + x W^T + b, the residual added by the GEMM where the weight is
  // float32 (qkv::linear_add), else after the product: a block's skip connection.
  Tensor forward_add(const Tensor& x, const Tensor& residual) const;
  // The weight converted in place to F32, BF16 or I8 (I8 quantizes it and
  // adds weight_scale; leaving I8 dequantizes it and removes weight_scale).
  void convert_weight(DType dtype);
  // The weight (and for I8 a weight_scale of `scale_shape`) in `dtype`
  // without values, on the meta device, for values that load next: a
  // StateLoader hands it the loaded tensors' memory.
  void expect_weight(DType dtype, const std::vector<int64_t>& scale_shape = {});
  Tensor weight, bias, weight_scale;
  Tensor weight_packed;  // with a BF16 weight, where the CPU's gemm_bf16 reads one
  // weight_packed made (again) from the weight's values, or dropped when the weight is not BF16.
  void pack_weight();
  // The weight's values in memory of their own again, when only the packed copy held them.
  void unpack_weight();
  // Whether the packed copy alone holds the values (`weight` is on the meta device).
  bool held_packed_only() const { return weight.device() == Device::Meta && weight_packed.defined(); }
};

// weight [V, D], initialized N(0, 1) as torch.nn.Embedding.
class Embedding : public Module {
public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Rng& rng);
  Tensor forward(const Tensor& ids) const { return embedding(weight, ids); }
  Tensor weight;
};

// The output projection of a model whose head is tied to its embedding E:
// logits = x E^T. For low-precision inference, convert() makes a copy of E
// in BF16 or I8 (a Linear weight; llama.cpp does the same), which forward
// then uses; F32 drops it. Not a parameter: a folder keeps the one
// embedding, and converting after loading makes the copy again.
class TiedHead {
public:
  Tensor forward(const Tensor& x, const Embedding& embedding) const;
  void convert(const Embedding& embedding, DType dtype);
  // The bytes the head reads per step: the copy's, else the embedding's.
  uint64_t bytes(const Embedding& embedding) const;

private:
  std::shared_ptr<Linear> copy_;
};

class LayerNorm : public Module {
public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);
  Tensor forward(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }
  Tensor weight, bias;
  float eps;
};

class RMSNorm : public Module {
public:
  explicit RMSNorm(int64_t dim, float eps = 1e-6f);
  Tensor forward(const Tensor& x) const { return rms_norm(x, weight, eps); }
  Tensor weight;
  float eps;
};

// Holds its own RNG stream so that runs are reproducible from the seed.
class Dropout : public Module {
public:
  Dropout(float p, uint64_t seed) : p(p), rng(seed) { register_rng("rng", &rng); }
  Tensor forward(const Tensor& x) { return dropout(x, rng, {.p = p, .training = is_training()}); }
  // forward(x) is x itself (evaluation, or p 0): a residual may then be added
  // by the product before it (Linear::forward_add).
  bool passes_through() const { return !is_training() || p == 0.0f; }
  float p;
  Rng rng;
};

// A GRU cell (Cho et al. 2014), as torch.nn.GRUCell:
//   r = sigmoid(W_ir x + b_ir + W_hr h + b_hr),  z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
//   n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),  h' = (1 - z) * n + z * h
// weight_ih [3H, in], weight_hh [3H, H] (rows r, z, n), bias_ih, bias_hh [3H].
class GRUCell : public Module {
public:
  GRUCell(int64_t input_size, int64_t hidden_size, Rng& rng);
  Tensor forward(const Tensor& x, const Tensor& h) const { return step(input_gates(x), h); }
  // W_i x + b_i for all inputs at once (x [..., in] -> [..., 3H]), so a
  // sequence's input projections are one matmul before the time loop.
  Tensor input_gates(const Tensor& x) const { return linear(x, weight_ih, bias_ih); }
  // One step from precomputed input gates gi [B, 3H] and the state h [B, H].
  Tensor step(const Tensor& gi, const Tensor& h) const;
  int64_t hidden_size() const { return hidden_; }
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;

private:
  int64_t hidden_;
};

Tensor activate(const Tensor& x, Activation activation);

struct MLPOptions {
  int64_t in_features = 0;
  int64_t hidden_features = 0;
  int64_t out_features = 0;
  Activation activation = Activation::Relu;
};
// fc2(act(fc1(x))): expand, nonlinearity, contract.
class MLP : public Module {
public:
  MLP(MLPOptions options, Rng& rng);
  // With both weights BF16, the hidden layer is a BF16 tensor (module.cpp).
  Tensor forward(const Tensor& x) const;
  // residual + forward(x), fc2 adding the residual (Linear::forward_add).
  Tensor forward_add(const Tensor& x, const Tensor& residual) const;
  std::shared_ptr<Linear> fc1, fc2;
  Activation activation;

private:
  Tensor hidden(const Tensor& x) const;  // act(fc1(x)), what fc2 reads
};

}  // namespace qkv
