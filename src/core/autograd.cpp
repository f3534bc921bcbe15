// The tape: recording ops and running it backwards.
#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <unordered_set>

#include "qkv/tensor.h"
#include "src/kernels/kernels.h"

namespace qkv {
namespace {
thread_local bool t_grad_enabled = true;
thread_local bool t_reference_kernels = false;
std::atomic<uint64_t> g_sequence{0};
}  // namespace

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }

bool reference_kernels() { return t_reference_kernels; }
ReferenceKernelsGuard::ReferenceKernelsGuard() : previous_(t_reference_kernels) { t_reference_kernels = true; }
ReferenceKernelsGuard::~ReferenceKernelsGuard() { t_reference_kernels = previous_; }

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record_op(Tensor& out, const char* op_name, const std::vector<Tensor>& inputs, BackwardFn backward) {
  if (!any_requires_grad(inputs)) return;
  auto node = std::make_shared<Node>();
  node->sequence = g_sequence.fetch_add(1);
  node->op_name = op_name;
  for (const Tensor& t : inputs) node->inputs.push_back(t.defined() ? t.impl_ptr() : nullptr);
  node->backward = std::move(backward);
  out.impl().grad_fn = std::move(node);
  out.impl().requires_grad = true;
}

Tensor& Tensor::set_requires_grad(bool on) {
  QKV_CHECK(!on || dtype() == DType::F32, "set_requires_grad: only F32 tensors can have gradients");
  QKV_CHECK(is_leaf(), "set_requires_grad: only leaf tensors (not results of ops) can change it");
  impl().requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const { return impl().grad ? Tensor(impl().grad) : Tensor(); }
void Tensor::zero_grad() { impl().grad.reset(); }
void Tensor::set_grad(const Tensor& g) {
  QKV_CHECK(!g.defined() || g.shape() == shape(), "set_grad: gradient shape ", shape_str(g.shape()),
            " differs from tensor shape ", shape_str(shape()));
  impl().grad = g.defined() ? g.impl_ptr() : nullptr;
}

Tensor Tensor::detach() const {
  auto t = std::make_shared<TensorImpl>(impl());
  t->requires_grad = false;
  t->grad.reset();
  t->grad_fn.reset();
  return Tensor(t);
}

// Adds g into t's gradient. The first gradient becomes the tensor's own
// buffer: taken as it is when nothing else can reach it (its only handle,
// contiguous, filling its whole storage), otherwise copied, so that later
// in-place accumulation never writes into memory that another tensor (a view,
// or a gradient handed to several inputs) shares.
static void accumulate(TensorImpl& t, Tensor g) {
  QKV_CHECK(g.shape() == t.shape, "backward: gradient of shape ", shape_str(g.shape()), " for a tensor of shape ",
            shape_str(t.shape));
  if (!t.grad) {
    const std::shared_ptr<TensorImpl>& gi = g.impl_ptr();
    const bool sole_owner = gi.use_count() == 1 && gi->storage.use_count() == 1 && !gi->grad_fn && !gi->grad &&
                            gi->offset == 0 && gi->dtype == DType::F32 && g.is_contiguous() &&
                            gi->storage->nbytes == (size_t)g.numel() * sizeof(float);
    if (sole_owner) {
      gi->requires_grad = false;
      t.grad = gi;
      return;
    }
    Tensor owned = Tensor::empty(t.shape);
    owned.copy_(g);
    t.grad = owned.impl_ptr();
    return;
  }
  Tensor acc(t.grad);  // owned and contiguous, see above
  Tensor gc = g.contiguous();
  kernels_for(Device::Cpu).accumulate(acc.data<float>(), gc.data<float>(), acc.numel());
}

void Tensor::backward(const Tensor& grad_out) const { backward(grad_out, {}); }

void Tensor::backward(const Tensor& grad_out, const std::function<void(const Tensor& leaf)>& leaf_ready) const {
  QKV_CHECK(requires_grad(), "backward: tensor does not require grad (no input had requires_grad set)");
  Tensor seed = grad_out;
  if (!seed.defined()) {
    QKV_CHECK(numel() == 1, "backward: output of shape ", shape_str(shape()),
              " is not a scalar; pass the gradient explicitly");
    seed = Tensor::ones(shape());
  }
  NoGradGuard no_grad;  // backward functions compute with plain ops
  // Every tensor reachable through recorded nodes, newest node first. Strong
  // references: running a node releases its inputs, which may be their last owner.
  std::vector<std::shared_ptr<TensorImpl>> order;
  std::unordered_set<TensorImpl*> seen;
  std::vector<std::shared_ptr<TensorImpl>> stack{impl_};
  while (!stack.empty()) {
    std::shared_ptr<TensorImpl> t = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(t.get()).second || !t->grad_fn) continue;
    for (auto& in : t->grad_fn->inputs)
      if (in && in->requires_grad) stack.push_back(in);
    order.push_back(std::move(t));
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a->grad_fn->sequence > b->grad_fn->sequence;
  });
  // For leaf_ready: how many nodes still to run take each leaf as an input.
  std::unordered_map<TensorImpl*, int> pending;
  if (leaf_ready)
    for (const auto& t : order)
      for (const auto& in : t->grad_fn->inputs)
        if (in && in->requires_grad && !in->grad_fn) ++pending[in.get()];
  auto ran = [&](const Node& node) {
    if (!leaf_ready) return;
    for (const auto& in : node.inputs)
      if (auto it = pending.find(in.get()); it != pending.end() && --it->second == 0) leaf_ready(Tensor(in));
  };
  accumulate(impl(), seed);
  for (std::shared_ptr<TensorImpl>& t : order) {
    std::shared_ptr<Node> node = std::move(t->grad_fn);  // frees the graph as we go
    std::shared_ptr<TensorImpl> g = std::move(t->grad);
    if (!g) {
      ran(*node);
      continue;
    }
    std::vector<bool> needs(node->inputs.size());
    for (size_t i = 0; i < needs.size(); ++i) needs[i] = node->inputs[i] && node->inputs[i]->requires_grad;
    std::vector<Tensor> grads = node->backward(BackwardArgs{Tensor(t), Tensor(g), needs});
    QKV_CHECK(grads.size() == needs.size(), "backward of ", node->op_name, " returned ", grads.size(),
              " gradients for ", needs.size(), " inputs");
    g.reset();  // a gradient passed straight through (as by add) can then be taken without a copy
    for (size_t i = 0; i < needs.size(); ++i)
      if (needs[i] && grads[i].defined()) accumulate(*node->inputs[i], std::move(grads[i]));
    ran(*node);
    t.reset();
  }
}

}  // namespace qkv
