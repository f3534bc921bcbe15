// The op table: every op, forward and backward, fast kernels against the
// reference kernels, and every backward against central finite differences.
// Inputs include odd sizes, broadcasts and non-contiguous views.
#include <omp.h>

#include <functional>

#include "qkv/nn.h"
#include "qkv/ops.h"
#include "qkv/position.h"
#include "qkv/rng.h"
#include "src/kernels/kernels.h"
#include "tests/test_util.h"
// The kernels' math functions, compiled here for this file's instruction set
// (each kernel variant has its own copy; the op table checks those).
#define QKV_CPU_NS test_copy
#include "src/kernels/cpu/vec_math.h"
#undef QKV_CPU_NS

namespace qkv {
namespace {

using testing::all_close;

enum class Values { Normal, Positive, AwayFromZero };
enum class Layout { Contiguous, Transposed, Sliced };

struct Input {
  Shape shape;
  Values values = Values::Normal;
  Layout layout = Layout::Contiguous;
};

struct OpCase {
  std::string name;
  std::vector<Input> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// A tensor of `in.shape` with the requested values and memory layout.
Tensor make_input(const Input& in, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v = Tensor::randn(in.shape, rng).to_vector();
  for (float& x : v) {
    if (in.values == Values::Positive) x = 0.5f + 1.5f / (1.0f + std::exp(-x));
    if (in.values == Values::AwayFromZero) x = x >= 0 ? x + 0.1f : x - 0.1f;
  }
  Tensor values = Tensor::from_vector(v, in.shape);
  if (in.layout == Layout::Contiguous) return values;
  Shape s = in.shape;
  Tensor view;
  if (in.layout == Layout::Transposed) {  // stored as [.., b, a], viewed as [.., a, b]
    std::swap(s[s.size() - 1], s[s.size() - 2]);
    view = Tensor::zeros(s).transpose(-1, -2);
  } else {  // a window of a wider tensor
    s.back() += 3;
    view = Tensor::zeros(s).slice(-1, 1, 1 + in.shape.back());
  }
  view.copy_(values);
  return view;
}

// out, grads of sum(out * R) for each input.
struct Result {
  Tensor out;
  std::vector<Tensor> grads;
};

Result run(const OpCase& c, bool reference) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    Tensor x = make_input(c.inputs[i], 100 + i);
    xs.push_back(x.set_requires_grad(true));
  }
  std::unique_ptr<ReferenceKernelsGuard> guard;
  if (reference) guard = std::make_unique<ReferenceKernelsGuard>();
  Result r;
  r.out = c.fn(xs);
  Rng rng(99);
  Tensor weights = Tensor::randn(r.out.shape(), rng);
  sum(mul(r.out, weights)).backward();
  for (Tensor& x : xs) r.grads.push_back(x.grad());
  return r;
}

std::vector<OpCase> op_table() {
  using V = std::vector<Tensor>;
  const Values P = Values::Positive, A = Values::AwayFromZero, N = Values::Normal;
  const Layout T = Layout::Transposed, S = Layout::Sliced;
  return {
      {"add_same", {{{4, 5}}, {{4, 5}}}, [](const V& x) { return add(x[0], x[1]); }},
      {"add_bcast", {{{3, 1, 5}}, {{4, 5}}}, [](const V& x) { return add(x[0], x[1]); }},
      {"add_transposed", {{{3, 6}, N, T}, {{6}}}, [](const V& x) { return add(x[0], x[1]); }},
      {"sub_bcast", {{{2, 3}}, {{3}}}, [](const V& x) { return sub(x[0], x[1]); }},
      {"mul_bcast", {{{2, 3, 4}}, {{4}}}, [](const V& x) { return mul(x[0], x[1]); }},
      {"mul_sliced", {{{3, 5}, N, S}, {{3, 1}}}, [](const V& x) { return mul(x[0], x[1]); }},
      {"div_bcast", {{{2, 3}}, {{2, 1}, P}}, [](const V& x) { return div(x[0], x[1]); }},
      {"scale", {{{7}}}, [](const V& x) { return scale(x[0], -1.5f); }},
      {"add_scalar", {{{2, 2}}}, [](const V& x) { return add_scalar(x[0], 3.0f); }},
      {"sum_all", {{{3, 4}}}, [](const V& x) { return sum(x[0]); }},
      {"sum_axes", {{{3, 4, 5}}}, [](const V& x) { return sum(x[0], {0, 2}); }},
      {"sum_keepdim_transposed", {{{5, 3}, N, T}}, [](const V& x) { return sum(x[0], {0}, {.keepdim = true}); }},
      {"sum_rows_long", {{{3, 37}}}, [](const V& x) { return sum(x[0], {-1}); }},
      {"mean_axes", {{{3, 4, 5}}}, [](const V& x) { return mean(x[0], {-1}); }},
      {"mean_all", {{{6}}}, [](const V& x) { return mean(x[0]); }},
      {"exp", {{{7, 13}}}, [](const V& x) { return exp(x[0]); }},
      {"log", {{{7, 13}, P}}, [](const V& x) { return log(x[0]); }},
      {"tanh", {{{7, 13}, N, T}}, [](const V& x) { return tanh(x[0]); }},
      {"sigmoid", {{{7, 13}}}, [](const V& x) { return sigmoid(x[0]); }},
      {"relu", {{{7, 13}, A}}, [](const V& x) { return relu(x[0]); }},
      {"gelu", {{{7, 13}}}, [](const V& x) { return gelu(x[0]); }},
      {"gelu_tanh", {{{7, 13}, N, S}}, [](const V& x) { return gelu(x[0], GeluApproximation::Tanh); }},
      {"silu", {{{7, 13}}}, [](const V& x) { return silu(x[0]); }},
      {"matmul", {{{5, 7}}, {{7, 3}}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul_vectors", {{{1, 9}}, {{9, 1}}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul_batched_shared", {{{2, 3, 4, 5}}, {{5, 6}}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul_broadcast_batch", {{{2, 1, 4, 5}}, {{3, 5, 2}}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul_transposed", {{{4, 6}, N, T}, {{6, 3}, N, T}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul_sliced", {{{2, 4, 5}, N, S}, {{2, 5, 3}}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"linear", {{{2, 3, 5}}, {{4, 5}}, {{4}}}, [](const V& x) { return linear(x[0], x[1], x[2]); }},
      {"linear_one_row", {{{1, 37}}, {{7, 37}}, {{7}}}, [](const V& x) { return linear(x[0], x[1], x[2]); }},
      {"linear_four_rows", {{{4, 19}}, {{9, 19}}}, [](const V& x) { return linear(x[0], x[1]); }},
      {"linear_no_bias_transposed", {{{5, 3}, N, T}, {{4, 3}}}, [](const V& x) { return linear(x[0], x[1]); }},
      {"linear_gelu", {{{2, 3, 5}}, {{4, 5}}, {{4}}},
       [](const V& x) { return linear(x[0], x[1], x[2], Activation::Gelu); }},
      {"linear_tanh_four_rows", {{{4, 19}}, {{9, 19}}, {{9}}},
       [](const V& x) { return linear(x[0], x[1], x[2], Activation::Tanh); }},
      {"linear_silu_no_bias", {{{6, 7}, N, T}, {{3, 7}}},
       [](const V& x) { return linear(x[0], x[1], Tensor(), Activation::Silu); }},
      {"softmax", {{{6, 11}}}, [](const V& x) { return softmax(x[0]); }},
      {"rope", {{{2, 3, 5, 8}}}, [](const V& x) { return rope(x[0], {.offset = 3, .theta = 500000.0f}); }},
      {"rope_transposed", {{{2, 6, 4}, N, T}}, [](const V& x) { return rope(x[0]); }},
      {"softmax_transposed", {{{5, 4}, N, T}}, [](const V& x) { return softmax(x[0]); }},
      {"log_softmax", {{{6, 11}}}, [](const V& x) { return log_softmax(x[0]); }},
      {"layer_norm", {{{4, 9}}, {{9}}, {{9}}}, [](const V& x) { return layer_norm(x[0], x[1], x[2]); }},
      {"layer_norm_plain", {{{2, 3, 65}}}, [](const V& x) { return layer_norm(x[0], Tensor(), Tensor()); }},
      {"rms_norm", {{{4, 9}, N, S}, {{9}}}, [](const V& x) { return rms_norm(x[0], x[1]); }},
      {"rms_norm_wide", {{{3, 130}}, {{130}}}, [](const V& x) { return rms_norm(x[0], x[1]); }},
      {"embedding", {{{10, 6}}},
       [](const V& x) { return embedding(x[0], Tensor::from_ints({1, 3, 3, 9, 0, 1}, {2, 3})); }},
      {"dropout", {{{5, 8}}},
       [](const V& x) {
         Rng rng(5);
         return dropout(x[0], rng, {.p = 0.3f, .training = true});
       }},
      {"masked_fill", {{{3, 5}}},
       [](const V& x) {
         Tensor mask = Tensor::from_ints({1, 0, 0, 1, 0}, {1, 5}).to(DType::U8);
         return masked_fill(x[0], mask, -2.5f);
       }},
      {"concat", {{{2, 3}}, {{2, 1}}, {{2, 4}, N, T}}, [](const V& x) { return concat({x[0], x[1], x[2]}, 1); }},
      {"split", {{{3, 5}}},
       [](const V& x) {
         auto parts = split(x[0], {2, 3}, 1);
         return concat({scale(parts[1], 2.0f), parts[0]}, 1);
       }},
      {"views", {{{2, 3, 4}}},
       [](const V& x) { return x[0].permute({2, 0, 1}).reshape({-1, 3}).slice(0, 1, 6).transpose(0, 1).contiguous(); }},
      {"cross_entropy", {{{6, 7}}},
       [](const V& x) {
         return cross_entropy(x[0], Tensor::from_ints({2, 0, -100, 6, 6, 1}, {6}), {.label_smoothing = 0.1f});
       }},
  };
}

class OpTable : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpTable, FastMatchesReference) {
  const OpCase& c = GetParam();
  Result fast = run(c, false), ref = run(c, true);
  // Reference kernels accumulate in double; fast ones in float: the float32
  // rounding bound (tests/test_util.h) of an op of a few passes over sums as
  // long as its inputs' longest dimension, and of its backward.
  int64_t terms = 1;
  for (const Input& in : c.inputs)
    for (int64_t d : in.shape) terms = std::max(terms, d);
  EXPECT_TRUE(testing::float32_close(fast.out, ref.out, {.terms = terms, .stages = 4})) << "forward";
  for (size_t i = 0; i < fast.grads.size(); ++i)
    EXPECT_TRUE(testing::float32_close(fast.grads[i], ref.grads[i], {.terms = terms, .stages = 8}))
        << "gradient of input " << i;
}

// Central differences of L = sum(op(x) * R) in double around each element.
TEST_P(OpTable, BackwardMatchesFiniteDifferences) {
  const OpCase& c = GetParam();
  Result analytic = run(c, true);
  std::vector<Tensor> xs;
  for (size_t i = 0; i < c.inputs.size(); ++i) xs.push_back(make_input(c.inputs[i], 100 + i).contiguous().clone());
  Rng rng(99);
  Tensor weights;
  auto loss = [&]() {
    NoGradGuard no_grad;
    ReferenceKernelsGuard reference;
    Tensor out = c.fn(xs);
    if (!weights.defined()) weights = Tensor::randn(out.shape(), rng);
    std::vector<float> o = out.to_vector(), w = weights.to_vector();
    double s = 0;
    for (size_t k = 0; k < o.size(); ++k) s += (double)o[k] * w[k];
    return s;
  };
  loss();
  const float eps = 1e-2f;
  for (size_t i = 0; i < xs.size(); ++i) {
    // Float32 outputs and eps = 1e-2: truncation O(eps^2), rounding ~1e-7 |L| / eps.
    EXPECT_TRUE(all_close(analytic.grads[i], testing::numeric_gradient(xs[i], loss, eps), 5e-3f, 5e-3f))
        << "input " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpTable, ::testing::ValuesIn(op_table()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

TEST(Ops, ShapeErrorsAreClear) {
  Tensor a = Tensor::zeros({4, 3}), b = Tensor::zeros({5, 2});
  try {
    matmul(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "matmul: inner dimensions differ: a is [4,3], b is [5,2]");
  }
  EXPECT_THROW(add(Tensor::zeros({2, 3}), Tensor::zeros({4})), Error);
  EXPECT_THROW(embedding(Tensor::zeros({4, 2}), Tensor::from_ints({4}, {1})), Error);
  EXPECT_THROW(cross_entropy(Tensor::zeros({2, 3}), Tensor::from_ints({0, 3}, {2})), Error);
  EXPECT_THROW(layer_norm(Tensor::zeros({2, 3}), Tensor::zeros({4}), Tensor()), Error);
  EXPECT_THROW(exp(Tensor::zeros({2}, DType::I64)), Error);
}

TEST(Ops, SoftmaxOfFullyMaskedRowIsZeroNotNaN) {
  Tensor x = Tensor::full({2, 4}, -INFINITY);
  for (bool reference : {false, true}) {
    std::unique_ptr<ReferenceKernelsGuard> g;
    if (reference) g = std::make_unique<ReferenceKernelsGuard>();
    for (float v : softmax(x).to_vector()) EXPECT_EQ(v, 0.0f);
  }
}

TEST(Ops, DropoutKeepsExpectationAndIsSeeded) {
  Tensor x = Tensor::ones({100000});
  Rng a(3), b(3);
  Tensor ya = dropout(x, a, {.p = 0.25f}), yb = dropout(x, b, {.p = 0.25f});
  EXPECT_TRUE(all_close(ya, yb, 0, 0));
  double s = 0, zeros = 0;
  for (float v : ya.to_vector()) {
    s += v;
    zeros += v == 0.0f;
  }
  EXPECT_NEAR(s / 100000, 1.0, 0.02);
  EXPECT_NEAR(zeros / 100000, 0.25, 0.01);
  Rng c(3);
  EXPECT_TRUE(all_close(dropout(x, c, {.p = 0.25f, .training = false}), x, 0, 0));
}

TEST(Ops, VectorMathMatchesLibm) {
  // The fast kernels' exp, tanh, sigmoid and erf over a wide range.
  for (float x = -90.0f; x <= 88.0f; x += 0.0137f) {
    double e = std::exp((double)x);
    EXPECT_NEAR(cpu::test_copy::fast_exp(x), e, 3e-7 * e + 1.3e-38) << x;  // flushed to 0 below exp(-87.3) = 1.22e-38
    EXPECT_NEAR(cpu::test_copy::fast_tanh(x), std::tanh((double)x), 2e-7 + 1e-6 * std::fabs(std::tanh((double)x))) << x;
    EXPECT_NEAR(cpu::test_copy::fast_sigmoid(x), 1.0 / (1.0 + std::exp(-(double)x)), 3e-7) << x;
    // The rational forms' 6e-8 and the rounding of their float operations: 3.3e-7 with FMA, 4.1e-7 without
    // (fast_gelu_grad: 2.6e-7 and 3.3e-7).
    EXPECT_NEAR(cpu::test_copy::fast_erf(x / 16), std::erf((double)x / 16), 4.5e-7) << x;
    const double v = x / 12.0f;
    const double gelu_grad =
        0.5 * (1 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    EXPECT_NEAR(cpu::test_copy::fast_gelu_grad(x / 12.0f), gelu_grad, 4e-7) << v;
  }
  for (float x : {1e-6f, -3e-4f, 0.01f, 0.124f, 0.126f})
    EXPECT_NEAR(cpu::test_copy::fast_tanh(x), std::tanh((double)x), 1e-6 * std::fabs(x)) << "relative accuracy near 0 at " << x;
  for (float x : {1e-30f, -1e-6f, 3e-4f, -0.01f, 0.23f})
    EXPECT_NEAR(cpu::test_copy::fast_erf(x), std::erf((double)x), 5e-7 * std::erf(std::fabs((double)x)))
        << "relative accuracy near 0 at " << x;
  EXPECT_NEAR(cpu::test_copy::fast_erf(-INFINITY), -1.0f, 4.5e-7);
  EXPECT_TRUE(std::isnan(cpu::test_copy::fast_erf(NAN)));
  EXPECT_EQ(cpu::test_copy::fast_exp(-INFINITY), 0.0f);
  EXPECT_EQ(cpu::test_copy::fast_exp(0.0f), 1.0f);
}

TEST(Ops, LargeShapesFastMatchesReference) {
  // Sizes that take the multithreaded paths of the fast kernels, on two threads.
  omp_set_num_threads(2);
  Rng rng(1);
  Tensor a = Tensor::randn({130, 257}, rng), b = Tensor::randn({257, 190}, rng);
  Tensor fast_mm = matmul(a, b), fast_sm = softmax(a), fast_ln = layer_norm(a, Tensor(), Tensor());
  Tensor fast_sum = sum(a, {0});
  ReferenceKernelsGuard ref;
  EXPECT_TRUE(all_close(fast_mm, matmul(a, b), 1e-4f, 1e-4f));
  EXPECT_TRUE(all_close(fast_sm, softmax(a), 1e-6f, 1e-4f));
  EXPECT_TRUE(all_close(fast_ln, layer_norm(a, Tensor(), Tensor()), 1e-5f, 1e-4f));
  EXPECT_TRUE(all_close(fast_sum, sum(a, {0}), 1e-4f, 1e-4f));
}

// Runs g (all but C set, ldc included) through the fast gemm and the
// reference twin, each on its own copy of a random C [m, ldc] (all NaN when
// beta is 0: BLAS then ignores what C held), and compares the whole buffers,
// so the padding columns past n must come back untouched as well.
// With gelu_in_place, the epilogue also applies GELU to C in place.
::testing::AssertionResult fast_gemm_matches_reference(GemmArgs g, Rng& rng, bool gelu_in_place = false) {
  Tensor c0 = Tensor::randn({g.m, g.ldc}, rng);
  if (g.beta == 0.0f) c0.fill_(NAN);
  Tensor c_fast = c0.clone(), c_ref = c0.clone();
  g.act = UnaryOp::Gelu, g.ld_act = g.ldc;
  g.c = c_fast.data<float>();
  if (gelu_in_place) g.act_out = g.c;
  cpu::kernels().gemm(g);
  g.c = c_ref.data<float>();
  if (gelu_in_place) g.act_out = g.c;
  ref::gemm(g);
  return testing::gemm_close(g, c0, c_fast, c_ref);
}

TEST(Ops, LinearWithActivationMatchesLinearThenActivation) {
  // The fused activation (run by each GEMM thread on its rows, here 301 rows
  // split between two) against the two ops one after the other: values with
  // and without history, and the gradients of all three inputs.
  omp_set_num_threads(2);
  for (Activation act : {Activation::Relu, Activation::Gelu, Activation::GeluTanh, Activation::Silu, Activation::Tanh}) {
    Rng rng(11 + (int)act);
    Tensor x = Tensor::randn({301, 67}, rng), w = Tensor::randn({130, 67}, rng, 0.2f), b = Tensor::randn({130}, rng);
    Tensor r = Tensor::randn({301, 130}, rng);
    auto grads = [&](bool fused) {
      std::vector<Tensor> in = {x.clone().set_requires_grad(true), w.clone().set_requires_grad(true),
                                b.clone().set_requires_grad(true)};
      Tensor y = fused ? linear(in[0], in[1], in[2], act) : activate(linear(in[0], in[1], in[2]), act);
      sum(mul(y, r)).backward();
      return std::vector<Tensor>{y, in[0].grad(), in[1].grad(), in[2].grad()};
    };
    std::vector<Tensor> fused = grads(true), plain = grads(false);
    for (size_t i = 0; i < fused.size(); ++i)
      EXPECT_TRUE(all_close(fused[i], plain[i], 1e-6f, 1e-6f)) << "activation " << (int)act << " tensor " << i;
    NoGradGuard no_grad;  // the in-place path
    EXPECT_TRUE(all_close(linear(x, w, b, act), activate(linear(x, w, b), act), 1e-6f, 1e-6f)) << (int)act;
  }
  omp_set_num_threads(1);
}

// linear_add (a block's skip connection, the residual added by the GEMM as
// it stores y) against add(residual, linear(...)): the same bits forward and
// in every gradient, for C's rows split between two threads (2-D and 3-D x),
// a few rows of inference (the decoding tiles), x as its own residual (a
// Post-Norm block's x + f(x)), and the cases it hands to add: a broadcast
// residual, autocast, a BF16 weight. Adding the residual before the bias in
// the panels' epilogue, or dropping its gradient, fails it.
TEST(Ops, LinearAddIsTheResidualPlusTheLinear) {
  omp_set_num_threads(2);
  auto same_bits = [](const Tensor& a, const Tensor& b) {
    if (!a.defined() || !b.defined() || a.shape() != b.shape()) return false;
    const Tensor ca = a.contiguous(), cb = b.contiguous();
    return std::memcmp(ca.data<float>(), cb.data<float>(), sizeof(float) * ca.numel()) == 0;
  };
  Rng rng(23);
  struct Case {
    std::string name;
    Shape x, residual;
    int64_t out;
  };
  const Case cases[] = {{"rows", {301, 67}, {301, 130}, 130},
                        {"batch", {3, 100, 67}, {3, 100, 130}, 130},
                        {"few rows", {2, 4, 67}, {2, 4, 130}, 130},
                        {"broadcast", {301, 67}, {130}, 130},
                        {"own residual", {301, 67}, {}, 67}};
  for (const Case& c : cases) {
    Tensor x = Tensor::randn(c.x, rng), w = Tensor::randn({c.out, c.x.back()}, rng, 0.2f),
           b = Tensor::randn({c.out}, rng);
    Tensor res = c.residual.empty() ? Tensor() : Tensor::randn(c.residual, rng);
    Shape y_shape = c.x;
    y_shape.back() = c.out;
    Tensor r = Tensor::randn(y_shape, rng);
    auto run = [&](bool fused) {
      std::vector<Tensor> in = {x.clone().set_requires_grad(true), w.clone().set_requires_grad(true),
                                b.clone().set_requires_grad(true)};
      in.push_back(res.defined() ? res.clone().set_requires_grad(true) : in[0]);
      Tensor y = fused ? linear_add(in[0], in[1], in[2], in[3]) : add(in[3], linear(in[0], in[1], in[2]));
      sum(mul(y, r)).backward();
      return std::vector<Tensor>{y, in[0].grad(), in[1].grad(), in[2].grad(), in[3].grad()};
    };
    const std::vector<Tensor> fused = run(true), plain = run(false);
    for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(same_bits(fused[i], plain[i])) << c.name << " tensor " << i;
    NoGradGuard no_grad;  // inference: the decoding tiles for a few rows
    const Tensor own = res.defined() ? res : x;
    EXPECT_TRUE(same_bits(linear_add(x, w, b, own), add(own, linear(x, w, b)))) << c.name << " without history";
    {
      Bf16AutocastGuard mixed;
      EXPECT_TRUE(same_bits(linear_add(x, w, b, own), add(own, linear(x, w, b)))) << c.name << " under autocast";
    }
    Tensor w16 = w.clone();
    w16.convert_(DType::BF16);
    EXPECT_TRUE(same_bits(linear_add(x, w16, b, own), add(own, linear(x, w16, b)))) << c.name << " bf16 weight";
  }
  Tensor x = Tensor::randn({4, 67}, rng), w = Tensor::randn({130, 67}, rng);
  EXPECT_NE(testing::error_of([&] { linear_add(x, w, Tensor(), Tensor::randn({4, 7}, rng)); }), "");
  EXPECT_NE(testing::error_of([&] { linear_add(x, w, Tensor(), Tensor()); }).find("residual is undefined"),
            std::string::npos);
  omp_set_num_threads(1);
}

TEST(Ops, LinearWithBf16WeightIsTheFloat32ProductOfRoundedInputs) {
  // A BF16 weight: x is rounded to bfloat16 and the products summed in
  // float32, so the result is the float32 linear of the rounded x and the
  // widened weight, within the float32 dot product's bound. Also one row (decoding) and
  // a fused activation.
  omp_set_num_threads(2);
  Rng rng(12);
  NoGradGuard no_grad;
  for (int64_t rows : {1, 37, 300}) {
    Tensor x = Tensor::randn({rows, 130}, rng), w = Tensor::randn({70, 130}, rng, 0.2f), b = Tensor::randn({70}, rng);
    Tensor w16 = w.to(DType::BF16), x_rounded = x.to(DType::BF16).to(DType::F32), w_wide = w16.to(DType::F32);
    Tensor y = linear(x, w16, b), y_ref;
    {
      ReferenceKernelsGuard guard;
      y_ref = linear(x_rounded, w_wide, b);
    }
    EXPECT_TRUE(testing::gemm_close(y, y_ref, x_rounded, w_wide, b)) << rows << " rows";
    EXPECT_TRUE(all_close(linear(x, w16, b, Activation::Gelu), gelu(y), 1e-6f, 1e-6f)) << rows << " rows";
  }
  omp_set_num_threads(1);
}

// A Linear converted to BF16 keeps its weight packed as gemm_bf16 reads it
// where the CPU has AMX or AVX512-BF16 (pack_bf16_weight), and only that:
// the weight keeps its shape on the meta device, and state_dict() gives its
// values back, the same bits. Its product is the plain weight's: bit for bit
// above 4 rows (the same tiles), and within the float32 sum's bound of the
// float64 product up to 4 (a GEMV of the packed layout, summing in another
// order). Weights loaded afterwards (load_state_dict) are packed again, so
// the copy never holds old values (skipping that repacking fails the check
// after it); back in F32 the weight is the values, widened.
TEST(Ops, ALinearKeepsItsBf16WeightPackedAndGivesTheSameProduct) {
  omp_set_num_threads(2);
  Rng rng(13);
  NoGradGuard no_grad;
  Linear lin({.in_features = 130, .out_features = 70}, rng);
  lin.convert_weight(DType::BF16);
  const bool reads_packed = kernels_for(Device::Cpu).gemm_bf16_packed_b_words(70, 130) > 0;
  ASSERT_EQ(lin.weight_packed.defined(), reads_packed);
  EXPECT_EQ(lin.weight.device() == Device::Meta, reads_packed);
  const Tensor plain = lin.state_dict().at("weight");
  ASSERT_EQ(plain.device(), Device::Cpu);
  // |y - sum| within 130 float32 roundings of the sum of |terms|, x rounded to bfloat16 as the kernels read it
  auto close_to_exact = [&](const Tensor& x, const Tensor& y, bool silu) {
    const Tensor xr = x.to(DType::BF16).to(DType::F32), w = plain.to(DType::F32);
    for (int64_t i = 0; i < x.size(0); ++i)
      for (int64_t j = 0; j < 70; ++j) {
        double sum = lin.bias.data<float>()[j], size = std::abs(sum);
        for (int64_t p = 0; p < 130; ++p) {
          const double t = (double)xr.data<float>()[i * 130 + p] * w.data<float>()[j * 130 + p];
          sum += t, size += std::abs(t);
        }
        const double want = silu ? sum / (1 + std::exp(-sum)) : sum, got = y.data<float>()[i * 70 + j];
        if (std::abs(got - want) > 2 * 130 * std::ldexp(size, -24) + 1e-6) {
          ADD_FAILURE() << x.size(0) << " rows, [" << i << ", " << j << "]: " << got << " vs " << want;
          return;
        }
      }
  };
  for (int64_t rows : {1, 4, 5, 33, 300}) {
    Tensor x = Tensor::randn({rows, 130}, rng);
    const Tensor packed = lin.forward(x), per_call = linear(x, plain, lin.bias);
    const Tensor packed_silu = lin.forward(x, Activation::Silu),
                 per_call_silu = linear(x, plain, lin.bias, Activation::Silu);
    if (rows > 4 || !reads_packed) {
      EXPECT_EQ(packed.to_vector(), per_call.to_vector()) << rows << " rows";
      EXPECT_EQ(packed_silu.to_vector(), per_call_silu.to_vector()) << rows << " rows";
    }
    close_to_exact(x, packed, false);
    close_to_exact(x, packed_silu, true);
  }
  StateDict state = lin.state_dict();
  const Tensor fresh = Tensor::randn({70, 130}, rng).to(DType::BF16);
  state.at("weight") = fresh;
  lin.load_state_dict(state);
  EXPECT_EQ(lin.weight.device() == Device::Meta, reads_packed);
  Tensor x = Tensor::randn({33, 130}, rng);
  EXPECT_EQ(lin.forward(x).to_vector(), linear(x, fresh, lin.bias).to_vector());
  EXPECT_EQ(0, std::memcmp(lin.state_dict().at("weight").raw_data(), fresh.raw_data(), 70 * 130 * 2));
  lin.convert_weight(DType::F32);
  EXPECT_FALSE(lin.weight_packed.defined());
  EXPECT_EQ(lin.weight.to_vector(), fresh.to(DType::F32).to_vector());
  if (!reads_packed) GTEST_SKIP() << "this CPU's gemm_bf16 reads no packed weight: only the values were compared";
}

// bfloat16 activations. Through a BF16 weight, x may be BF16 (read where it
// lies with k = 128, copied with 130) and y F32 (linear) or BF16
// (linear_bf16 with out = BF16): the float32 linear of the same values,
// within the float32 sum's bound, plus half a bfloat16 unit for a BF16 y
// (gemm_close with 2^-8). With out = BF16 and an activation (GELU in the
// tiles' registers, SiLU staged through unary_forward), act(y) rounded once:
// the bound through the activation (slope below 1.13) plus that half unit.
// Rows 1 and 4 take the streaming GEMV, 5 to 300 the AMX or AVX512-BF16
// blocks with a last partial block of rows. Bad input: BF16 x with an F32 or
// F16 weight, BF16 out from an F16 weight: one error each. Skipping the
// activation in the tiles' plain rows failed the GELU cases from 70 rows.
TEST(Ops, Bf16ActivationsInAndOut) {
  omp_set_num_threads(2);
  Rng rng(21);
  NoGradGuard no_grad;
  for (int64_t in : {128, 130})
    for (int64_t rows : {1, 4, 5, 70, 300}) {
      Linear lin({.in_features = in, .out_features = 72}, rng);
      lin.convert_weight(DType::BF16);
      const Tensor w = lin.state_dict().at("weight"), x = Tensor::randn({rows, in}, rng);
      const Tensor xb = x.to(DType::BF16), x_wide = xb.to(DType::F32), w_wide = w.to(DType::F32);
      const Tensor y_ref = linear(x_wide, w_wide, lin.bias);
      const std::string at = std::to_string(rows) + " rows, in " + std::to_string(in);
      const Tensor f32_out = linear(xb, w, lin.bias);
      ASSERT_EQ(f32_out.dtype(), DType::F32);
      EXPECT_TRUE(testing::gemm_close(f32_out, y_ref, x_wide, w_wide, lin.bias)) << at << ", F32 out";
      for (const Tensor& input : {xb, x_wide}) {
        const Tensor y = linear_bf16(input, w, lin.weight_packed, lin.bias, nullptr, DType::BF16);
        ASSERT_EQ(y.dtype(), DType::BF16);
        ASSERT_EQ(y.shape(), (Shape{rows, 72}));
        EXPECT_TRUE(testing::gemm_close(y.to(DType::F32), y_ref, x_wide, w_wide, lin.bias, 1.0 / 256))
            << at << ", BF16 out from " << dtype_name(input.dtype());
      }
      for (Activation act : {Activation::Gelu, Activation::Silu}) {
        const Tensor y = linear_bf16(xb, w, lin.weight_packed, lin.bias, &act, DType::BF16);
        const Tensor want = act == Activation::Gelu ? gelu(y_ref) : silu(y_ref);
        GemmArgs g;  // gemm_close's bound through an activation (act_out: only its presence is read)
        const Tensor bias = lin.bias;
        float flag = 0;
        g.trans_b = true, g.m = rows, g.n = 72, g.k = in, g.a = x_wide.data<float>(), g.lda = in;
        g.b = w_wide.data<float>(), g.ldb = in, g.ldc = 72, g.bias = bias.data<float>(), g.act_out = &flag;
        EXPECT_TRUE(testing::gemm_close(g, Tensor::zeros({rows, 72}), y.to(DType::F32), want, 1.0 / 256))
            << at << (act == Activation::Gelu ? ", GELU" : ", SiLU");
      }
    }
  const Tensor x = Tensor::randn({3, 8}, rng).to(DType::BF16), w = Tensor::randn({4, 8}, rng);
  EXPECT_THROW(linear(x, w), Error);
  EXPECT_THROW(linear(x, w.to(DType::F16)), Error);
  EXPECT_THROW(linear_bf16(x.to(DType::F32), w.to(DType::BF16), Tensor(), Tensor(), nullptr, DType::I8), Error);
}

// An MLP with BF16 weights writes its hidden layer in bfloat16 (the
// activation fused before the rounding) and its second product reads it:
// the same as the float32 composition of the same values, fc2(r(gelu(fc1(x)))),
// r the rounding to bfloat16 (which fc2 applies to a float32 hidden layer as it
// reads it), up to the h_p whose float32 sums round the other way (one
// bfloat16 unit, at most 2^-7 |h_p|, each): |dy| <= 2^-7 sum_p |h_p w2_jp| +
// the float32 bounds of both products. Leaving the activation out of the
// hidden layer failed it.
TEST(Ops, AnMlpWithBf16WeightsKeepsItsHiddenLayerInBf16) {
  omp_set_num_threads(2);
  Rng rng(22);
  NoGradGuard no_grad;
  for (int64_t rows : {3, 70}) {
    MLP mlp({.in_features = 64, .hidden_features = 256, .out_features = 48, .activation = Activation::Gelu}, rng);
    mlp.convert_linear_weights(DType::BF16);
    const Tensor x = Tensor::randn({rows, 64}, rng);
    const Tensor y = mlp.forward(x);
    ASSERT_EQ(y.dtype(), DType::F32);
    const Tensor w1 = mlp.fc1->state_dict().at("weight").to(DType::F32),
                 w2 = mlp.fc2->state_dict().at("weight").to(DType::F32);
    const Tensor h = gelu(linear(x.to(DType::BF16).to(DType::F32), w1, mlp.fc1->bias)).to(DType::BF16).to(DType::F32);
    const Tensor want = linear(h, w2, mlp.fc2->bias);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < 48; ++j) {
        double size = std::abs(mlp.fc2->bias.data<float>()[j]);
        for (int64_t p = 0; p < 256; ++p)
          size += std::abs((double)h.data<float>()[i * 256 + p] * w2.data<float>()[j * 256 + p]);
        const double got = y.data<float>()[i * 48 + j], expect = want.data<float>()[i * 48 + j];
        ASSERT_LE(std::abs(got - expect), std::ldexp(size, -7) + 2 * 258 * std::ldexp(size, -24) + 1e-5)
            << rows << " rows, [" << i << ", " << j << "]";
      }
  }
}

// Mixed precision: under Bf16AutocastGuard, a float32 weight's linear is the
// float32 linear of operands rounded to bfloat16, forward and backward:
// pre = r(x) r(W)^T + b, dx = r(dpre) r(W), dW = r(dpre)^T r(x), db the
// float32 row sum of dpre (dpre = dy, or dy * act'(pre) through a fused
// activation; ReLU here, whose derivative does not move with pre's last
// bits), each within the float32 dot product's bound; the backward runs after
// the guard has gone, on the choice the op recorded. The rounding is checked
// to happen: the plain float32 product lies outside that bound.
TEST(Ops, LinearUnderBf16AutocastIsTheFloat32ProductOfRoundedOperands) {
  omp_set_num_threads(2);
  auto rounded = [](const Tensor& t) { return t.to(DType::BF16).to(DType::F32); };
  for (bool with_act : {false, true}) {
    Rng rng(14 + with_act);
    Tensor x = Tensor::randn({301, 67}, rng), w = Tensor::randn({130, 67}, rng, 0.2f), b = Tensor::randn({130}, rng);
    Tensor r = Tensor::randn({301, 130}, rng);
    Tensor xg = x.clone().set_requires_grad(true), wg = w.clone().set_requires_grad(true),
           bg = b.clone().set_requires_grad(true);
    Tensor y;
    {
      Bf16AutocastGuard mixed;
      EXPECT_TRUE(bf16_autocast());
      y = with_act ? linear(xg, wg, bg, Activation::Relu) : linear(xg, wg, bg);
    }
    EXPECT_FALSE(bf16_autocast());
    sum(mul(y, r)).backward();

    Tensor pre_ref, dpre, dx_ref, dw_ref, db_ref, y32;
    {
      ReferenceKernelsGuard reference;
      NoGradGuard no_grad;
      pre_ref = linear(rounded(x), rounded(w), b);
      std::vector<float> d = r.to_vector(), p = pre_ref.to_vector();
      for (size_t i = 0; i < d.size(); ++i)
        if (with_act && p[i] <= 0) d[i] = 0;  // ReLU's derivative
      dpre = Tensor::from_vector(d, {301, 130});
      dx_ref = matmul(rounded(dpre), rounded(w));
      dw_ref = matmul(rounded(dpre).transpose(0, 1), rounded(x));
      db_ref = sum(dpre, {0});
      y32 = linear(x, w, b);
    }
    // |relu(a) - relu(b)| <= |a - b|: the bound on the product holds after it.
    EXPECT_TRUE(testing::gemm_close(y, with_act ? relu(pre_ref) : pre_ref, rounded(x), rounded(w), b)) << with_act;
    EXPECT_FALSE(testing::gemm_close(y, y32, x, w, b)) << "the forward was not rounded to bfloat16";
    Tensor dr = rounded(dpre).contiguous(), wr = rounded(w).contiguous(), xr = rounded(x).contiguous();
    GemmArgs gx;  // dx [301, 67] = dpre [301, 130] W [130, 67]
    gx.m = 301, gx.n = 67, gx.k = 130, gx.a = dr.data<float>(), gx.lda = 130, gx.b = wr.data<float>(), gx.ldb = 67,
    gx.ldc = 67;
    EXPECT_TRUE(testing::gemm_close(gx, Tensor::zeros({301, 67}), xg.grad(), dx_ref)) << with_act;
    GemmArgs gw;  // dW [130, 67] = dpre^T [130, 301] x [301, 67]
    gw.trans_a = true, gw.m = 130, gw.n = 67, gw.k = 301, gw.a = dr.data<float>(), gw.lda = 130,
    gw.b = xr.data<float>(), gw.ldb = 67, gw.ldc = 67;
    EXPECT_TRUE(testing::gemm_close(gw, Tensor::zeros({130, 67}), wg.grad(), dw_ref)) << with_act;
    EXPECT_TRUE(testing::float32_close(bg.grad(), db_ref, {301, 1})) << with_act;
  }
  omp_set_num_threads(1);
}

TEST(Ops, LinearWithBf16WeightRefusesGradientsAndOtherDtypes) {
  Rng rng(13);
  Tensor x = Tensor::randn({3, 8}, rng).set_requires_grad(true), w16 = Tensor::randn({4, 8}, rng).to(DType::BF16);
  EXPECT_EQ(testing::error_of([&] { linear(x, w16); }),
            "linear: BF16 weights are for inference; run it under NoGradGuard or with inputs that need no gradient");
  EXPECT_EQ(testing::error_of([&] { linear(x, Tensor::randn({4, 8}, rng).to(DType::F16)); }),
            "linear: F16 weights are for inference; run it under NoGradGuard or with inputs that need no gradient");
  EXPECT_EQ(testing::error_of([&] { linear(x.detach(), Tensor::zeros({4, 8}, DType::I32)); }),
            "linear: weight has dtype I32, expected F32, BF16 or F16");
}

// A float16 weight: x stays float32 and meets the widened (exact) weight, so
// the result is the float32 linear of x and the widened weight within the
// float32 dot product's bound; 1 and 4 rows (streamed) and more (widened),
// k with a tail past the vector width, a fused activation. Storing the
// weight in float16 moves each element by at most 2^-11 of itself (2^-25
// below float16's normal range).
TEST(Ops, LinearWithF16WeightIsTheFloat32ProductOfTheWidenedWeight) {
  omp_set_num_threads(2);
  Rng rng(16);
  NoGradGuard no_grad;
  for (int64_t rows : {1, 4, 37, 300}) {
    Tensor x = Tensor::randn({rows, 133}, rng), w = Tensor::randn({70, 133}, rng, 0.2f), b = Tensor::randn({70}, rng);
    Tensor w16 = w.to(DType::F16), w_wide = w16.to(DType::F32);
    Tensor y = linear(x, w16, b), y_ref;
    {
      ReferenceKernelsGuard guard;
      y_ref = linear(x, w_wide, b);
    }
    EXPECT_TRUE(testing::gemm_close(y, y_ref, x, w_wide, b)) << rows << " rows";
    EXPECT_TRUE(all_close(linear(x, w16, b, Activation::Gelu), gelu(y), 1e-6f, 1e-6f)) << rows << " rows";
    for (int64_t i = 0; i < w.numel(); ++i)
      ASSERT_LE(std::fabs(w_wide.data<float>()[i] - w.data<float>()[i]),  // (subnormal halves: half of 2^-24)
                std::max(std::ldexp(std::fabs(w.data<float>()[i]), -11), std::ldexp(1.0f, -25)));
  }
  // A Linear converts to float16 and back; a weight past float16's range is
  // refused rather than turned infinite, and the weight stays as it was.
  Linear lin({.in_features = 40, .out_features = 9}, rng);
  lin.convert_weight(DType::F16);
  EXPECT_EQ(lin.weight.dtype(), DType::F16);
  lin.convert_weight(DType::F32);
  lin.weight.data<float>()[17] = -70000.0f;
  EXPECT_EQ(testing::error_of([&] { lin.convert_weight(DType::F16); }),
            "Linear: a weight holds a value of magnitude 70000, which float16 cannot hold (largest finite value "
            "65504); use bf16");
  EXPECT_EQ(lin.weight.dtype(), DType::F32);
  // From bfloat16 (a checkpoint's tensor loaded into a float16 Linear),
  // whose bits are scanned as they lie: 65280 fits, a NaN is passed over (it
  // becomes float16's NaN), -65536 (the next bfloat16 value past 65280) does
  // not fit.
  Linear lf({.in_features = 40, .out_features = 9}, rng);
  lf.convert_weight(DType::F16);
  Tensor w_bf16 = Tensor::randn({9, 40}, rng).to(DType::BF16);
  w_bf16.data<uint16_t>()[3] = 0x477f, w_bf16.data<uint16_t>()[5] = 0x7fc1;
  lf.load_state_dict({{"weight", w_bf16}, {"bias", Tensor::zeros({9})}});
  EXPECT_EQ(lf.weight.data<uint16_t>()[3], float_to_half(65280.0f));
  EXPECT_EQ(lf.weight.data<uint16_t>()[5], 0x7e00);
  w_bf16.data<uint16_t>()[7] = 0xc780;
  EXPECT_EQ(testing::error_of([&] {
              lf.load_state_dict({{"weight", w_bf16}, {"bias", Tensor::zeros({9})}});
            }),
            "load_state_dict: tensor 'weight' holds a value of magnitude 65536, which float16 cannot hold (largest "
            "finite value 65504); use bf16");
  // load_state_dict into a float16 Linear refuses such a value as StateLoader
  // does; a refused state (that value, or a tensor the module lacks) changes
  // no parameter.
  StateDict state = {{"weight", lin.weight.clone()}, {"bias", Tensor::full({9}, 0.5f)}};
  lin.weight.data<float>()[17] = 1.0f;
  lin.convert_weight(DType::F16);
  const std::vector<float> before = lin.bias.to_vector();
  EXPECT_EQ(testing::error_of([&] { lin.load_state_dict(state); }),
            "load_state_dict: tensor 'weight' holds a value of magnitude 70000, which float16 cannot hold (largest "
            "finite value 65504); use bf16");
  EXPECT_EQ(lin.bias.to_vector(), before);
  state["weight"].data<float>()[17] = 2.0f;
  state["extra"] = Tensor::full({1}, 1.0f);
  EXPECT_EQ(testing::error_of([&] { lin.load_state_dict(state); }),
            "load_state_dict: unexpected tensor 'extra' (the model has no such parameter)");
  EXPECT_EQ(lin.bias.to_vector(), before);
  state.erase("extra");
  lin.load_state_dict(state);
  EXPECT_EQ(lin.bias.to_vector(), std::vector<float>(9, 0.5f));
  // A float16 folder loads into a model built without values: whatever its
  // float32 weight held (here past float16's range, as uninitialized memory
  // may be) is never read; the weight takes the file's dtype without values
  // (meta: no float32 copy is converted on the way) and loads either way.
  const StateDict saved = {{"weight", lin.weight.clone()}, {"bias", lin.bias.clone()}};  // a float16 weight
  ASSERT_EQ(saved.at("weight").dtype(), DType::F16);
  for (bool loader : {false, true}) {
    Linear fresh({.in_features = 40, .out_features = 9}, rng);
    fresh.weight.data<float>()[3] = 1e30f;
    EXPECT_NO_THROW(fresh.adopt_linear_dtypes(saved));
    EXPECT_EQ(fresh.weight.dtype(), DType::F16);
    EXPECT_EQ(fresh.weight.device(), Device::Meta);
    if (loader) {
      StateLoader load(fresh);
      for (const auto& [name, t] : saved) load.load(name, t.clone());
      load.finish();
    } else {
      fresh.load_state_dict(saved);
    }
    EXPECT_EQ(fresh.weight.device(), Device::Cpu);
    EXPECT_TRUE(all_close(fresh.weight, lin.weight, 0, 0));
  }
  omp_set_num_threads(1);
}

// An int8 weight against the float32 linear of the original x and W: each
// operand moves by at most half a step of its block when quantized (d / 2,
// d = the block's max |.| / 127), so |y - y_f32| <= sum_p (d_x(p) |w'_p| +
// |x_p| d_w(p)) / 2 + the float32 sums' own gamma_(k+4) bound, element by
// element. Also one row (the integer path), a fused activation, the weight
// round trip, and a Linear converted in place and back.
TEST(Ops, LinearWithInt8WeightIsWithinTheQuantizationBound) {
  omp_set_num_threads(2);
  Rng rng(14);
  NoGradGuard no_grad;
  for (int64_t rows : {1, 4, 37}) {
    const int64_t k = 130, n = 70, blocks = (k + 31) / 32;
    Tensor x = Tensor::randn({rows, k}, rng), w = Tensor::randn({n, k}, rng, 0.2f), b = Tensor::randn({n}, rng);
    const Int8Weight q = quantize_int8(w);
    ASSERT_EQ(q.scales.shape(), (Shape{n, blocks}));
    const Tensor w_back = dequantize_int8(q);
    const Tensor y = linear_int8(x, q, b), y_f32 = linear(x, w, b);
    const float *xv = x.data<float>(), *wv = w.data<float>(), *wb = w_back.data<float>();
    for (int64_t i = 0; i < rows; ++i) {
      std::vector<float> dx(blocks);
      for (int64_t c = 0; c < blocks; ++c) dx[c] = int8_block_scale(xv + i * k + c * 32, std::min<int64_t>(32, k - c * 32));
      for (int64_t j = 0; j < n; ++j) {
        double bound = 0, magnitude = std::fabs(b.data<float>()[j]);
        for (int64_t p = 0; p < k; ++p) {
          const double dw = q.scales.data<float>()[j * blocks + p / 32];
          ASSERT_LE(std::fabs(wb[j * k + p] - wv[j * k + p]), dw / 2 * (1 + 1e-5)) << "weight [" << j << "," << p << "]";
          bound += (dx[p / 32] * std::fabs(wb[j * k + p]) + std::fabs(xv[i * k + p]) * dw) / 2 * (1 + 1e-5);
          magnitude += std::fabs(xv[i * k + p] * wv[j * k + p]);
        }
        bound += (k + 6) * testing::kFloat32Unit * magnitude;
        ASSERT_LE(std::fabs(y.data<float>()[i * n + j] - y_f32.data<float>()[i * n + j]), bound)
            << rows << " rows, [" << i << "," << j << "]";
      }
    }
    const Activation gelu_act = Activation::Gelu;
    EXPECT_TRUE(all_close(linear_int8(x, q, b, &gelu_act), gelu(y), 1e-6f, 1e-6f)) << rows << " rows";
  }
  Linear lin({.in_features = 40, .out_features = 9}, rng);
  const Tensor w0 = lin.weight.clone(), x = Tensor::randn({2, 40}, rng);
  lin.convert_weight(DType::I8);
  EXPECT_EQ(lin.weight.dtype(), DType::I8);
  EXPECT_EQ(lin.weight_scale.shape(), (Shape{9, 2}));
  EXPECT_EQ(lin.named_parameters().size(), 3u);  // weight, bias, weight_scale
  EXPECT_TRUE(all_close(lin.forward(x), linear_int8(x, quantize_int8(w0), lin.bias), 0, 0));
  lin.convert_weight(DType::F32);
  EXPECT_EQ(lin.named_parameters().size(), 2u);
  EXPECT_FALSE(lin.weight_scale.defined());
  EXPECT_TRUE(all_close(lin.weight, dequantize_int8(quantize_int8(w0)), 0, 0));
  omp_set_num_threads(1);
}

TEST(Ops, LinearWithInt8WeightRefusesGradientsAndBrokenWeights) {
  Rng rng(15);
  const Int8Weight q = quantize_int8(Tensor::randn({4, 40}, rng));
  Tensor x = Tensor::randn({3, 40}, rng).set_requires_grad(true);
  EXPECT_EQ(testing::error_of([&] { linear_int8(x, q); }),
            "linear: an int8 weight is for inference; run it under NoGradGuard or with inputs that need no gradient");
  EXPECT_EQ(testing::error_of([&] { linear(x.detach(), q.values); }),
            "linear: an I8 weight needs its scales (linear_int8)");
  EXPECT_EQ(testing::error_of([&] { linear_int8(x.detach(), {q.values, q.scales.slice(1, 0, 1)}); }),
            "linear_int8: int8 weight scales must be F32 [4, 2] (one per block of 32), got F32 [4,1]");
  Int8Weight bad{q.values.clone(), q.scales.clone()};
  bad.values.data<int8_t>()[45] = -128;
  EXPECT_EQ(testing::error_of([&] { check_int8_weight(bad, "w.safetensors: 'fc.weight'"); }),
            "w.safetensors: 'fc.weight': int8 weight value -128 at [1, 5] (the format holds -127..127)");
  bad.values.data<int8_t>()[45] = 3;
  bad.scales.data<float>()[3] = -1.0f;
  EXPECT_EQ(testing::error_of([&] { check_int8_weight(bad, "w"); }),
            "w: int8 weight scale -1 at [1, 1] is not a finite non-negative number");
  EXPECT_EQ(testing::error_of([&] { quantize_int8(Tensor::randn({4}, rng)); }),
            "quantize_int8: expected an F32, BF16 or F16 weight [out, in], got F32 [4]");
}

TEST(Ops, GemvKernelMatchesReference) {
  // The fast gemm's own kernel for 1-4 rows against W^T: strided rows, alpha,
  // beta, a ragged tail of W's rows and of k, and sizes that split across two threads.
  omp_set_num_threads(2);
  for (int64_t m : {1, 2, 3, 4}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{7, 21}, {10, 64}, {301, 517}, {1030, 96}}) {
      for (float beta : {0.0f, 0.5f}) {
        for (bool with_bias : {false, true}) {
          Rng rng(m * 1000 + n + k);
          const int64_t lda = k + 3, ldb = k + 5;
          Tensor a = Tensor::randn({m, lda}, rng), b = Tensor::randn({n, ldb}, rng), bias = Tensor::randn({n}, rng);
          GemmArgs g{.trans_a = false, .trans_b = true, .m = m, .n = n, .k = k, .alpha = 0.75f,
                     .a = a.data<float>(), .lda = lda, .b = b.data<float>(), .ldb = ldb, .beta = beta, .ldc = n + 2,
                     .bias = with_bias ? bias.data<float>() : nullptr};
          EXPECT_TRUE(fast_gemm_matches_reference(g, rng, with_bias))
              << "m " << m << " n " << n << " k " << k << " beta " << beta << " bias and GELU " << with_bias;
        }
      }
    }
  }
}

TEST(Ops, GemmThreadSplitMatchesReference) {
  // Products large enough that the fast gemm splits C between two threads (one
  // BLAS call each), by rows (301 x 130) and by columns (130 x 301): every
  // transpose pair, strided operands, odd sizes, alpha and beta (0 over NaN, and
  // 0.5), half of them with a bias, half with GELU applied in place.
  omp_set_num_threads(2);
  for (auto [m, n] : {std::pair<int64_t, int64_t>{301, 130}, {130, 301}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 0.5f}) {
          const int64_t k = 67, lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5;
          Rng rng(m + (ta ? 4 : 0) + (tb ? 2 : 0) + (beta != 0.0f));
          Tensor a = Tensor::randn({ta ? k : m, lda}, rng), b = Tensor::randn({tb ? n : k, ldb}, rng);
          Tensor bias = Tensor::randn({n}, rng);
          GemmArgs g{.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .alpha = 0.75f,
                     .a = a.data<float>(), .lda = lda, .b = b.data<float>(), .ldb = ldb, .beta = beta, .ldc = n + 2,
                     .bias = ta == tb ? bias.data<float>() : nullptr};  // the bias's column offset in both splits
          EXPECT_TRUE(fast_gemm_matches_reference(g, rng, /*gelu_in_place=*/ta))
              << "m " << m << " n " << n << " ta " << ta << " tb " << tb << " beta " << beta;
        }
      }
    }
  }
  omp_set_num_threads(1);
}

}  // namespace
}  // namespace qkv
