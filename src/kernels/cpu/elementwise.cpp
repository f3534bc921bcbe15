// Fast element-wise kernels: contiguous fast paths, the innermost dimension as
// a plain loop the compiler vectorizes, rows split across OpenMP threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include <omp.h>

#include "src/kernels/cpu/vec_math.h"
#include "src/kernels/kernels.h"

namespace qkv::cpu::QKV_CPU_NS {

constexpr int64_t kParallelGrain = 1 << 15;  // elements below which one thread is faster

template <class F>
static void binary_inner(F f, const float* a, int64_t sa, const float* b, int64_t sb, float* out, int64_t n) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const float y = *b;
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], y);
  } else if (sa == 0 && sb == 1) {
    const float x = *a;
    for (int64_t i = 0; i < n; ++i) out[i] = f(x, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i * sa], b[i * sb]);
  }
}

// Runs `row(a_offset, b_offset, out_row_index)` for every row of the loop.
template <class RowFn>
static void for_each_row(const BroadcastLoop& loop, RowFn row) {
  const int64_t nd = (int64_t)loop.shape.size();
  const int64_t inner = nd ? loop.shape[nd - 1] : 1;
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < nd; ++d) rows *= loop.shape[d];
  if (inner == 0) return;
#pragma omp parallel for schedule(static) if (rows * inner >= kParallelGrain && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t ao = 0, bo = 0, rem = r;
    for (int64_t d = nd - 2; d >= 0; --d) {
      int64_t i = rem % loop.shape[d];
      rem /= loop.shape[d];
      ao += i * loop.a_strides[d];
      bo += i * loop.b_strides[d];
    }
    row(ao, bo, r * inner);
  }
}

template <class F>
static void binary_loop(F f, const BroadcastLoop& loop, const float* a, const float* b, float* out) {
  const int64_t nd = (int64_t)loop.shape.size();
  int64_t total = 1;
  for (int64_t d : loop.shape) total *= d;
  bool flat = true;  // both operands contiguous with the output shape
  int64_t expect = 1;
  for (int64_t d = nd - 1; d >= 0; --d) {
    if (loop.shape[d] != 1 && (loop.a_strides[d] != expect || loop.b_strides[d] != expect)) flat = false;
    expect *= loop.shape[d];
  }
  if (flat) {
#pragma omp parallel for schedule(static) if (total >= kParallelGrain)
    for (int64_t c = 0; c < total; c += 4096) {
      int64_t n = std::min<int64_t>(4096, total - c);
      binary_inner(f, a + c, 1, b + c, 1, out + c, n);
    }
    return;
  }
  const int64_t inner = nd ? loop.shape[nd - 1] : 1;
  const int64_t sa = nd ? loop.a_strides[nd - 1] : 0, sb = nd ? loop.b_strides[nd - 1] : 0;
  for_each_row(loop, [&](int64_t ao, int64_t bo, int64_t oo) { binary_inner(f, a + ao, sa, b + bo, sb, out + oo, inner); });
}

void binary(BinaryOp op, const BroadcastLoop& loop, const float* a, const float* b, float* out) {
  switch (op) {
    case BinaryOp::Add: return binary_loop([](float x, float y) { return x + y; }, loop, a, b, out);
    case BinaryOp::Sub: return binary_loop([](float x, float y) { return x - y; }, loop, a, b, out);
    case BinaryOp::Mul: return binary_loop([](float x, float y) { return x * y; }, loop, a, b, out);
    case BinaryOp::Div: return binary_loop([](float x, float y) { return x / y; }, loop, a, b, out);
  }
}

void masked_fill(const BroadcastLoop& loop, const float* x, const uint8_t* mask, float value, float* out) {
  const int64_t nd = (int64_t)loop.shape.size();
  const int64_t inner = nd ? loop.shape[nd - 1] : 1;
  const int64_t sa = nd ? loop.a_strides[nd - 1] : 0, sb = nd ? loop.b_strides[nd - 1] : 0;
  for_each_row(loop, [&](int64_t ao, int64_t bo, int64_t oo) {
    for (int64_t i = 0; i < inner; ++i) out[oo + i] = mask[bo + i * sb] ? value : x[ao + i * sa];
  });
}

static constexpr float kSqrt2OverPi = 0.7978845608028654f;

// body(begin, end) over [0, n) in chunks split between the threads. Small
// ranges, and ranges from a thread already in a parallel region (a GEMM
// epilogue), run on the calling thread without entering OpenMP at all: an
// `if` clause that comes out false still sets up a team of one, which costs
// more than a short row.
template <class Body>
static void for_chunks(int64_t n, Body body) {
  if (n < kParallelGrain || omp_in_parallel()) return body(0, n);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n; c += 4096) body(c, std::min<int64_t>(n, c + 4096));
}

template <class F>
static void map(const float* x, float* y, int64_t n, F f) {
  for_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
  });
}

void unary_forward(UnaryOp op, const float* x, float* y, int64_t n) {
  switch (op) {
    case UnaryOp::Exp: return map(x, y, n, [](float v) { return fast_exp(v); });
    case UnaryOp::Log: return map(x, y, n, [](float v) { return std::log(v); });
    case UnaryOp::Tanh: return map(x, y, n, [](float v) { return fast_tanh(v); });
    case UnaryOp::Sigmoid: return map(x, y, n, [](float v) { return fast_sigmoid(v); });
    case UnaryOp::Relu: return map(x, y, n, [](float v) { return v > 0.0f ? v : 0.0f; });
    case UnaryOp::Gelu: return map(x, y, n, [](float v) { return gelu_exact(v); });
    case UnaryOp::GeluTanh:
      return map(x, y, n, [](float v) { return 0.5f * v * (1.0f + fast_tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v))); });
    case UnaryOp::Silu: return map(x, y, n, [](float v) { return v * fast_sigmoid(v); });
  }
}

template <class F>
static void map_backward(const float* x, const float* y, const float* dy, float* dx, int64_t n, F f) {
  for_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * f(x[i], y ? y[i] : 0.0f);
  });
}

void unary_backward(UnaryOp op, const float* x, const float* y, const float* dy, float* dx, int64_t n) {
  switch (op) {
    case UnaryOp::Exp: return map_backward(x, y, dy, dx, n, [](float, float fy) { return fy; });
    case UnaryOp::Log: return map_backward(x, y, dy, dx, n, [](float v, float) { return 1.0f / v; });
    case UnaryOp::Tanh: return map_backward(x, y, dy, dx, n, [](float, float fy) { return 1.0f - fy * fy; });
    case UnaryOp::Sigmoid: return map_backward(x, y, dy, dx, n, [](float, float fy) { return fy * (1.0f - fy); });
    case UnaryOp::Relu: return map_backward(x, y, dy, dx, n, [](float v, float) { return v > 0.0f ? 1.0f : 0.0f; });
    case UnaryOp::Gelu: return map_backward(x, y, dy, dx, n, [](float v, float) { return fast_gelu_grad(v); });
    case UnaryOp::GeluTanh:
      return map_backward(x, y, dy, dx, n, [](float v, float) {
        float t = fast_tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v));
        return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
      });
    case UnaryOp::Silu:
      return map_backward(x, y, dy, dx, n, [](float v, float) {
        float s = fast_sigmoid(v);
        return s * (1.0f + v * (1.0f - s));
      });
  }
}

namespace {

// Columns [i0, end) of the n rows at x (row stride inner), at most
// kSumColumns of them, each summed over the rows in order, into y[i0..]. The sums stay
// in registers from row to row: added into y itself, every row's adds waited
// on the last row's stores (y may alias x, so the compiler kept them in
// memory), and a bias gradient of 2,048 x 384 ran at 24 GB/s a core from L2.
constexpr int64_t kSumColumns = 64;
void sum_columns(const float* x, int64_t inner, int64_t n, int64_t i0, int64_t end, float* y) {
  float acc[kSumColumns] = {};
  const float* col = x + i0;
  if (end - i0 == kSumColumns) {
    for (int64_t r = 0; r < n; ++r)
#pragma GCC unroll 64
      for (int64_t i = 0; i < kSumColumns; ++i) acc[i] += col[r * inner + i];
  } else {
    const int64_t w = end - i0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < w; ++i) acc[i] += col[r * inner + i];
  }
  std::copy(acc, acc + (end - i0), y + i0);
}

}  // namespace

void sum_middle(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
  if (inner == 1) {  // contiguous rows: one dot-free reduction per row
#pragma omp parallel for schedule(static) if (outer * n >= kParallelGrain && outer > 1)
    for (int64_t o = 0; o < outer; ++o) {
      const float* row = x + o * n;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t r = 0;
      for (; r + 8 <= n; r += 8)
        for (int k = 0; k < 8; ++k) acc[k] += row[r + k];
      float s = 0;
      for (; r < n; ++r) s += row[r];
      y[o] = s + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
    return;
  }
  // Reduce over rows: accumulate whole rows of `inner` elements, split over
  // (o, column block). Blocks of up to 256 columns, narrower when there are
  // too few to share: a bias gradient (outer 1, 128 or 384 columns) had one
  // or two blocks, and the first thread summed all or two thirds of it;
  // about one block a thread, so that 384 columns make two blocks of three
  // whole register chunks (sum_columns) each. Each column still sums its
  // rows in order, whatever the blocks.
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t block = std::clamp<int64_t>((inner / (threads * std::max<int64_t>(outer, 1)) + 15) / 16 * 16, 16, 256);
  const int64_t blocks = (inner + block - 1) / block;
#pragma omp parallel for schedule(static) if (outer * n * inner >= kParallelGrain && outer * blocks > 1)
  for (int64_t ob = 0; ob < outer * blocks; ++ob) {
    int64_t o = ob / blocks, c0 = (ob % blocks) * block, c1 = std::min(inner, c0 + block);
    for (int64_t i0 = c0; i0 < c1; i0 += kSumColumns)
      sum_columns(x + o * n * inner, inner, n, i0, std::min(c1, i0 + kSumColumns), y + o * inner);
  }
}

}  // namespace qkv::cpu::QKV_CPU_NS
