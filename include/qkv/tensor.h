// qkv/tensor.h — Tensor: shape, strides, dtype, storage, and its autograd state.
//
// A Tensor is a cheap handle (shared pointer) to an n-dimensional, row-major
// view into a Storage buffer:
//   element [i0, i1, ...] lives at data + offset + sum_k i_k * strides[k]
// (offset and strides count elements, not bytes). Views (reshape of a
// contiguous tensor, permute, transpose, slice) share storage and copy nothing.
//
// Autograd: every op run while grad mode is on and any input requires a
// gradient records a node (its backward function and its inputs) on the
// output, numbered in the order ops ran. `backward()` replays those nodes
// newest first -- the tape read backwards -- accumulating into `.grad()` of
// leaf tensors, and frees the graph. Inside a `NoGradGuard` nothing is
// recorded, so inference never pays for the tape.
//
// Tutorial:
//   qkv::Tensor w = qkv::Tensor::randn({3, 2}, rng).set_requires_grad(true);
//   qkv::Tensor x = qkv::Tensor::from_vector({1, 2, 3}, {1, 3});
//   qkv::Tensor loss = qkv::sum(qkv::matmul(x, w));   // ops in qkv/ops.h
//   loss.backward();                                   // w.grad() is [3,2]
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qkv/device.h"
#include "qkv/dtype.h"
#include "qkv/error.h"

namespace qkv {

using Shape = std::vector<int64_t>;
class Rng;
class Tensor;

std::string shape_str(const Shape& s);  // "[2,3,4]"
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

// A block of memory on a device: from the caching allocator (qkv/allocator.h)
// on the CPU; none at all on the meta device, where data stays null. A
// borrowed block is memory someone else owns (a NumPy array in the Python
// bindings): `release` runs, once, when the last tensor on it is gone.
struct Storage {
  Storage(size_t nbytes, Device device);
  Storage(void* borrowed, size_t nbytes, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data = nullptr;
  size_t nbytes = 0;
  Device device = Device::Cpu;
  std::function<void()> release;  // set for borrowed memory
};

struct TensorImpl;

// What a backward function receives: the op's output, the gradient flowing
// into it, and which inputs want a gradient (skip work for the others).
struct BackwardArgs {
  const Tensor& out;
  const Tensor& grad_out;
  const std::vector<bool>& needs_grad;
};
// Returns one gradient per input, each with that input's shape, or an
// undefined Tensor where the input needs none.
using BackwardFn = std::function<std::vector<Tensor>(const BackwardArgs&)>;

struct Node {
  uint64_t sequence = 0;  // position on the tape
  std::string op_name;
  std::vector<std::shared_ptr<TensorImpl>> inputs;
  BackwardFn backward;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::F32;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<Node> grad_fn;
};

class Tensor {
public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- construction (all contiguous, fresh storage on default_device(); on
  // the meta device the values given or drawn are not stored) ---
  static Tensor empty(const Shape& shape, DType dtype = DType::F32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32);
  static Tensor full(const Shape& shape, float value);
  static Tensor ones(const Shape& shape) { return full(shape, 1.0f); }
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);
  static Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape);  // I64
  static Tensor arange(int64_t n);                                                // F32 0..n-1
  static Tensor randn(const Shape& shape, Rng& rng, float stddev = 1.0f);
  static Tensor uniform(const Shape& shape, Rng& rng, float low, float high);
  static Tensor scalar(float value) { return from_vector({value}, {}); }
  // A view of memory qkv does not own: `strides` in elements (non-negative),
  // every element addressed within `nbytes` from `data`; `release` runs when
  // the last tensor on it is gone (Storage). Nothing is copied.
  static Tensor borrow(void* data, size_t nbytes, DType dtype, const Shape& shape, const Shape& strides,
                       std::function<void()> release);

  // --- layout ---
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  int64_t dim() const { return (int64_t)impl().shape.size(); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(impl().shape); }
  bool is_contiguous() const;
  bool same_storage(const Tensor& other) const { return impl().storage == other.impl().storage; }

  // Typed pointer to element [0, 0, ...]; checks the dtype, and that the
  // tensor has values (a meta tensor has none).
  template <class T>
  T* data() const;
  void* raw_data() const;

  // First element as float (any shape with one element).
  float item() const;
  // Elements in row-major order, converted to float.
  std::vector<float> to_vector() const;
  std::vector<int64_t> to_ints() const;  // I64/I32/U8 tensors

  // --- views: share storage, record autograd ---
  Tensor reshape(const Shape& shape) const;  // copies only when not viewable
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end) const;  // [start, end)
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor contiguous() const;  // self when already contiguous
  Tensor clone() const;       // fresh contiguous copy, differentiable

  // Element type conversion (not differentiable): F32 <-> F16/BF16/I64/I32/U8.
  Tensor to(DType dtype) const;
  // The same conversion in place: every handle to this tensor (a module's
  // member and its parameter list alike) then holds the converted values.
  // For a loaded model's weights turned to bfloat16 for inference: the tensor
  // must have no history, and needs no gradient afterwards. A view gets
  // memory of its own (its base keeps the old values).
  Tensor& convert_(DType dtype);
  // In place, like convert_: every handle to this tensor then holds
  // `source`'s values (its memory, dtype, shape and strides, shared). For a
  // weight replaced by another representation (int8 values for a float32
  // Linear weight); the same conditions as convert_.
  Tensor& set_(const Tensor& source);
  // Copy values from `src` (same shape, any layout) into this tensor's memory.
  // Not recorded on the tape: for loading weights and optimizer updates. Into a
  // meta tensor both only check the shape.
  void copy_(const Tensor& src);
  void fill_(float value);

  // --- autograd ---
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& set_requires_grad(bool on);
  Tensor grad() const;  // undefined until a backward reaches this tensor
  void zero_grad();     // drops the gradient
  void set_grad(const Tensor& g);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  Tensor detach() const;  // same storage, no history
  // Runs the tape backwards from this scalar (grad 1) or with `grad_out`.
  void backward(const Tensor& grad_out = Tensor()) const;
  // The same, calling `leaf_ready(leaf)` as soon as a leaf's gradient is
  // final (no node left to run adds to it): data-parallel training starts
  // summing a parameter's gradient across processes while backward goes on.
  void backward(const Tensor& grad_out, const std::function<void(const Tensor& leaf)>& leaf_ready) const;

  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

private:
  std::shared_ptr<TensorImpl> impl_;
};

// --- grad mode and kernel choice (both per thread) ---
bool grad_enabled();
class NoGradGuard {
public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;
private:
  bool previous_;
};

// While one is alive on this thread, Tensor::randn and Tensor::uniform (and
// so the initializers of nn.h) take their numbers from the Rng as always, so
// that its stream afterwards is the same, but leave the values unset. For
// building a model whose every parameter is loaded next (load_model_folder):
// drawing 100 M weights that are overwritten took a third of loading them.
bool skipping_init();
class SkipInitGuard {
public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;
private:
  bool previous_;
};

// Ops dispatch to the fast CPU kernels, or to the naive reference kernels
// inside a ReferenceKernelsGuard (the tests run both and compare).
bool reference_kernels();
class ReferenceKernelsGuard {
public:
  ReferenceKernelsGuard();
  ~ReferenceKernelsGuard();
  ReferenceKernelsGuard(const ReferenceKernelsGuard&) = delete;
  ReferenceKernelsGuard& operator=(const ReferenceKernelsGuard&) = delete;
private:
  bool previous_;
};

// For op implementations: true when grad mode is on and any input needs grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);
// For op implementations: records `out` as produced by `op_name` from `inputs`.
void record_op(Tensor& out, const char* op_name, const std::vector<Tensor>& inputs, BackwardFn backward);

template <class T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::I64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::I32; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::I8; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct DTypeOf<uint16_t> { static constexpr DType value = DType::BF16; };  // raw 16-bit

namespace detail {
[[noreturn]] void fail_no_values(const Shape& shape);  // "a [2,3] tensor on the meta device has no values to read"
}

template <class T>
T* Tensor::data() const {
  const TensorImpl& t = impl();
  bool ok = t.dtype == DTypeOf<T>::value ||
            (sizeof(T) == 2 && (t.dtype == DType::F16 || t.dtype == DType::BF16));
  QKV_CHECK(ok, "tensor has dtype ", dtype_name(t.dtype), ", code expected ", dtype_name(DTypeOf<T>::value));
  if (t.storage->device == Device::Meta) detail::fail_no_values(t.shape);
  return static_cast<T*>(t.storage->data) + t.offset;
}

}  // namespace qkv
