// Tensor construction, layout, views and dtype conversion.
#include "qkv/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "qkv/allocator.h"
#include "qkv/rng.h"
#include "src/core/strided.h"

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

Storage::Storage(size_t n) : data(allocate_bytes(n)), nbytes(n) {}
Storage::~Storage() { free_bytes(data, nbytes); }

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

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) QKV_CHECK(d >= 0, "tensor shape ", shape_str(shape), " has a negative size");
  auto t = std::make_shared<TensorImpl>();
  t->shape = shape;
  t->strides = contiguous_strides(shape);
  t->dtype = dtype;
  t->storage = std::make_shared<Storage>((size_t)shape_numel(shape) * dtype_size(dtype));
  return Tensor(t);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw_data(), 0, (size_t)t.numel() * dtype_size(dtype));
  return t;
}

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape);
  std::fill_n(t.data<float>(), t.numel(), value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape) {
  QKV_CHECK((int64_t)v.size() == shape_numel(shape), "from_vector: ", v.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(shape);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Tensor Tensor::from_ints(const std::vector<int64_t>& v, const Shape& shape) {
  QKV_CHECK((int64_t)v.size() == shape_numel(shape), "from_ints: ", v.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(shape, DType::I64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

Tensor Tensor::arange(int64_t n) {
  Tensor t = empty({n});
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = (float)i;
  return t;
}

Tensor Tensor::randn(const Shape& shape, Rng& rng, float stddev) {
  Tensor t = empty(shape);
  uint64_t first = rng.reserve((uint64_t)t.numel());
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = stddev * rng.normal_at(first + i);
  return t;
}

Tensor Tensor::uniform(const Shape& shape, Rng& rng, float low, float high) {
  Tensor t = empty(shape);
  uint64_t first = rng.reserve((uint64_t)t.numel());
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = low + (high - low) * rng.uniform_at(first + i);
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
  return static_cast<char*>(t.storage->data) + t.offset * (int64_t)dtype_size(t.dtype);
}

float Tensor::item() const {
  QKV_CHECK(numel() == 1, "item(): tensor of shape ", shape_str(shape()), " has ", numel(), " elements, expected 1");
  switch (dtype()) {  // the one element sits at the offset whatever the strides
    case DType::F32: return data<float>()[0];
    case DType::F16: return half_to_float(data<uint16_t>()[0]);
    case DType::BF16: return bf16_to_float(data<uint16_t>()[0]);
    case DType::I64: return (float)data<int64_t>()[0];
    case DType::I32: return (float)data<int32_t>()[0];
    case DType::U8: return (float)data<uint8_t>()[0];
  }
  return 0;
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
  Tensor out = empty(shape(), dtype());
  out.copy_(*this);
  if (any_requires_grad({*this})) {
    record_op(out, "clone", {*this}, [](const BackwardArgs& a) -> std::vector<Tensor> { return {a.grad_out}; });
  }
  return out;
}

void Tensor::copy_(const Tensor& src) {
  QKV_CHECK(src.shape() == shape(), "copy: source shape ", shape_str(src.shape()), " differs from destination ",
            shape_str(shape()));
  if (src.dtype() != dtype()) {
    copy_(src.to(dtype()));
    return;
  }
  strided_copy(src.impl(), impl());
}

void Tensor::fill_(float value) {
  QKV_CHECK(dtype() == DType::F32, "fill_: only F32 tensors");
  if (is_contiguous()) {
    std::fill_n(data<float>(), numel(), value);
    return;
  }
  copy_(full(shape(), value));
}

// Element-wise conversion through float (or int64 between integer types).
Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape(), target);
  int64_t n = numel();
  auto is_int = [](DType t) { return t == DType::I64 || t == DType::I32 || t == DType::U8; };
  if (is_int(dtype()) && is_int(target)) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = dtype() == DType::I64 ? src.data<int64_t>()[i]
                  : dtype() == DType::I32 ? src.data<int32_t>()[i]
                                          : src.data<uint8_t>()[i];
      if (target == DType::I64) out.data<int64_t>()[i] = v;
      else if (target == DType::I32) out.data<int32_t>()[i] = (int32_t)v;
      else out.data<uint8_t>()[i] = (uint8_t)v;
    }
    return out;
  }
  auto read = [&](int64_t i) -> float {
    switch (dtype()) {
      case DType::F32: return src.data<float>()[i];
      case DType::F16: return half_to_float(src.data<uint16_t>()[i]);
      case DType::BF16: return bf16_to_float(src.data<uint16_t>()[i]);
      case DType::I64: return (float)src.data<int64_t>()[i];
      case DType::I32: return (float)src.data<int32_t>()[i];
      case DType::U8: return (float)src.data<uint8_t>()[i];
    }
    return 0;
  };
  for (int64_t i = 0; i < n; ++i) {
    float v = read(i);
    switch (target) {
      case DType::F32: out.data<float>()[i] = v; break;
      case DType::F16: out.data<uint16_t>()[i] = float_to_half(v); break;
      case DType::BF16: out.data<uint16_t>()[i] = float_to_bf16(v); break;
      case DType::I64: out.data<int64_t>()[i] = (int64_t)v; break;
      case DType::I32: out.data<int32_t>()[i] = (int32_t)v; break;
      case DType::U8: out.data<uint8_t>()[i] = (uint8_t)v; break;
    }
  }
  return out;
}

}  // namespace qkv
