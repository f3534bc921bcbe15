// Reference element-wise kernels: one element at a time, index arithmetic spelled out.
#include <cmath>
#include <vector>

#include "src/kernels/kernels.h"

namespace qkv::ref {

// Offsets of flat index i (row-major over `shape`) under `strides`.
static int64_t offset_of(int64_t i, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (int64_t d = (int64_t)shape.size() - 1; d >= 0; --d) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

static int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void binary(BinaryOp op, const BroadcastLoop& loop, const float* a, const float* b, float* out) {
  for (int64_t i = 0; i < numel(loop.shape); ++i) {
    float x = a[offset_of(i, loop.shape, loop.a_strides)];
    float y = b[offset_of(i, loop.shape, loop.b_strides)];
    switch (op) {
      case BinaryOp::Add: out[i] = x + y; break;
      case BinaryOp::Sub: out[i] = x - y; break;
      case BinaryOp::Mul: out[i] = x * y; break;
      case BinaryOp::Div: out[i] = x / y; break;
    }
  }
}

void masked_fill(const BroadcastLoop& loop, const float* x, const uint8_t* mask, float value, float* out) {
  for (int64_t i = 0; i < numel(loop.shape); ++i) {
    bool m = mask[offset_of(i, loop.shape, loop.b_strides)] != 0;
    out[i] = m ? value : x[offset_of(i, loop.shape, loop.a_strides)];
  }
}

static double gelu_exact(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
static double gelu_tanh(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
static double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

static double apply(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::Sigmoid: return sigmoid(x);
    case UnaryOp::Relu: return x > 0 ? x : 0;
    case UnaryOp::Gelu: return gelu_exact(x);
    case UnaryOp::GeluTanh: return gelu_tanh(x);
    case UnaryOp::Silu: return x * sigmoid(x);
  }
  return 0;
}

// f'(x), written from the definitions above.
static double derivative(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return 1.0 / x;
    case UnaryOp::Tanh: return 1.0 - std::tanh(x) * std::tanh(x);
    case UnaryOp::Sigmoid: return sigmoid(x) * (1.0 - sigmoid(x));
    case UnaryOp::Relu: return x > 0 ? 1.0 : 0.0;
    case UnaryOp::Gelu: {  // Phi(x) + x phi(x)
      double cdf = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
      double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
      return cdf + x * pdf;
    }
    case UnaryOp::GeluTanh: {
      const double c = std::sqrt(2.0 / M_PI);
      double u = c * (x + 0.044715 * x * x * x);
      double t = std::tanh(u);
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
    }
    case UnaryOp::Silu: return sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x)));
  }
  return 0;
}

void unary_forward(UnaryOp op, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = (float)apply(op, x[i]);
}

void unary_backward(UnaryOp op, const float* x, const float*, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = (float)(dy[i] * derivative(op, x[i]));
}

void sum_middle(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double acc = 0;
      for (int64_t r = 0; r < n; ++r) acc += x[(o * n + r) * inner + i];
      y[o * inner + i] = (float)acc;
    }
}

}  // namespace qkv::ref
