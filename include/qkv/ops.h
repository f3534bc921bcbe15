// qkv/ops.h — differentiable operations on Tensors.
//
// Every op checks its inputs (one clear qkv::Error on a wrong shape or dtype),
// computes with the fast CPU kernels (or the reference kernels inside a
// ReferenceKernelsGuard), and records its backward on the tape when an input
// requires a gradient. Compute ops take F32 tensors of any layout.
//
// Shape names: B batch, T length, D width, V vocabulary, M/K/N matrix sizes;
// "..." is any number of leading dimensions.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

// --- element-wise with broadcasting (NumPy rules) ---
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, float s);       // x * s
Tensor add_scalar(const Tensor& x, float s);  // x + s
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator*(const Tensor& x, float s) { return scale(x, s); }
// In place, not recorded: acc += x (x broadcast to acc's shape). For gradients and optimizers.
void add_(Tensor& acc, const Tensor& x);
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Sums `g` down to `shape` (the reverse of broadcasting `shape` up to g's shape).
Tensor sum_to(const Tensor& g, const Shape& shape);

// --- activations and other unary maps ---
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
enum class GeluApproximation { None, Tanh };  // PyTorch's approximate="none" | "tanh"
Tensor gelu(const Tensor& x, GeluApproximation approximation = GeluApproximation::None);
Tensor silu(const Tensor& x);  // x * sigmoid(x)

// --- reductions ---
struct ReduceOptions {
  bool keepdim = false;
};
Tensor sum(const Tensor& x);  // all elements -> scalar []
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, ReduceOptions options = {});
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, ReduceOptions options = {});

// --- matrix products ---
// a [..., M, K] @ b [..., K, N] -> [..., M, N]; batch dims broadcast. A 2-D b
// is shared by every batch. Transposed views go to BLAS as transpose flags.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x W^T + b, as torch.nn.functional.linear: x [..., in], weight [out, in],
// bias [out] or undefined -> [..., out]. The GEMM adds the bias to its output
// rows as it finishes them. A BF16 weight (inference only: no input may need
// a gradient) multiplies x rounded to bfloat16, with float32 sums (AMX tiles
// or AVX512-BF16 where the CPU has them; `qkv info` says which).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// residual + linear(x, weight, bias): a Transformer block's skip connection
// around its attention or MLP. With a float32 weight (outside autocast) and
// a float32 residual of the output's shape, the GEMM adds the residual to each
// block of the output as it stores it, instead of a pass of its own over both:
// the same bits as add(residual, linear(x, weight, bias)), which is what it
// computes otherwise (a BF16, F16 or I8 weight, autocast, a broadcast residual).
Tensor linear_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual);
// Mixed precision (per thread, as torch.autocast): while a Bf16AutocastGuard
// is alive on this thread, linear() with a float32 weight multiplies in
// bfloat16 (x and W rounded to bfloat16 as the GEMM packs them, float32
// sums and output), and so does its backward (dy, W and x rounded the same
// way; dW comes out in float32 for the float32 master weight), whenever it
// runs: the choice is recorded with the op. So does flash attention of at
// least kBf16AttentionLength queries and keys (its tile products; softmax
// and sums in float32). Everything else stays float32.
bool bf16_autocast();
// Under Bf16AutocastGuard, attention takes bfloat16 products from this many
// queries and keys on (the kernels' key tile, where they pack bfloat16
// operands for AMX or AVX512-BF16). Shorter sequences stay float32: their
// products are small and their bfloat16 form is float32 GEMMs on rounded
// copies of q, k, v and dO, slower and less precise (the copies alone took
// 6.7% of a bf16 ViT training step of 16 tokens; Intel Xeon, family 6
// model 167).
constexpr int64_t kBf16AttentionLength = 128;
class Bf16AutocastGuard {
public:
  explicit Bf16AutocastGuard(bool enabled = true);
  ~Bf16AutocastGuard();
  Bf16AutocastGuard(const Bf16AutocastGuard&) = delete;
  Bf16AutocastGuard& operator=(const Bf16AutocastGuard&) = delete;
private:
  bool previous_;
};
// What a training run multiplies in: "precision" in a config's train section.
enum class Precision { F32, Bf16 };
// The nonlinearities of an MLP (their config names: src/config/names.h).
enum class Activation { Relu, Gelu, GeluTanh, Silu, Tanh };
// act(x W^T + b): the same values as the linear and the activation one after
// the other, with the activation applied by each GEMM thread to its rows of
// the product while they are in its cache.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation activation);

// A BF16 weight [out, in] as this CPU's gemm_bf16 reads it (its packed
// layout, I32 words), for a weight used many times: Linear keeps one in
// inference instead of the weight itself, so that no product packs W on
// every call. Undefined where gemm_bf16 reads W as it lies (no AMX or
// AVX512-BF16, or a lower kernel level), and where the copy would take the
// memory in use past memory_limit() (a model whose weights fill the
// machine runs with some or none packed: slower, and up to 4 rows summed in
// another order, within the same bound).
Tensor pack_bf16_weight(const Tensor& weight);
// The weight again, from its pack_bf16_weight: the same bits.
Tensor unpack_bf16_weight(const Tensor& packed, int64_t out_features, int64_t in_features);
// linear() with a BF16 weight and its pack_bf16_weight (undefined: none).
// The weight may be on the meta device (shape only) when `packed` is given.
// Bit for bit linear()'s product for more than 4 rows of x; up to 4 rows
// read the packed copy in a GEMV of its own, whose sums run in another
// order (each within the same bound of the exact product).
//
// x may be BF16 (here and in linear() with a BF16 weight): it is then read
// as it lies where the kernels can (in a multiple of 32). out = BF16 writes
// y in bfloat16: each element the float32 sum, bias and activation, rounded
// once. A chain of such products (an MLP's hidden layer: MLP::forward with
// BF16 weights) moves half the bytes of a float32 one.
Tensor linear_bf16(const Tensor& x, const Tensor& weight, const Tensor& packed, const Tensor& bias = Tensor(),
                   const Activation* activation = nullptr, DType out = DType::F32);

// Blockwise int8 weights (docs/low-precision.md): W [out, in] as int8 values
// [out, in] and one float32 scale per row per block of 32 along `in`, scales
// [out, ceil(in / 32)]; W[j, p] ~= values[j, p] * scales[j, p / 32], the
// values in [-127, 127] (qkv::int8_quantize).
struct Int8Weight {
  Tensor values, scales;
};
// w (F32, BF16 or F16, [out, in]) quantized.
Int8Weight quantize_int8(const Tensor& w);
// The float32 weight the int8 one stands for.
Tensor dequantize_int8(const Int8Weight& w);
// Checks that `w` is one (dtypes, shapes, no -128, finite non-negative
// scales); each problem one error naming `what`.
void check_int8_weight(const Int8Weight& w, const std::string& what);
// linear() with an int8 weight, for inference (no input may need a
// gradient): x is quantized per row per block of 32 as it is read, each
// block's products summed exactly in int32 (AVX512-VNNI where the CPU has
// it), the blocks in float32; then bias and activation in float32.
Tensor linear_int8(const Tensor& x, const Int8Weight& weight, const Tensor& bias = Tensor(),
                   const Activation* activation = nullptr);

// --- softmax family (last axis) ---
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);

// --- normalization over the last axis ---
// weight and bias [D] may be undefined (no affine transform).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps = 1e-6f);

// --- lookup, regularization, masking ---
// weight [V, D], ids (I64 or I32) [...] -> [..., D]; an id outside [0, V) is an error.
Tensor embedding(const Tensor& weight, const Tensor& ids);
// out [rows, D]: zeros, then out[ids[m], :] += src[m, :] for each m (the adjoint
// of embedding: a scatter-add). src [M, D], ids (I64) [M] in [0, rows).
Tensor index_add_rows(const Tensor& src, const Tensor& ids, int64_t rows);
// Zeroes each element with probability p and scales the rest by 1/(1-p);
// identity when `training` is false or p == 0. Numbers come from `rng`.
struct DropoutOptions {
  float p = 0.1f;
  bool training = true;
};
Tensor dropout(const Tensor& x, Rng& rng, DropoutOptions options);
// out = mask ? value : x; mask is U8 (nonzero = fill) broadcastable to x.
Tensor masked_fill(const Tensor& x, const Tensor& mask, float value);

// --- joining and splitting ---
Tensor concat(const std::vector<Tensor>& parts, int64_t dim);
// Views of consecutive pieces along `dim` with the given sizes (summing to the size of dim).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);

// --- loss ---
struct CrossEntropyOptions {
  int64_t ignore_index = -100;   // targets equal to it contribute nothing
  float label_smoothing = 0.0f;  // as torch: (1-eps) one-hot + eps / V
};
// logits [N, V], targets (I64) [N] -> scalar: mean over targets that are not ignored.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, CrossEntropyOptions options = {});

}  // namespace qkv
