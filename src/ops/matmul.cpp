// matmul (batched, broadcasting) and linear, both on the one GEMM wrapper.
//
//   C = A B        dA = dC B^T      dB = A^T dC
//   y = x W^T + b  dx = dy W        dW = dy^T x     db = sum_rows dy
#include <algorithm>
#include <cstring>
#include <cmath>

#include "qkv/allocator.h"
#include "src/ops/dispatch.h"

namespace qkv {
namespace {

// How a [rows, cols] matrix inside a tensor is handed to BLAS.
struct MatrixLayout {
  bool transposed = false;
  int64_t ld = 0;
};

// Row-major with unit column stride, or its transpose; anything else needs a copy.
bool blas_layout(const Tensor& t, MatrixLayout* out) {
  int64_t n = t.dim(), rows = t.shape()[n - 2], cols = t.shape()[n - 1];
  int64_t rs = t.strides()[n - 2], cs = t.strides()[n - 1];
  if (cs == 1 || cols == 1) {
    int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : rs;
    if (ld >= std::max<int64_t>(cols, 1)) {
      *out = {false, ld};
      return true;
    }
  }
  if (rs == 1 || rows == 1) {
    int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : cs;
    if (ld >= std::max<int64_t>(rows, 1)) {
      *out = {true, ld};
      return true;
    }
  }
  return false;
}

Tensor as_blas_operand(const Tensor& t, MatrixLayout* layout) {
  if (blas_layout(t, layout)) return t;
  Tensor c = contiguous_values(t);
  blas_layout(c, layout);
  return c;
}

// out [batch..., M, N] = a [.., M, K] @ b [.., K, N] with batch broadcasting; no autograd.
Tensor matmul_forward(const Tensor& a_in, const Tensor& b_in) {
  if (b_in.dim() == 2 && a_in.dim() > 2 && a_in.is_contiguous()) {
    // One shared matrix: a's rows of every batch are one GEMM (for [B, 1, D]
    // rows of decoding, one pass over b instead of B).
    Shape out_shape = a_in.shape();
    out_shape.back() = b_in.size(1);
    return matmul_forward(a_in.reshape({-1, a_in.size(-1)}), b_in).reshape(out_shape);
  }
  MatrixLayout la, lb;
  Tensor a = as_blas_operand(a_in, &la), b = as_blas_operand(b_in, &lb);
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                 Shape(b.shape().begin(), b.shape().end() - 2));
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out = Tensor::empty(out_shape);
  const int64_t nb = shape_numel(batch);
  Tensor a_batch = a.detach(), b_batch = b.detach();
  a_batch.impl().shape.resize(a.dim() - 2);
  a_batch.impl().strides.resize(a.dim() - 2);
  b_batch.impl().shape.resize(b.dim() - 2);
  b_batch.impl().strides.resize(b.dim() - 2);
  Shape sa = broadcast_strides(a_batch, batch), sb = broadcast_strides(b_batch, batch);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* pc = out.data<float>();
  // Where each product's operands start: the batch index decomposed over the
  // broadcast batch shape.
  Tensor offsets = Tensor::empty({2, nb}, DType::I64);
  int64_t* a_offsets = offsets.data<int64_t>();
  int64_t* b_offsets = a_offsets + nb;
  for (int64_t i = 0; i < nb; ++i) {
    int64_t oa = 0, ob = 0, rem = i;
    for (int64_t d = (int64_t)batch.size() - 1; d >= 0; --d) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      oa += idx * sa[d];
      ob += idx * sb[d];
    }
    a_offsets[i] = oa, b_offsets[i] = ob;
  }
  GemmArgs g;
  g.trans_a = la.transposed;
  g.trans_b = lb.transposed;
  g.m = M, g.n = N, g.k = K;
  g.a = pa, g.lda = la.ld;
  g.b = pb, g.ldb = lb.ld;
  g.c = pc, g.ldc = std::max<int64_t>(N, 1);
  QKV_KERNEL(gemm_batched)(g, nb, a_offsets, b_offsets, M * N);
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  require_f32(a, "matmul", "a");
  require_f32(b, "matmul", "b");
  QKV_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: operands must be at least 2-d, got ", shape_str(a.shape()), " and ",
            shape_str(b.shape()));
  QKV_CHECK(a.size(-1) == b.size(-2), "matmul: inner dimensions differ: a is ", shape_str(a.shape()), ", b is ",
            shape_str(b.shape()));
  Tensor out = matmul_forward(a, b);
  record_op(out, "matmul", {a, b}, [a = a.detach(), b = b.detach()](const BackwardArgs& g) -> std::vector<Tensor> {
    Tensor ga, gb;
    if (g.needs_grad[0]) ga = sum_to(matmul_forward(g.grad_out, b.transpose(-1, -2)), a.shape());
    if (g.needs_grad[1]) {
      if (b.dim() == 2 && a.dim() > 2) {  // shared weight: one GEMM over all rows
        Tensor a2 = a.reshape({-1, a.size(-1)});
        Tensor g2 = g.grad_out.reshape({-1, g.grad_out.size(-1)});
        gb = matmul_forward(a2.transpose(0, 1), g2);
      } else {
        gb = sum_to(matmul_forward(a.transpose(-1, -2), g.grad_out), b.shape());
      }
    }
    return {ga, gb};
  });
  return out;
}

namespace {

UnaryOp unary_op(Activation a) {
  switch (a) {
    case Activation::Relu: return UnaryOp::Relu;
    case Activation::Gelu: return UnaryOp::Gelu;
    case Activation::GeluTanh: return UnaryOp::GeluTanh;
    case Activation::Silu: return UnaryOp::Silu;
    case Activation::Tanh: return UnaryOp::Tanh;
  }
  fail("linear: unknown activation");
}

// A bfloat16 or float16 weight (inference). bfloat16: x rounded to bfloat16
// by the kernel as it reads it (products exact in float32); float16: x as it
// is, times the widened weight. Float32 sums, then the bias and the
// activation in float32.
Tensor linear_half(const Tensor& x, const Tensor& weight, const Tensor& bias, const UnaryOp* act,
                   const Tensor& packed = Tensor(), DType out = DType::F32) {
  QKV_CHECK(!any_requires_grad({x, weight, bias}), "linear: ", dtype_name(weight.dtype()),
            " weights are for inference; run it under NoGradGuard or with inputs that need no gradient");
  const int64_t in = weight.size(1), out_features = weight.size(0);
  Tensor x2 = contiguous_values(x).reshape({-1, in});
  // A BF16 Linear weight may be held packed only (its values on the meta device: Linear::pack_weight).
  const bool dropped = weight.device() == Device::Meta;
  Tensor w = dropped ? Tensor() : contiguous_values(weight), b = contiguous_values(bias);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  // With a BF16 weight, x may be BF16 (read as it lies) and y BF16 (the
  // float32 sums, bias and activation rounded once), for bfloat16
  // activations from one product to the next.
  const bool bf16_out = out == DType::BF16;
  QKV_CHECK(out == DType::F32 || (bf16_out && weight.dtype() == DType::BF16),
            "linear: a BF16 weight can write F32 or BF16, other weights F32; asked for ", dtype_name(out));
  Tensor y = Tensor::empty(out_shape, out);
  const int64_t m = x2.size(0), ld_in = std::max<int64_t>(in, 1), ld_out = std::max<int64_t>(out_features, 1);
  if (m > 0 && out_features > 0) {
    if (weight.dtype() == DType::BF16) {
      GemmBf16Args g;
      g.m = m, g.n = out_features, g.k = in, g.inference = true;  // (a BF16 weight has no gradient)
      if (x.dtype() == DType::BF16)
        g.a = x2.data<uint16_t>();
      else
        g.a_f32 = x2.data<float>();  // rounded to bfloat16 as the kernel reads it
      if (bf16_out)
        g.c_bf16 = y.data<uint16_t>(), g.has_act = act != nullptr, g.act = act ? *act : UnaryOp::Relu;
      else
        g.c = y.data<float>();
      g.lda = ld_in, g.ldc = ld_out;
      g.b = dropped ? nullptr : w.data<uint16_t>(), g.ldb = ld_in;
      g.bias = b.defined() ? b.data<float>() : nullptr;
      // A packed copy made for this weight's shape under the kernels that run now (else W is packed here).
      if (packed.defined() && packed.numel() == QKV_KERNEL(gemm_bf16_packed_b_words)(out_features, in))
        g.b_packed = reinterpret_cast<const uint32_t*>(packed.raw_data());
      QKV_CHECK(g.b || g.b_packed, "linear: the BF16 weight ", shape_str(weight.shape()),
                " is held packed only, in a layout this CPU's kernels do not read");
      QKV_KERNEL(gemm_bf16)(g);
    } else {
      GemmF16Args g;
      g.m = m, g.n = out_features, g.k = in;
      g.a = x2.data<float>(), g.lda = ld_in;
      g.b = w.data<uint16_t>(), g.ldb = ld_in;
      g.c = y.data<float>(), g.ldc = ld_out;
      g.bias = b.defined() ? b.data<float>() : nullptr;
      QKV_KERNEL(gemm_f16)(g);
    }
  }
  if (act && !bf16_out) QKV_KERNEL(unary_forward)(*act, y.data<float>(), y.data<float>(), y.numel());
  return y;
}

// x [..., in] and bias (undefined, or F32 [out]) as a weight [out, in] of
// any dtype wants them.
void check_input_and_bias(const Tensor& x, const Tensor& bias, const Shape& weight_shape) {
  QKV_CHECK(x.dim() >= 1 && x.size(-1) == weight_shape[1], "linear: input of shape ", shape_str(x.shape()),
            " does not match weight [out, in] = ", shape_str(weight_shape));
  if (!bias.defined()) return;
  require_f32(bias, "linear", "bias");
  QKV_CHECK(bias.shape() == Shape{weight_shape[0]}, "linear: bias of shape ", shape_str(bias.shape()),
            ", expected [", weight_shape[0], "]");
}

thread_local bool t_bf16_autocast = false;

// C = op(A) op(B) + ... as `g` describes it (with its activation epilogue),
// in float32 or, with bf16, on operands rounded to bfloat16 (float32 sums).
// With a_sums (bf16 only), each row of op(A)'s sum over k too (GemmBf16Args::a_sums).
void gemm_in(bool bf16, const GemmArgs& g, float* a_sums = nullptr) {
  if (g.m == 0 || g.n == 0) return;
  if (!bf16) return QKV_KERNEL(gemm)(g);
  GemmBf16Args h;
  h.m = g.m, h.n = g.n, h.k = g.k, h.alpha = g.alpha, h.beta = g.beta;
  h.a_f32 = g.a, h.lda = g.lda, h.a_transposed = g.trans_a;
  h.b_f32 = g.b, h.ldb = g.ldb, h.b_transposed = !g.trans_b;  // gemm_bf16's B is B^T's [n, k] layout
  h.c = g.c, h.ldc = g.ldc, h.bias = g.bias, h.a_sums = a_sums;
  h.act = g.act, h.act_out = g.act_out, h.ld_act = g.ld_act;
  QKV_KERNEL(gemm_bf16)(h);
}

// x F32, or BF16 with a BF16 weight (inference in bfloat16 activations).
void check_input_dtype(const Tensor& x, const Tensor& weight) {
  QKV_CHECK(x.defined(), "linear: x is undefined");
  QKV_CHECK(x.dtype() == DType::F32 || (x.dtype() == DType::BF16 && weight.defined() && weight.dtype() == DType::BF16),
            "linear: x has dtype ", dtype_name(x.dtype()), ", expected F32 (or BF16, with a BF16 weight)");
}

// y = act(x W^T + b), or x W^T + b when act is null. With an activation and
// history to record, the product before it (pre) is kept for the backward:
// dpre = dy * act'(pre), then the linear's backward with dpre. Under
// Bf16AutocastGuard the three products take bfloat16 operands. With a
// residual (linear_add: a float32 weight, no activation, no autocast, the
// residual float32 of y's shape) y = residual + x W^T + b, the residual
// added as the GEMM stores each block of y; its gradient is dy.
Tensor linear_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, const UnaryOp* act,
                   const Tensor& residual = Tensor()) {
  check_input_dtype(x, weight);
  QKV_CHECK(weight.defined(), "linear: weight is undefined");
  QKV_CHECK(weight.dtype() != DType::I8, "linear: an I8 weight needs its scales (linear_int8)");
  QKV_CHECK(weight.dtype() == DType::F32 || weight.dtype() == DType::BF16 || weight.dtype() == DType::F16,
            "linear: weight has dtype ", dtype_name(weight.dtype()), ", expected F32, BF16 or F16");
  QKV_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got ", shape_str(weight.shape()));
  check_input_and_bias(x, bias, weight.shape());
  const int64_t in = weight.size(1), out_features = weight.size(0);
  if (weight.dtype() != DType::F32) return linear_half(x, weight, bias, act);
  const bool bf16 = t_bf16_autocast;
  Tensor x2 = x.detach().reshape({-1, in});
  Tensor w = contiguous_values(weight);
  const int64_t rows = x2.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor y = Tensor::empty(out_shape);
  // Without history the activation runs in place on the product.
  Tensor pre = act && any_requires_grad({x, weight, bias}) ? Tensor::empty(out_shape) : Tensor();
  Tensor b = bias.defined() ? contiguous_values(bias) : Tensor();
  GemmArgs g;
  g.trans_b = true;
  g.m = rows, g.n = out_features, g.k = in;
  g.a = x2.data<float>(), g.lda = std::max<int64_t>(in, 1);
  g.b = w.data<float>(), g.ldb = std::max<int64_t>(in, 1);
  g.c = pre.defined() ? pre.data<float>() : y.data<float>(), g.ldc = std::max<int64_t>(out_features, 1);
  g.bias = b.defined() ? b.data<float>() : nullptr;
  g.inference = !any_requires_grad({x, weight, bias});
  Tensor r = contiguous_values(residual);
  if (r.defined()) g.addend = r.data<float>(), g.ld_addend = g.ldc;
  // The activation as each block of the product is stored; in bfloat16
  // without history (activation in place) after the whole product instead:
  // fused there, a bf16 ViT's inference ran 5% slower (Intel Xeon, model
  // 207), where keeping the pre-activation, it trains faster.
  const bool act_after = act && bf16 && !pre.defined();
  if (act && !act_after) g.act = *act, g.act_out = y.data<float>(), g.ld_act = g.ldc;
  if (rows > 0 && out_features > 0) gemm_in(bf16, g);
  if (act_after) QKV_KERNEL(unary_forward)(*act, g.c, y.data<float>(), y.numel());
  const UnaryOp op = act ? *act : UnaryOp::Relu;
  std::vector<Tensor> inputs{x, weight, bias};
  if (residual.defined()) inputs.push_back(residual);
  const char* name = act ? "linear_activation" : residual.defined() ? "linear_add" : "linear";
  record_op(y, name, inputs,
            [x2, w, pre, op, bf16, in, out_features, rows, x_shape = x.shape()](const BackwardArgs& a) -> std::vector<Tensor> {
    Tensor dy = a.grad_out.contiguous();
    if (pre.defined()) {  // through the activation first
      Tensor dpre = Tensor::empty(pre.shape());
      QKV_KERNEL(unary_backward)(op, pre.data<float>(), a.out.data<float>(), dy.data<float>(), dpre.data<float>(),
                                 pre.numel());
      dy = dpre;
    }
    Tensor dx, dw, db;
    if (a.needs_grad[0]) {  // dx [rows, in] = dy [rows, out] W [out, in]
      dx = Tensor::empty(x_shape);
      GemmArgs g{false, false, rows, in, out_features, 1.0f, dy.data<float>(), std::max<int64_t>(out_features, 1),
                 w.data<float>(), std::max<int64_t>(in, 1), 0.0f, dx.data<float>(), std::max<int64_t>(in, 1)};
      if (out_features == 0) dx.fill_(0.0f);
      else gemm_in(bf16, g);
    }
    const bool needs_db = a.needs_grad.size() > 2 && a.needs_grad[2];
    if (needs_db) db = Tensor::empty({out_features});
    bool db_summed = false;  // by dW's product, which reads all of dy as its A (bf16)
    if (a.needs_grad[1]) {  // dW [out, in] = dy^T [out, rows] x [rows, in]
      dw = Tensor::empty({out_features, in});
      GemmArgs g{true, false, out_features, in, rows, 1.0f, dy.data<float>(), std::max<int64_t>(out_features, 1),
                 x2.data<float>(), std::max<int64_t>(in, 1), 0.0f, dw.data<float>(), std::max<int64_t>(in, 1)};
      db_summed = needs_db && bf16 && rows > 0 && out_features > 0 && in > 0;
      if (rows == 0)
        dw.fill_(0.0f);  // no rows: dW is 0
      else
        gemm_in(bf16, g, db_summed ? db.data<float>() : nullptr);
    }
    if (needs_db && !db_summed) QKV_KERNEL(sum_middle)(dy.data<float>(), db.data<float>(), 1, rows, out_features);
    if (a.needs_grad.size() > 3) return {dx, dw, db, a.needs_grad[3] ? a.grad_out : Tensor()};  // the residual's
    return {dx, dw, db};
  });
  return y;
}

// The dtypes and shapes of an int8 weight (not its values): one error naming `what`.
void check_int8_shapes(const Int8Weight& w, const std::string& what) {
  QKV_CHECK(w.values.defined() && w.values.dtype() == DType::I8 && w.values.dim() == 2, what,
            ": int8 weight values must be I8 [out, in]");
  const int64_t out = w.values.size(0), in = w.values.size(1), blocks = (in + kInt8Block - 1) / kInt8Block;
  QKV_CHECK(w.scales.defined() && w.scales.dtype() == DType::F32 && (w.scales.shape() == Shape{out, blocks}), what,
            ": int8 weight scales must be F32 [", out, ", ", blocks, "] (one per block of ", kInt8Block,
            "), got ", w.scales.defined() ? dtype_name(w.scales.dtype()) : "none", " ",
            w.scales.defined() ? shape_str(w.scales.shape()) : "");
}

}  // namespace

bool bf16_autocast() { return t_bf16_autocast; }
Bf16AutocastGuard::Bf16AutocastGuard(bool enabled) : previous_(t_bf16_autocast) { t_bf16_autocast = enabled; }
Bf16AutocastGuard::~Bf16AutocastGuard() { t_bf16_autocast = previous_; }

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_impl(x, weight, bias, nullptr);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation activation) {
  const UnaryOp op = unary_op(activation);
  return linear_impl(x, weight, bias, &op);
}

Tensor linear_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual) {
  QKV_CHECK(residual.defined(), "linear_add: the residual is undefined");
  const bool fused = weight.defined() && weight.dtype() == DType::F32 && weight.dim() == 2 && !t_bf16_autocast &&
                     x.defined() && x.dim() >= 1 && residual.dtype() == DType::F32 && [&] {
                       Shape y = x.shape();
                       y.back() = weight.size(0);
                       return residual.shape() == y;
                     }();
  if (!fused) return add(residual, linear(x, weight, bias));  // broadcasts, converts or reports
  return linear_impl(x, weight, bias, nullptr, residual);
}

Tensor pack_bf16_weight(const Tensor& weight) {
  QKV_CHECK(weight.dtype() == DType::BF16 && weight.dim() == 2,
            "pack_bf16_weight: expected a BF16 weight [out, in], got ", dtype_name(weight.dtype()), " ",
            shape_str(weight.shape()));
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t words = QKV_KERNEL(gemm_bf16_packed_b_words)(n, k);
  if (words == 0 || n == 0 || k == 0) return Tensor();
  if (allocator_stats().bytes_in_use + 4 * (uint64_t)words > memory_limit()) return Tensor();  // W goes next
  Tensor w = contiguous_values(weight), packed = Tensor::empty({words}, DType::I32);
  GemmBf16Args g;
  g.n = n, g.k = k, g.b = w.data<uint16_t>(), g.ldb = k;
  QKV_KERNEL(gemm_bf16_pack_b)(g, reinterpret_cast<uint32_t*>(packed.raw_data()));
  return packed;
}

Tensor unpack_bf16_weight(const Tensor& packed, int64_t out_features, int64_t in_features) {
  QKV_CHECK(packed.dtype() == DType::I32 &&
                packed.numel() == QKV_KERNEL(gemm_bf16_packed_b_words)(out_features, in_features),
            "unpack_bf16_weight: ", packed.numel(), " words are not a [", out_features, ", ", in_features,
            "] weight packed by this CPU's kernels");
  Tensor w = Tensor::empty({out_features, in_features}, DType::BF16);
  QKV_KERNEL(gemm_bf16_unpack_b)(out_features, in_features, reinterpret_cast<const uint32_t*>(packed.raw_data()),
                                 w.data<uint16_t>());
  return w;
}

Tensor linear_bf16(const Tensor& x, const Tensor& weight, const Tensor& packed, const Tensor& bias,
                   const Activation* activation, DType out) {
  QKV_CHECK(weight.defined(), "linear_bf16: weight is undefined");
  check_input_dtype(x, weight);
  QKV_CHECK(weight.dtype() == DType::BF16 && weight.dim() == 2, "linear_bf16: expected a BF16 weight [out, in], got ",
            dtype_name(weight.dtype()), " ", shape_str(weight.shape()));
  QKV_CHECK(!packed.defined() || packed.dtype() == DType::I32, "linear_bf16: the packed weight must be I32 words");
  check_input_and_bias(x, bias, weight.shape());
  if (!activation) return linear_half(x, weight, bias, nullptr, packed, out);
  const UnaryOp op = unary_op(*activation);
  return linear_half(x, weight, bias, &op, packed, out);
}

Int8Weight quantize_int8(const Tensor& w) {
  QKV_CHECK(w.dim() == 2 && (w.dtype() == DType::F32 || w.dtype() == DType::BF16 || w.dtype() == DType::F16),
            "quantize_int8: expected an F32, BF16 or F16 weight [out, in], got ", dtype_name(w.dtype()), " ",
            shape_str(w.shape()));
  const int64_t out = w.size(0), in = w.size(1), blocks = (in + kInt8Block - 1) / kInt8Block;
  const Tensor f = contiguous_values(w.to(DType::F32));
  Int8Weight q{Tensor::empty({out, in}, DType::I8), Tensor::empty({out, blocks})};
  QKV_KERNEL(quantize_int8_rows)(f.data<float>(), q.values.data<int8_t>(), q.scales.data<float>(), out, in);
  return q;
}

Tensor dequantize_int8(const Int8Weight& w) {
  check_int8_shapes(w, "dequantize_int8");
  const int64_t out = w.values.size(0), in = w.values.size(1), blocks = w.scales.size(1);
  const Tensor v = contiguous_values(w.values), s = contiguous_values(w.scales);
  Tensor f = Tensor::empty({out, in});
  for (int64_t j = 0; j < out; ++j)
    for (int64_t p = 0; p < in; ++p)
      f.data<float>()[j * in + p] = (float)v.data<int8_t>()[j * in + p] * s.data<float>()[j * blocks + p / kInt8Block];
  return f;
}

void check_int8_weight(const Int8Weight& w, const std::string& what) {
  check_int8_shapes(w, what);
  const int64_t in = w.values.size(1), blocks = w.scales.size(1);
  if (w.values.device() == Device::Meta) return;
  const Tensor v = contiguous_values(w.values), s = contiguous_values(w.scales);
  const int8_t* q = v.data<int8_t>();
  const int64_t values = v.numel(), scales = s.numel();  // (numel() multiplies the shape out on every call)
  // -128 is the byte 0x80: memchr scans for it at memory speed.
  const void* bad = std::memchr(q, 0x80, (size_t)values);
  const int64_t i = bad ? static_cast<const int8_t*>(bad) - q : values;
  QKV_CHECK(i == values, what, ": int8 weight value -128 at [", i / std::max<int64_t>(in, 1), ", ",
            i % std::max<int64_t>(in, 1), "] (the format holds -127..127)");
  const float* d = s.data<float>();
  for (int64_t i = 0; i < scales; ++i)
    QKV_CHECK(std::isfinite(d[i]) && d[i] >= 0.0f, what, ": int8 weight scale ", d[i], " at [",
              i / std::max<int64_t>(blocks, 1), ", ", i % std::max<int64_t>(blocks, 1),
              "] is not a finite non-negative number");
}

Tensor linear_int8(const Tensor& x, const Int8Weight& weight, const Tensor& bias, const Activation* activation) {
  require_f32(x, "linear_int8", "x");
  QKV_CHECK(!any_requires_grad({x, bias}),
            "linear: an int8 weight is for inference; run it under NoGradGuard or with inputs that need no gradient");
  check_int8_shapes(weight, "linear_int8");
  check_input_and_bias(x, bias, weight.values.shape());
  const int64_t in = weight.values.size(1), out_features = weight.values.size(0), blocks = weight.scales.size(1);
  Tensor x2 = contiguous_values(x).reshape({-1, in});
  Tensor v = contiguous_values(weight.values), s = contiguous_values(weight.scales), b = contiguous_values(bias);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor y = Tensor::empty(out_shape);
  GemmInt8Args g;
  g.m = x2.size(0), g.n = out_features, g.k = in;
  g.a = x2.data<float>(), g.lda = std::max<int64_t>(in, 1);
  g.b = v.data<int8_t>(), g.ldb = std::max<int64_t>(in, 1);
  g.scales = s.data<float>(), g.ld_scale = std::max<int64_t>(blocks, 1);
  g.c = y.data<float>(), g.ldc = std::max<int64_t>(out_features, 1);
  g.bias = b.defined() ? b.data<float>() : nullptr;
  if (g.m > 0 && g.n > 0) QKV_KERNEL(gemm_int8)(g);
  if (activation) {
    const UnaryOp op = unary_op(*activation);
    QKV_KERNEL(unary_forward)(op, y.data<float>(), y.data<float>(), y.numel());
  }
  return y;
}

}  // namespace qkv
