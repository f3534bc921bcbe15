// Internal: the compute kernels, in two twins with identical signatures.
//
//   qkv::ref  naive loops, written to be obviously right; the specification.
//   qkv::cpu  the fast versions (OpenBLAS, OpenMP, vectorizable inner loops),
//             compiled once per instruction-set level (qkv/cpu.h) into
//             qkv::cpu::generic, ::avx2 and ::avx512; cpu::kernels() is the
//             table of the level chosen at start-up.
//
// Every op in src/ops dispatches between them at one point (QKV_KERNEL in
// src/ops/dispatch.h), and tests/test_ops.cpp runs every op both ways and
// compares; CTest runs those tests again under each level the CPU supports.
// All pointers are to contiguous float32 row-major data unless strides are given.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/cpu.h"

namespace qkv {

enum class BinaryOp { Add, Sub, Mul, Div };
enum class UnaryOp { Exp, Log, Tanh, Sigmoid, Relu, Gelu, GeluTanh, Silu };

// C[M,N] = alpha * op(A) op(B) + beta * C + bias, row-major; op(X) = X or X^T.
// A is [M,K] (or [K,M] when trans_a) with row stride lda; likewise B, C.
// Epilogue, in this order: bias (optional, [N]) is added to every row of C;
// then, when act_out is set, act_out [M,N] (row stride ld_act) = act(C);
// act_out == c applies it in place.
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
  const float* bias = nullptr;
  UnaryOp act = UnaryOp::Relu;
  float* act_out = nullptr;
  int64_t ld_act = 0;
};

// A broadcast loop: out (contiguous, `shape`) = a op b, where a and b are read
// through `a_strides` / `b_strides` (0 along broadcast dimensions).
struct BroadcastLoop {
  std::vector<int64_t> shape, a_strides, b_strides;
};

#define QKV_DECLARE_KERNELS                                                                                        \
  void gemm(const GemmArgs& g);                                                                                    \
  void binary(BinaryOp op, const BroadcastLoop& loop, const float* a, const float* b, float* out);               \
  /* out = mask ? value : x, mask (U8) read through b_strides of loop, x through a_strides */                     \
  void masked_fill(const BroadcastLoop& loop, const float* x, const uint8_t* mask, float value, float* out);      \
  void unary_forward(UnaryOp op, const float* x, float* y, int64_t n);                                            \
  /* dx = dy * f'(x); y = f(x) is given for ops whose derivative is cheaper from it */                           \
  void unary_backward(UnaryOp op, const float* x, const float* y, const float* dy, float* dx, int64_t n);        \
  /* y[o,i] = sum_r x[o,r,i] for x [outer, n, inner] */                                                          \
  void sum_middle(const float* x, float* y, int64_t outer, int64_t n, int64_t inner);                            \
  void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols);                                    \
  void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols);                 \
  void log_softmax_forward(const float* x, float* y, int64_t rows, int64_t cols);                                \
  void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols);             \
  /* w, b may be null (no affine); mean and rstd [rows] are saved for backward */                                \
  void layer_norm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,    \
                          int64_t rows, int64_t cols, float eps);                                                \
  /* dx may be null; dw, db (may be null) are overwritten with the sums over rows */                             \
  void layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy, \
                           float* dx, float* dw, float* db, int64_t rows, int64_t cols);                          \
  void rms_norm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,       \
                        float eps);                                                                              \
  void rms_norm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx,          \
                         float* dw, int64_t rows, int64_t cols);                                                 \
  /* out[t,:] = weight[ids[t],:] */                                                                              \
  void embedding_forward(const float* weight, const int64_t* ids, float* out, int64_t tokens, int64_t dim);      \
  /* dweight[ids[t],:] += dout[t,:] (dweight zeroed by the caller) */                                            \
  void embedding_backward(const float* dout, const int64_t* ids, float* dweight, int64_t tokens, int64_t dim);   \
  /* Per row: loss[r] = (1-eps) * -logp[t] + eps/V * sum_v -logp[v] (0 for ignored rows); lse[r] saved */        \
  void cross_entropy_forward(const float* logits, const int64_t* targets, float* loss, float* lse, int64_t rows,  \
                             int64_t vocab, int64_t ignore_index, float smoothing);                              \
  /* dlogits = scale * (softmax - (1-eps) onehot - eps/V); rows with ignored targets get 0 */                   \
  void cross_entropy_backward(const float* logits, const int64_t* targets, const float* lse, float scale,        \
                              float* dlogits, int64_t rows, int64_t vocab, int64_t ignore_index, float smoothing); \
  /* RoPE on x [rows, t_len, dh]: channels (i, i + dh/2) of position p = offset + t rotated by */                 \
  /* sign * p * theta^(-2i/dh) (sign -1: the transpose, for the backward) */                                     \
  void rope(const float* x, float* y, int64_t rows, int64_t t_len, int64_t dh, int64_t offset, float theta,       \
            float sign);

namespace ref {
QKV_DECLARE_KERNELS
}

namespace cpu {

struct FlashShape;

// One level's fast kernels: the same functions as qkv::ref, plus the flash
// attention pair (src/kernels/cpu/flash_attention.h), whose reference twin is
// the naive attention op.
struct Kernels {
  CpuIsa isa;
  decltype(&ref::gemm) gemm;
  decltype(&ref::binary) binary;
  decltype(&ref::masked_fill) masked_fill;
  decltype(&ref::unary_forward) unary_forward;
  decltype(&ref::unary_backward) unary_backward;
  decltype(&ref::sum_middle) sum_middle;
  decltype(&ref::softmax_forward) softmax_forward;
  decltype(&ref::softmax_backward) softmax_backward;
  decltype(&ref::log_softmax_forward) log_softmax_forward;
  decltype(&ref::log_softmax_backward) log_softmax_backward;
  decltype(&ref::layer_norm_forward) layer_norm_forward;
  decltype(&ref::layer_norm_backward) layer_norm_backward;
  decltype(&ref::rms_norm_forward) rms_norm_forward;
  decltype(&ref::rms_norm_backward) rms_norm_backward;
  decltype(&ref::embedding_forward) embedding_forward;
  decltype(&ref::embedding_backward) embedding_backward;
  decltype(&ref::cross_entropy_forward) cross_entropy_forward;
  decltype(&ref::cross_entropy_backward) cross_entropy_backward;
  decltype(&ref::rope) rope;
  void (*flash_attention_forward)(const FlashShape& f, const float* q, const float* k, const float* v, float* out,
                                  float* lse);
  void (*flash_attention_backward)(const FlashShape& f, const float* q, const float* k, const float* v,
                                   const float* out, const float* dout, const float* lse, float* dq, float* dk,
                                   float* dv);
};

// The table of the level in use (qkv::cpu_isa()): what every op calls.
const Kernels& kernels();
// One level's table; a level the CPU cannot run is a qkv::Error.
const Kernels& kernels(CpuIsa isa);

// Inside a kernel variant's own files (compiled with QKV_CPU_NS set to its
// level's name), the variant's functions; they call each other directly.
#ifdef QKV_CPU_NS
namespace QKV_CPU_NS {
QKV_DECLARE_KERNELS
const Kernels& table();
}  // namespace QKV_CPU_NS
#endif

}  // namespace cpu

#undef QKV_DECLARE_KERNELS

}  // namespace qkv
