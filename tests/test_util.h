// Shared helpers for the tests: tensor comparison with stated tolerances.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "qkv/io.h"
#include "qkv/tensor.h"
#include "src/kernels/kernels.h"

namespace qkv::testing {

// Unit roundoff of float32: 2^-24.
constexpr double kFloat32Unit = 5.9604644775390625e-8;

// How a float32 result was computed, for the rounding bound below: through
// `stages` successive operations (a matmul, a softmax, a norm, a residual add,
// each backward step...), each a sum of at most `terms` terms.
struct Float32Bound {
  int64_t terms = 1;
  int64_t stages = 1;
};

// ours (float32 arithmetic) against ref (float64 arithmetic, or float32 with
// double accumulation), element by element, with a bound that follows from
// float32 rounding rather than from one machine's results:
//
//   |ours_i - ref_i| <= u sqrt(terms) stages (|ref_i| + rms(ref))
//
// A sum of n float32 terms is off by about u sqrt(n) times the magnitudes
// summed (the probabilistic bound of Higham and Mary, SIAM J. Sci. Comput.
// 2019, with a factor of 1 where theirs holds with high probability), and the
// errors of successive stages add up. The magnitudes summed are not known
// element by element; the tensor's RMS stands for them, since the elements
// of one tensor are sums of terms of the same size: an element that is small
// only because its terms cancel (a gradient summed over tokens) still carries
// the rounding error of those terms. A comparison against |ref_i| alone fails
// there on any CPU whose BLAS sums in another order (an Intel Xeon did, on
// element 59 of lm_dense's embedding gradient: 0.0341763 vs 0.0342036, in a
// tensor of RMS 8.9; that error is 0.13 of this bound).
//
// The bound still catches a term left out. Two mutations, each run over the
// golden tests (PyTorch/*, NormFirst/*, Blocks.*) on a Zen 3, with every
// test of each family failing, by at least these factors over the bound:
//   linear's backward summing the bias gradient over rows - 1:
//     ops 4.2e5 (linear), blocks 4.2e3, layers 1.1e4, decoder 3.9e3, vit 1.7e3
//   the fast GEMM passing k - 1 to BLAS (each dot product's last term gone):
//     ops 2.1e5, blocks 3.0e4, layers 2.1e3, decoder 3.9e3, vit 6.0e3
// while honest runs came to at most 0.19 of it (QKV_TEST_SHOW_MARGINS=1).
inline ::testing::AssertionResult float32_close(const Tensor& ours, const Tensor& ref, Float32Bound b) {
  if (ours.shape() != ref.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << shape_str(ours.shape()) << " vs "
                                         << shape_str(ref.shape());
  std::vector<float> va = ours.to_vector(), vb = ref.to_vector();
  double sq = 0;
  for (float v : vb) sq += (double)v * v;
  const double rms = vb.empty() ? 0 : std::sqrt(sq / (double)vb.size());
  const double per_unit = kFloat32Unit * std::sqrt((double)std::max<int64_t>(b.terms, 1)) * (double)b.stages;
  double worst = 0;  // the largest error / bound
  size_t worst_i = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) != std::isnan(vb[i])) return ::testing::AssertionFailure() << "NaN mismatch at element " << i;
    if (std::isnan(va[i]) || va[i] == vb[i]) continue;
    const double bound = per_unit * (std::fabs((double)vb[i]) + rms);
    const double ratio = std::fabs((double)va[i] - vb[i]) / bound;  // inf when the bound is 0
    if (ratio > worst) worst = ratio, worst_i = i;
  }
  // QKV_TEST_SHOW_MARGINS=1 prints how close every comparison came to its bound.
  static const bool show = std::getenv("QKV_TEST_SHOW_MARGINS") != nullptr;
  if (show)
    std::printf("float32_close: worst error %.3g of the bound (terms %lld, stages %lld)\n", worst, (long long)b.terms,
                (long long)b.stages);
  if (worst > 1)
    return ::testing::AssertionFailure() << "element " << worst_i << ": " << va[worst_i] << " vs " << vb[worst_i]
                                         << ", error " << std::fabs((double)va[worst_i] - vb[worst_i]) << " is "
                                         << worst << "x the float32 bound (terms " << b.terms << ", stages "
                                         << b.stages << ", rms " << rms << ")";
  return ::testing::AssertionSuccess() << "worst error " << worst << " of the bound";
}

// The longest dimension among the tensors: the longest sum a model built from
// them can form in one stage (a dot product over D or the feed-forward
// width, a softmax over the keys, a gradient summed over tokens or the vocabulary).
inline int64_t largest_dim(const std::vector<Tensor>& tensors) {
  int64_t n = 1;
  for (const Tensor& t : tensors)
    for (int64_t d : t.shape()) n = std::max(n, d);
  return n;
}

// The same over a model's inputs and its parameters.
inline int64_t largest_dim(std::vector<Tensor> tensors, const std::map<std::string, Tensor>& params) {
  for (const auto& [name, t] : params) tensors.push_back(t);
  return largest_dim(tensors);
}

// The stages of a Transformer model of `layers` layers, forward: each layer
// is about 12 (norm, projection, score, softmax, weighted sum, output
// projection, residual; norm, two or three MLP products, activation,
// residual), plus embedding, final norm and head. Backward takes about twice
// as many on top of them.
inline Float32Bound model_forward(int64_t terms, int64_t layers) { return {terms, 12 * layers + 4}; }
inline Float32Bound model_backward(int64_t terms, int64_t layers) { return {terms, 3 * (12 * layers + 4)}; }

// C = alpha op(A) op(B) + beta C0 + bias (then act, when g.act_out is set),
// computed by a fast GEMM and by the reference, against the classical bound
// for a float32 dot product of k terms (Higham, "Accuracy and Stability of
// Numerical Algorithms", theorem 3.5): gamma_{k+2} times the magnitudes
// summed, |alpha| sum_p |a_ip b_pj| + |beta c0_ij| + |bias_j|, plus the
// reference's own rounding to float. GELU (the only activation the tests
// fuse) has slope below 1.13 and our erf is good to 3e-7 absolute, about
// 5 units of rounding. fast, ref and c0 are [m, ldc]: the padding columns
// past n must come back exactly as they were in c0. output_unit: the unit
// roundoff of the format fast's C was rounded to on its way out (2^-8 for
// bfloat16; 0 for float32, already counted), |C| times it more.
inline ::testing::AssertionResult gemm_close(const GemmArgs& g, const Tensor& c0, const Tensor& fast, const Tensor& ref,
                                             double output_unit = 0) {
  const std::vector<float> vc0 = c0.to_vector(), vf = fast.to_vector(), vr = ref.to_vector();
  const double gamma = (g.k + 2) * kFloat32Unit / (1 - (g.k + 2) * kFloat32Unit);
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.ldc; ++j) {
      const size_t at = (size_t)(i * g.ldc + j);
      if (j >= g.n) {
        if (!(vf[at] == vc0[at] || (std::isnan(vf[at]) && std::isnan(vc0[at]))))
          return ::testing::AssertionFailure() << "padding element [" << i << "," << j << "] changed";
        continue;
      }
      double magnitude = 0, pre = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double a = g.trans_a ? g.a[p * g.lda + i] : g.a[i * g.lda + p];
        const double b = g.trans_b ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
        magnitude += std::fabs(a * b);
        pre += a * b;
      }
      magnitude *= std::fabs(g.alpha);
      pre *= g.alpha;
      if (g.beta != 0.0f) magnitude += std::fabs(g.beta * vc0[at]), pre += g.beta * vc0[at];
      if (g.bias) magnitude += std::fabs(g.bias[j]), pre += g.bias[j];
      double bound = gamma * magnitude + kFloat32Unit * std::fabs(pre);
      if (g.act_out) bound = 1.13 * bound + 8 * kFloat32Unit * (std::fabs(pre) + std::fabs(vr[at]));
      bound += output_unit * (std::fabs(pre) + bound);
      if (std::isnan(vf[at]) || std::isnan(vr[at]) || std::fabs((double)vf[at] - vr[at]) > bound)
        return ::testing::AssertionFailure() << "element [" << i << "," << j << "]: " << vf[at] << " vs " << vr[at]
                                             << ", bound " << bound << " (k " << g.k << ")";
    }
  return ::testing::AssertionSuccess();
}

// The same for y = x W^T + b with x [m,k], W [n,k] (nn.Linear's layout).
inline ::testing::AssertionResult gemm_close(const Tensor& fast, const Tensor& ref, const Tensor& x, const Tensor& w,
                                             const Tensor& bias, double output_unit = 0) {
  Tensor xc = x.contiguous(), wc = w.contiguous();
  GemmArgs g;
  g.trans_b = true, g.m = x.size(0), g.n = w.size(0), g.k = x.size(1);
  g.a = xc.data<float>(), g.lda = g.k, g.b = wc.data<float>(), g.ldb = g.k, g.ldc = g.n;
  g.bias = bias.defined() ? bias.data<float>() : nullptr;
  return gemm_close(g, Tensor::zeros(fast.shape()), fast, ref, output_unit);
}

// |a - b| <= atol + rtol * |b| element-wise; reports the worst element.
inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, float atol, float rtol) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  std::vector<float> va = a.to_vector(), vb = b.to_vector();
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    double excess = std::fabs((double)va[i] - vb[i]) - (atol + rtol * std::fabs((double)vb[i]));
    bool nan_mismatch = std::isnan(va[i]) != std::isnan(vb[i]);
    if (nan_mismatch) return ::testing::AssertionFailure() << "NaN mismatch at element " << i;
    if (excess > worst) {
      worst = excess;
      worst_i = i;
    }
  }
  if (worst > 0)
    return ::testing::AssertionFailure() << "element " << worst_i << ": " << va[worst_i] << " vs " << vb[worst_i]
                                         << " (atol " << atol << ", rtol " << rtol << ")";
  return ::testing::AssertionSuccess();
}

// Central differences (loss(x + eps) - loss(x - eps)) / 2 eps for every element
// of the contiguous F32 tensor x, which is perturbed in place and restored.
inline Tensor numeric_gradient(Tensor& x, const std::function<double()>& loss, float eps) {
  std::vector<float> numeric(x.numel());
  float* p = x.data<float>();
  for (int64_t k = 0; k < x.numel(); ++k) {
    const float saved = p[k];
    p[k] = saved + eps;
    const double up = loss();
    p[k] = saved - eps;
    const double down = loss();
    p[k] = saved;
    numeric[k] = (float)((up - down) / (2 * eps));
  }
  return Tensor::from_vector(numeric, x.shape());
}

inline std::string fixture(const std::string& name) { return std::string(QKV_FIXTURES_DIR) + "/" + name; }

// The tensors of a fixture file, read once per test process.
inline const std::map<std::string, Tensor>& fixture_tensors(const std::string& name) {
  static std::map<std::string, std::map<std::string, Tensor>> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) it = loaded.emplace(name, load_safetensors(fixture(name)).as_map()).first;
  return it->second;
}

// The message of the qkv::Error that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The lines of a text, split at '\n' (a last empty one kept).
inline std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t at = 0;
  for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) lines.push_back(text.substr(at, nl - at));
  lines.push_back(text.substr(at));
  return lines;
}

// FNV-1a (32 bits) of bytes, and of ids as little-endian uint32: how the
// tokenizer fixtures record ids and texts (scripts/make_tokenizer_fixtures.py).
inline uint32_t fnv(const std::string& bytes) {
  uint32_t h = 0x811C9DC5u;
  for (unsigned char c : bytes) h = (h ^ c) * 0x01000193u;
  return h;
}

inline uint32_t fnv(const std::vector<int64_t>& ids) {
  std::string bytes;
  for (int64_t id : ids)
    for (int k = 0; k < 4; ++k) bytes += (char)(((uint32_t)id >> (8 * k)) & 0xFF);
  return fnv(bytes);
}

inline std::string hex(uint32_t h) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", h);
  return buf;
}

// The folders temp_dir made, removed when the test program ends if every
// test passed; after a failure they stay for a look, and the program says where.
class TempDirs {
public:
  ~TempDirs() {
    const ::testing::UnitTest* run = ::testing::UnitTest::GetInstance();
    for (const std::string& d : dirs_) {
      if (run && run->Failed()) {
        std::fprintf(stderr, "test files kept in %s\n", d.c_str());
      } else {
        std::error_code ignored;
        std::filesystem::remove_all(d, ignored);
      }
    }
  }
  void add(std::string d) { dirs_.push_back(std::move(d)); }

private:
  std::vector<std::string> dirs_;
};

// A fresh folder /tmp/qkv_<name>_XXXXXX for one test's files.
inline std::string temp_dir(const std::string& name = "test") {
  static TempDirs made;
  std::string tmpl = "/tmp/qkv_" + name + "_XXXXXX";
  const char* d = mkdtemp(tmpl.data());
  EXPECT_NE(d, nullptr) << "cannot make " << tmpl;
  if (d) made.add(d);
  return d ? d : "";
}

}  // namespace qkv::testing
