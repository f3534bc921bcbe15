// Internal: the compute kernels, behind one table per device.
//
//   qkv::ref  naive loops, written to be obviously right; the specification.
//   qkv::cpu  the fast versions (OpenBLAS, OpenMP, vectorizable inner loops),
//             compiled once per instruction-set level (qkv/cpu.h) into
//             qkv::cpu::generic, ::avx2 and ::avx512.
//
// Both fill the same struct, Kernels; kernels_for(device) is the one place
// that picks a table (the CPU level in use, or the reference twins inside a
// ReferenceKernelsGuard), and every op and optimizer calls through it
// (QKV_KERNEL in src/ops/dispatch.h): no op, optimizer or tensor routine
// holds an OpenMP loop or a loop over elements of its own. tests/test_ops.cpp
// runs every op both ways and compares; CTest runs those tests again under
// each level the CPU supports. A CUDA device would add its own table.
// All pointers are to contiguous float32 row-major data unless strides are given.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/cpu.h"
#include "qkv/device.h"
#include "qkv/dtype.h"
#include "qkv/rng.h"

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
  // Nothing will be differentiated through C (decoding, serving): a product of
  // 5 to 64 rows may then take the avx512 register tiles, whose sums are
  // rounded in another order than BLAS's. Training keeps one kernel for
  // every row count, so that a batch split between processes sums as the
  // whole batch does.
  bool inference = false;
  // Optional, [m, n] with row stride ld_addend: added to C after alpha, beta
  // and the bias, before the activation (a residual connection x + f(x),
  // added as the product is stored instead of in a pass of its own). The
  // sum is rounded once more, so C holds the bits of adding it afterwards.
  const float* addend = nullptr;
  int64_t ld_addend = 0;
};

// The bfloat16 GEMM: C[M,N] = alpha * A B^T + beta * C + bias, A [M,K] and
// B [N,K] (a Linear weight's layout) bfloat16 as raw bits with row strides
// lda, ldb; C float32. Every product of two bfloat16 values is exact in
// float32, so the only rounding is that of the float32 sums (and of C).
// bias (optional, [N]) is added to every row last.
//
// Either operand may be given in float32 instead (a_f32 with a null, b_f32
// with b null): it is then rounded to bfloat16 (to nearest, ties to even) as
// it is read, the way activations meet a bfloat16 weight, and the way
// mixed-precision training meets its float32 weights and gradients. Either
// may be held transposed (a_transposed: A is stored as A^T, [K,M] with row
// stride lda, element (i, p) at a[p * lda + i]; b_transposed: B stored as
// [K,N]), the layouts the backward of a Linear layer reads.
struct GemmBf16Args {
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const uint16_t* a = nullptr;
  const float* a_f32 = nullptr;
  int64_t lda = 0;
  bool a_transposed = false;
  const uint16_t* b = nullptr;
  const float* b_f32 = nullptr;
  int64_t ldb = 0;
  bool b_transposed = false;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
  const float* bias = nullptr;
  // C in bfloat16 instead (c is then not read): each element computed as
  // above in float32 (beta reading C widened), then rounded to nearest, ties
  // to even, as qkv::float_to_bf16 rounds. Row stride ldc. For a chain of
  // bfloat16 activations, whose next product reads this one's C as its A.
  uint16_t* c_bf16 = nullptr;
  // With c_bf16 only: act applied to each element (after alpha, beta and the
  // bias) before its rounding, as unary_forward computes it: an MLP's hidden
  // layer, written once in bfloat16 for its second product to read.
  bool has_act = false;
  UnaryOp act = UnaryOp::Relu;
  // With a float32 C: where act_out is set, act of each element of C as
  // stored, written to act_out (row stride ld_act; it may be c itself), C
  // keeping the values before it. A Linear's activation under mixed
  // precision: its pre-activation kept for the backward, its output computed
  // while the block of C is in L1, not in a pass over C after.
  float* act_out = nullptr;
  int64_t ld_act = 0;
  // B as this level's gemm_bf16 packs it (gemm_bf16_pack_b of the same b,
  // ldb, n and k), when the caller keeps it from call to call (a Linear
  // weight in inference): the kernel then reads it instead of packing B
  // again, and b may be null (a Linear keeps only the packed copy).
  const uint32_t* b_packed = nullptr;
  // Where set, with A given in float32 (a_f32): each row's sum over k of A as
  // given (before any rounding), into a_sums[0, m), in float32. A Linear's
  // bias gradient under mixed precision: dW = dy^T x reads every element of
  // dy (its A) as it packs it, and sums its columns on the way, where a pass
  // of its own read dy from memory again (3% of a bf16 ViT training step).
  // The order of the additions is fixed by m and k alone, not by the threads.
  float* a_sums = nullptr;
  // Nothing will be differentiated through C (a Linear's bfloat16 weight in
  // inference): on a CPU without AVX512-BF16, up to 64 rows of A against a B
  // given as it lies (b, not transposed) then take gemm's register tiles,
  // each row summed alike whatever the rows beside it (GemmArgs::inference).
  bool inference = false;
};

// The float16-weight GEMM: C[M,N] = alpha * A W^T + beta * C + bias, with W
// [N,K] IEEE half as raw bits (row stride ldb) and A [M,K] float32 (row
// stride lda), used as it is: each product is a float32 one of A and the
// widened (exact) weight, summed in float32. For Linear weights stored in
// float16 (inference).
struct GemmF16Args {
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0;
  const uint16_t* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
  const float* bias = nullptr;
};

// The int8-weight GEMM: C[M,N] = alpha * A W^T + beta * C + bias, with W
// [N,K] held as int8 values q (row stride ldb) and one float32 scale per row
// per block of 32 along k (scales [N, ceil(K/32)], row stride ld_scale):
// W[j,p] = q[j,p] * scales[j, p/32]. q never holds -128 (the quantizer makes
// [-127, 127]; loading refuses -128). A float32 [M,K] is quantized the same
// way as it is read, per row per block of 32 (qkv::int8_block_scale and
// int8_round in qkv/dtype.h), so that each block's sum of products is an
// exact int32; C sums those over the blocks in float32, each times the
// float32 product of its two scales.
constexpr int64_t kInt8Block = 32;
struct GemmInt8Args {
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0;
  const int8_t* b = nullptr;
  int64_t ldb = 0;
  const float* scales = nullptr;
  int64_t ld_scale = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
  const float* bias = nullptr;
};

// A broadcast loop: out (contiguous, `shape`) = a op b, where a and b are read
// through `a_strides` / `b_strides` (0 along broadcast dimensions).
struct BroadcastLoop {
  std::vector<int64_t> shape, a_strides, b_strides;
};

// Flash attention. Where the rows of one operand lie: element strides between
// batches, heads and rows; each row's Dh (or Dv) elements are contiguous. A
// zero stride means the contiguous layout [B, heads, rows, D].
struct FlashLayout {
  int64_t batch = 0, head = 0, row = 0;
};

// q [B,H,T,Dh], k [B,Hkv,S,Dh], v [B,Hkv,S,Dv], out [B,H,T,Dv], lse [B,H,T]
// (contiguous). The layouts let q, k, v and out (with dout) lie elsewhere: the
// first S rows of a larger KV cache, or the heads side by side on each row of
// a packed [B, T, (H + 2 Hkv) Dh] projection. dq, dk, dv take the layouts of
// q, k, v. Query row i of batch b sees keys [0, min(key_lengths[b], i + S - T
// + 1 when causal)).
struct FlashShape {
  int64_t batch = 0, heads = 0, kv_heads = 0, t = 0, s = 0, dh = 0, dv = 0;
  FlashLayout q, k, v, o;
  float scale = 1.0f;
  bool causal = false;
  const int64_t* key_lengths = nullptr;  // [B] or null
  // Batches whose keys and values lie in buffers of their own (the KV caches
  // of sequences decoded together, `qkv serve`'s streams): batch b's keys at
  // k_batches[b], its heads k.head and its rows k.row apart (k.batch and the
  // k pointer unused); v likewise. Forward only, and not with bf16.
  const float* const* k_batches = nullptr;
  const float* const* v_batches = nullptr;
  // Products in bfloat16 (gemm_bf16: each operand rounded to bfloat16 as it is
  // packed, float32 sums), as under torch.autocast; the softmax, its
  // statistics (max, sum, lse), the rescaling and dout . out stay float32.
  bool bf16 = false;
};

// dst = src element by element, both walking `shape` row-major through their
// own strides (in elements of elem_size bytes); any dtype, at most
// kMaxCopyRank dimensions (the caller checks).
constexpr int64_t kMaxCopyRank = 64;
struct StridedCopy {
  int64_t rank = 0;
  const int64_t* shape = nullptr;  // [rank], as are the strides
  const int64_t* src_strides = nullptr;
  const int64_t* dst_strides = nullptr;
  size_t elem_size = 4;
  const void* src = nullptr;
  void* dst = nullptr;
};

// A run of floats, one of the tensors a multi-tensor kernel updates.
struct FloatSpan {
  float* data = nullptr;
  int64_t n = 0;
};

// One parameter of an optimizer step: its values, gradient and state buffers
// (m and v for AdamW, m the velocity for SGD), each n floats.
struct ParamSpan {
  float* p = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
};

// AdamW (decoupled weight decay), with the step's bias corrections folded in:
//   p *= decay;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
struct AdamWStep {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, step_size = 0, bc2_sqrt = 1, decay = 1;
};
// SGD: g' = g + weight_decay p;  m = momentum m + g';  p -= lr (momentum ? m : g')
struct SgdStep {
  float lr = 0, momentum = 0, weight_decay = 0;
};

#define QKV_DECLARE_KERNELS                                                                                        \
  void gemm(const GemmArgs& g);                                                                                    \
  /* how gemm runs a decoding step's products here: "register tiles of 16 lanes for 1 to 64 rows ...", ... */     \
  const char* gemm_decode_path();                                                                                  \
  /* how gemm runs the other products here: "own panels: ...", or "BLAS" */                                        \
  const char* gemm_f32_path();                                                                                     \
  void gemm_bf16(const GemmBf16Args& g);                                                                           \
  /* how gemm_bf16 runs here: "AMX-BF16 tiles", "AVX512-BF16", "float32 BLAS on widened inputs", ... */            \
  const char* gemm_bf16_path();                                                                                    \
  /* 32-bit words of a bfloat16 B [n, k] packed as gemm_bf16 reads it here; 0: it never reads one packed */      \
  int64_t gemm_bf16_packed_b_words(int64_t n, int64_t k);                                                          \
  /* g's B (bfloat16, as it lies) packed into out (that many words), for GemmBf16Args::b_packed */                 \
  void gemm_bf16_pack_b(const GemmBf16Args& g, uint32_t* out);                                                     \
  /* the inverse: B [n, k] (row stride k) from what gemm_bf16_pack_b wrote */                                      \
  void gemm_bf16_unpack_b(int64_t n, int64_t k, const uint32_t* packed, uint16_t* out);                            \
  void gemm_f16(const GemmF16Args& g);                                                                             \
  /* how gemm_f16 runs here: "F16C widening in registers (rows streamed up to 4), ...", ... */                      \
  const char* gemm_f16_path();                                                                                     \
  void gemm_int8(const GemmInt8Args& g);                                                                           \
  /* how gemm_int8 runs here: "AVX512-VNNI (rows streamed up to 4, register-blocked tiles above)", ... */   \
  const char* gemm_int8_path();                                                                                    \
  void binary(BinaryOp op, const BroadcastLoop& loop, const float* a, const float* b, float* out);               \
  /* out = mask ? value : x, mask (U8) read through b_strides of loop, x through a_strides */                     \
  void masked_fill(const BroadcastLoop& loop, const float* x, const uint8_t* mask, float value, float* out);      \
  void unary_forward(UnaryOp op, const float* x, float* y, int64_t n);                                            \
  /* dx = dy * f'(x); y = f(x) is given for ops whose derivative is cheaper from it */                           \
  void unary_backward(UnaryOp op, const float* x, const float* y, const float* dy, float* dx, int64_t n);        \
  /* y[o,i] = sum_r x[o,r,i] for x [outer, n, inner] */                                                          \
  void sum_middle(const float* x, float* y, int64_t outer, int64_t n, int64_t inner);                            \
  /* y[0, n) = x[0, n) converted from one of F32, F16, BF16 to another (or the same), the bits of the */          \
  /* scalar conversions in qkv/dtype.h (float_to_bf16, float_to_half, half_to_float) */                          \
  void convert_floats(DType from, const void* x, DType to, void* y, int64_t n);                                  \
  /* x [rows, cols] in blocks of kInt8Block along each row: scales [rows, blocks] from int8_block_scale, */       \
  /* q [rows, cols] from int8_quantize with the block's scale (the bits those give) */                            \
  void quantize_int8_rows(const float* x, int8_t* q, float* scales, int64_t rows, int64_t cols);                 \
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
  /* the pair (i, i + dh/2) of position offset + t turns by sign * (offset + t) * freq[i] (dh/2 of them) */      \
  void rope(const float* x, float* y, int64_t rows, int64_t t_len, int64_t dh, int64_t offset,                   \
            const double* freq, float sign);                                                                     \
  /* g as one product of batch many: product i reads a + a_offsets[i], b + b_offsets[i] and writes */           \
  /* c + i * c_stride (k == 0 writes zeros); no bias or activation */                                           \
  void gemm_batched(const GemmArgs& g, int64_t batch, const int64_t* a_offsets, const int64_t* b_offsets,         \
                    int64_t c_stride);                                                                           \
  void strided_copy(const StridedCopy& c);                                                                       \
  /* acc += x */                                                                                                 \
  void accumulate(float* acc, const float* x, int64_t n);                                                        \
  /* mask[i] = 0 where uniform number first + i of rng is below p, else 1 / (1 - p) */                           \
  void dropout_mask(const Rng& rng, uint64_t first, float p, float* mask, int64_t n);                            \
  /* Writes out and lse (log-sum-exp of each query row's scaled scores; -inf for a row that sees no key, */      \
  /* whose output is 0); lse may be null where nothing will differentiate out (no logarithms then) */            \
  void flash_attention_forward(const FlashShape& f, const float* q, const float* k, const float* v, float* out,  \
                               float* lse);                                                                      \
  /* Writes every element of dq, dk and dv (the caller need not clear them) */                                  \
  void flash_attention_backward(const FlashShape& f, const float* q, const float* k, const float* v,             \
                                const float* out, const float* dout, const float* lse, float* dq, float* dk,     \
                                float* dv);                                                                      \
  void adamw_step(const AdamWStep& s, const std::vector<ParamSpan>& params);                                     \
  void sgd_step(const SgdStep& s, const std::vector<ParamSpan>& params);                                         \
  /* sum of x^2 over every span, in double */                                                                    \
  double sum_of_squares(const std::vector<FloatSpan>& spans);                                                    \
  void scale_spans(const std::vector<FloatSpan>& spans, float s);

namespace ref {
QKV_DECLARE_KERNELS
}

// Every kernel by name, once: the fields of Kernels below and the entries of
// each table (src/kernels/cpu/table.cpp, src/kernels/ref/table.cpp) come from
// this list, so no table can miss a kernel or put one in another's place.
#define QKV_KERNEL_LIST(X) X(gemm) X(gemm_decode_path) X(gemm_f32_path) X(gemm_bf16) X(gemm_bf16_path) X(gemm_bf16_packed_b_words) X(gemm_bf16_pack_b) X(gemm_bf16_unpack_b) X(gemm_f16) X(gemm_f16_path) X(gemm_int8) X(gemm_int8_path) X(binary) X(masked_fill) X(unary_forward) X(unary_backward) X(sum_middle) X(convert_floats) X(quantize_int8_rows)         \
  X(softmax_forward) X(softmax_backward) X(log_softmax_forward) X(log_softmax_backward) X(layer_norm_forward)        \
  X(layer_norm_backward) X(rms_norm_forward) X(rms_norm_backward) X(embedding_forward) X(embedding_backward)         \
  X(cross_entropy_forward) X(cross_entropy_backward) X(rope) X(gemm_batched) X(strided_copy) X(accumulate)           \
  X(dropout_mask) X(flash_attention_forward) X(flash_attention_backward) X(adamw_step) X(sgd_step) X(sum_of_squares) \
  X(scale_spans)

// One device's kernels (or one instruction-set level's): the functions above.
struct Kernels {
  const char* name;  // "reference", "cpu generic", "cpu avx2", "cpu avx512"
  Device device;
  CpuIsa isa;  // the level of a CPU table (Generic for the reference)
#define QKV_KERNEL_FIELD(name) decltype(&ref::name) name;
  QKV_KERNEL_LIST(QKV_KERNEL_FIELD)
#undef QKV_KERNEL_FIELD
};

// The entries of a table, in a designated initializer: `.gemm = &gemm, ...`
// of the namespace it is written in.
#define QKV_KERNEL_ENTRY(name) .name = &name,
#define QKV_KERNEL_ENTRIES QKV_KERNEL_LIST(QKV_KERNEL_ENTRY)

// The table of kernels for tensors on `device`: on the CPU, the level in use
// (qkv::cpu_isa()), or the reference twins for this thread inside a
// ReferenceKernelsGuard. The meta device has none (an error).
const Kernels& kernels_for(Device device);

namespace ref {
const Kernels& table();
}

namespace cpu {

// The table of the level in use (qkv::cpu_isa()).
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

// cpu_info().has(feature), for the kernel variants (which may build no
// std::string of their own: see scripts/check_kernel_variants.sh).
bool has_feature(const char* feature);

// The avx512 level's paths of gemm_bf16, each callable where its `_usable`
// says so (gemm_bf16 takes the first usable one; the tests run them all):
// AMX tiles (the CPU has AMX-BF16 and Linux granted the tile state), then
// AVX512-BF16's dot-product instruction, then float32 BLAS on widened copies.
namespace avx512 {
// The CPU has AMX tiles and Linux granted this process their state (asked once).
bool amx_tile_state_granted();
bool amx_bf16_usable();
void gemm_bf16_amx(const GemmBf16Args& g);
bool avx512_bf16_usable();
void gemm_bf16_avx512_bf16(const GemmBf16Args& g);
void gemm_bf16_widened(const GemmBf16Args& g);
// gemm_int8's paths: AMX-INT8 tiles (from 24 rows; AVX512-VNNI's below),
// AVX512-VNNI integer dot products (rows of A streamed up to 4,
// register-blocked tiles above), float32 BLAS on dequantized copies
// (any m), and what the avx512 level runs without VNNI: AVX2's pair sums up
// to 64 rows, dequantized above.
bool amx_int8_usable();
void gemm_int8_amx(const GemmInt8Args& g);
bool avx512_vnni_usable();
void gemm_int8_vnni(const GemmInt8Args& g);
void gemm_int8_dequantized(const GemmInt8Args& g);
void gemm_int8_pairs(const GemmInt8Args& g);
}  // namespace avx512

}  // namespace cpu

#undef QKV_DECLARE_KERNELS

}  // namespace qkv
