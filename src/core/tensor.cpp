// Tensor construction, layout, views and dtype conversion.
#include "qkv/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "qkv/allocator.h"
#include "qkv/rng.h"
#include "src/core/strided.h"
#include "src/kernels/kernels.h"

namespace qkv {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

// The product of the sizes other than 0, with every partial product checked:
// a shape read from a file (a safetensors header, a config) may hold any
// int64, and one with a zero size still has strides, so sizes past the zero
// count too. *has_zero says whether a size is 0.
static int64_t checked_product(const Shape& s, bool* has_zero) {
  int64_t n = 1;
  *has_zero = false;
  for (int64_t d : s) {
    QKV_CHECK(d >= 0, "tensor shape ", shape_str(s), " has a negative size");
    if (d == 0)
      *has_zero = true;
    else
      QKV_CHECK(!__builtin_mul_overflow(n, d, &n), "tensor shape ", shape_str(s),
                " is too large (its sizes multiply past 2^63)");
  }
  return n;
}

int64_t shape_numel(const Shape& s) {
  bool has_zero;
  const int64_t nonzero = checked_product(s, &has_zero);
  return has_zero ? 0 : nonzero;
}

Shape contiguous_strides(const Shape& s) {
  bool has_zero;
  checked_product(s, &has_zero);  // so that no stride below overflows
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = (int64_t)s.size() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];  // a sub-product of the checked one, or 0 past a zero size
  }
  return st;
}

const char* device_name(Device d) { return d == Device::Meta ? "meta" : "cpu"; }

static thread_local Device t_default_device = Device::Cpu;
Device default_device() { return t_default_device; }
DefaultDeviceGuard::DefaultDeviceGuard(Device d) : previous_(t_default_device) { t_default_device = d; }
DefaultDeviceGuard::~DefaultDeviceGuard() { t_default_device = previous_; }

Storage::Storage(size_t n, Device d) : data(d == Device::Cpu ? allocate_bytes(n) : nullptr), nbytes(n), device(d) {}
Storage::Storage(void* borrowed, size_t n, std::function<void()> release_fn)
    : data(borrowed), nbytes(n), device(Device::Cpu), release(std::move(release_fn)) {}
Storage::~Storage() {
  if (release)
    release();
  else if (device == Device::Cpu)
    free_bytes(data, nbytes);
}

void detail::fail_no_values(const Shape& shape) {
  fail("a ", shape_str(shape), " tensor on the meta device has no values to read");
}

// A fresh tensor on the meta device: the factories below skip storing values.
static bool is_meta(const Tensor& t) { return t.device() == Device::Meta; }

TensorImpl& Tensor::impl() const {
  QKV_CHECK(impl_ != nullptr, "use of an undefined tensor");
  return *impl_;
}

static Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto t = std::make_shared<TensorImpl>();
  t->storage = base.impl().storage;
  t->shape = std::move(shape);
  t->strides = std::move(strides);
  t->offset = offset;
  t->dtype = base.dtype();
  return Tensor(t);
}

static Tensor empty_on(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) QKV_CHECK(d >= 0, "tensor shape ", shape_str(shape), " has a negative size");
  auto t = std::make_shared<TensorImpl>();
  t->shape = shape;
  t->strides = contiguous_strides(shape);
  t->dtype = dtype;
  size_t nbytes;
  QKV_CHECK(!__builtin_mul_overflow((size_t)shape_numel(shape), dtype_size(dtype), &nbytes), "tensor shape ",
            shape_str(shape), " is too large (", dtype_name(dtype), ")");
  t->storage = std::make_shared<Storage>(nbytes, device);
  return Tensor(t);
}

Tensor Tensor::empty(const Shape& shape, DType dtype) { return empty_on(shape, dtype, default_device()); }

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (is_meta(t)) return t;
  std::memset(t.raw_data(), 0, (size_t)t.numel() * dtype_size(dtype));
  return t;
}

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape);
  if (!is_meta(t)) std::fill_n(t.data<float>(), t.numel(), value);
  return t;
}

Tensor Tensor::borrow(void* data, size_t nbytes, DType dtype, const Shape& shape, const Shape& strides,
                      std::function<void()> release) {
  QKV_CHECK(strides.size() == shape.size(), "borrow: ", strides.size(), " strides for shape ", shape_str(shape));
  size_t last = 0;  // the byte just past the farthest element
  if (shape_numel(shape) > 0) {
    int64_t far = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      QKV_CHECK(strides[d] >= 0, "borrow: stride ", strides[d], " of dim ", d, " is negative");
      far += (shape[d] - 1) * strides[d];
    }
    last = (size_t)(far + 1) * dtype_size(dtype);
  }
  QKV_CHECK(last <= nbytes, "borrow: a ", shape_str(shape), " view with strides ", shape_str(strides), " reaches byte ",
            last, " of a ", nbytes, "-byte block");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, nbytes, std::move(release));
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape) {
  QKV_CHECK((int64_t)v.size() == shape_numel(shape), "from_vector: ", v.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(shape);
  if (!is_meta(t)) std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Tensor Tensor::from_ints(const std::vector<int64_t>& v, const Shape& shape) {
  QKV_CHECK((int64_t)v.size() == shape_numel(shape), "from_ints: ", v.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(shape, DType::I64);
  if (!is_meta(t)) std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

Tensor Tensor::arange(int64_t n) {
  Tensor t = empty({n});
  if (is_meta(t)) return t;
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = (float)i;
  return t;
}

static thread_local bool t_skipping_init = false;
bool skipping_init() { return t_skipping_init; }
SkipInitGuard::SkipInitGuard() : previous_(t_skipping_init) { t_skipping_init = true; }
SkipInitGuard::~SkipInitGuard() { t_skipping_init = previous_; }

Tensor Tensor::randn(const Shape& shape, Rng& rng, float stddev) {
  Tensor t = empty(shape);
  uint64_t first = rng.reserve((uint64_t)t.numel());  // drawn on the meta device too: the same stream after it
  if (is_meta(t) || t_skipping_init) return t;
  float* p = t.data<float>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = stddev * rng.normal_at(first + i);
  return t;
}

Tensor Tensor::uniform(const Shape& shape, Rng& rng, float low, float high) {
  Tensor t = empty(shape);
  uint64_t first = rng.reserve((uint64_t)t.numel());  // drawn on the meta device too: the same stream after it
  if (is_meta(t) || t_skipping_init) return t;
  float* p = t.data<float>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = low + (high - low) * rng.uniform_at(first + i);
  return t;
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  if (d < 0) d += n;
  QKV_CHECK(d >= 0 && d < n, "dimension ", d, " out of range for a tensor of shape ", shape_str(shape()));
  return shape()[d];
}

bool Tensor::is_contiguous() const {
  const TensorImpl& t = impl();
  int64_t expected = 1;
  for (int64_t i = (int64_t)t.shape.size() - 1; i >= 0; --i) {
    if (t.shape[i] == 1) continue;
    if (t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  const TensorImpl& t = impl();
  if (t.storage->device == Device::Meta) detail::fail_no_values(t.shape);
  return static_cast<char*>(t.storage->data) + t.offset * (int64_t)dtype_size(t.dtype);
}

float Tensor::item() const {
  QKV_CHECK(numel() == 1, "item(): tensor of shape ", shape_str(shape()), " has ", numel(), " elements, expected 1");
  float v;  // the one element sits at the offset whatever the strides
  dtype_traits(dtype()).to_float(raw_data(), &v, 1);
  return v;
}

std::vector<float> Tensor::to_vector() const {
  Tensor c = to(DType::F32).contiguous();
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

std::vector<int64_t> Tensor::to_ints() const {
  Tensor c = to(DType::I64).contiguous();
  const int64_t* p = c.data<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

static int64_t wrap_dim(int64_t d, int64_t n, const char* what) {
  if (d < 0) d += n;
  QKV_CHECK(d >= 0 && d < n, what, ": dimension out of range for ", n, "-d tensor");
  return d;
}

Tensor Tensor::reshape(const Shape& new_shape_in) const {
  Shape shape = new_shape_in;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      QKV_CHECK(infer < 0, "reshape: more than one -1 in ", shape_str(new_shape_in));
      infer = (int64_t)i;
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    QKV_CHECK(known > 0 && numel() % known == 0, "reshape: cannot view ", shape_str(this->shape()), " as ",
              shape_str(new_shape_in));
    shape[infer] = numel() / known;
  }
  QKV_CHECK(shape_numel(shape) == numel(), "reshape: cannot view ", shape_str(this->shape()), " (", numel(),
            " elements) as ", shape_str(new_shape_in));
  Tensor src = *this;
  if (!is_contiguous()) {
    NoGradGuard no_grad;  // the copy is internal; the reshape node below carries the gradient
    src = clone();
  }
  Tensor out = make_view(src, shape, contiguous_strides(shape), src.offset());
  if (any_requires_grad({*this})) {
    Shape in_shape = this->shape();
    record_op(out, "reshape", {*this}, [in_shape](const BackwardArgs& a) -> std::vector<Tensor> {
      return {a.grad_out.reshape(in_shape)};
    });
  }
  return out;
}

Tensor Tensor::permute(const std::vector<int64_t>& dims_in) const {
  int64_t n = dim();
  QKV_CHECK((int64_t)dims_in.size() == n, "permute: ", dims_in.size(), " dims given for a ", n, "-d tensor");
  std::vector<int64_t> dims(n);
  std::vector<bool> seen(n, false);
  Shape shape(n), strides(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim(dims_in[i], n, "permute");
    QKV_CHECK(!seen[d], "permute: dimension ", d, " repeated");
    seen[d] = true;
    dims[i] = d;
    shape[i] = this->shape()[d];
    strides[i] = this->strides()[d];
  }
  Tensor out = make_view(*this, shape, strides, offset());
  if (any_requires_grad({*this})) {
    std::vector<int64_t> inverse(n);
    for (int64_t i = 0; i < n; ++i) inverse[dims[i]] = i;
    record_op(out, "permute", {*this}, [inverse](const BackwardArgs& a) -> std::vector<Tensor> {
      return {a.grad_out.permute(inverse)};
    });
  }
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  int64_t n = dim();
  std::vector<int64_t> dims(n);
  for (int64_t i = 0; i < n; ++i) dims[i] = i;
  std::swap(dims[wrap_dim(d0, n, "transpose")], dims[wrap_dim(d1, n, "transpose")]);
  return permute(dims);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end) const {
  d = wrap_dim(d, dim(), "slice");
  int64_t len = shape()[d];
  QKV_CHECK(0 <= start && start <= end && end <= len, "slice: range [", start, ",", end, ") out of bounds for size ",
            len, " of dimension ", d);
  Shape shape = this->shape();
  shape[d] = end - start;
  Tensor out = make_view(*this, shape, strides(), offset() + start * strides()[d]);
  if (any_requires_grad({*this})) {
    Shape in_shape = this->shape();
    record_op(out, "slice", {*this}, [in_shape, d, start, end](const BackwardArgs& a) -> std::vector<Tensor> {
      Tensor g = Tensor::zeros(in_shape);
      g.slice(d, start, end).copy_(a.grad_out);
      return {g};
    });
  }
  return out;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  int64_t n = dim();
  if (d < 0) d += n + 1;
  QKV_CHECK(d >= 0 && d <= n, "unsqueeze: dimension out of range");
  Shape s = shape();
  s.insert(s.begin() + d, 1);
  return reshape(s);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  QKV_CHECK(shape()[d] == 1, "squeeze: dimension ", d, " has size ", shape()[d], ", expected 1");
  Shape s = shape();
  s.erase(s.begin() + d);
  return reshape(s);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty_on(shape(), dtype(), device());
  out.copy_(*this);
  if (any_requires_grad({*this})) {
    record_op(out, "clone", {*this}, [](const BackwardArgs& a) -> std::vector<Tensor> { return {a.grad_out}; });
  }
  return out;
}

void Tensor::copy_(const Tensor& src) {
  QKV_CHECK(src.shape() == shape(), "copy: source shape ", shape_str(src.shape()), " differs from destination ",
            shape_str(shape()));
  if (is_meta(*this)) return;
  if (is_meta(src)) detail::fail_no_values(src.shape());
  if (src.dtype() != dtype()) {
    copy_(src.to(dtype()));
    return;
  }
  strided_copy(src.impl(), impl());
}

void Tensor::fill_(float value) {
  QKV_CHECK(dtype() == DType::F32, "fill_: only F32 tensors");
  if (is_meta(*this)) return;
  if (is_contiguous()) {
    std::fill_n(data<float>(), numel(), value);
    return;
  }
  copy_(full(shape(), value));
}

// to(), then the converted storage in place of the old.
Tensor& Tensor::convert_(DType target) {
  QKV_CHECK(defined(), "convert_: the tensor is undefined");
  QKV_CHECK(!impl_->grad_fn, "convert_: a tensor computed by an op cannot change its dtype in place");
  if (target == dtype()) return *this;
  return set_(to(target));
}

Tensor& Tensor::set_(const Tensor& source) {
  QKV_CHECK(defined() && source.defined(), "set_: the tensor is undefined");
  QKV_CHECK(!impl_->grad_fn, "set_: a tensor computed by an op cannot be replaced in place");
  impl_->storage = source.impl_->storage;
  impl_->shape = source.impl_->shape;
  impl_->strides = source.impl_->strides;
  impl_->offset = source.impl_->offset;
  impl_->dtype = source.impl_->dtype;
  impl_->requires_grad = false;
  impl_->grad.reset();
  return *this;
}

// Element-wise conversion through float (or int64 between integer types).
Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = empty_on(shape(), target, device());
  if (is_meta(out)) return out;
  Tensor src = contiguous();
  const DTypeTraits& from = dtype_traits(dtype());
  const DTypeTraits& into = dtype_traits(target);
  const char* in = static_cast<const char*>(src.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  if (from.is_float && into.is_float && device() == Device::Cpu) {  // vectors and threads (loading, convert)
    kernels_for(Device::Cpu).convert_floats(dtype(), in, target, dst, numel());
    return out;
  }
  // In blocks, through a float (or, between integer types, int64) buffer.
  constexpr int64_t kBlock = 1024;
  float f[kBlock];
  int64_t w[kBlock];
  const bool ints = !from.is_float && !into.is_float;
  for (int64_t i = 0, n = numel(); i < n; i += kBlock) {
    const int64_t m = std::min(kBlock, n - i);
    if (ints) {
      from.to_int64(in + i * from.size, w, m);
      into.from_int64(w, dst + i * into.size, m);
    } else {
      from.to_float(in + i * from.size, f, m);
      into.from_float(f, dst + i * into.size, m);
    }
  }
  return out;
}

}  // namespace qkv
