// Golden tests: each op against tensors PyTorch produced from the same inputs
// (scripts/make_fixtures.py -> tests/fixtures/ops_golden.safetensors). The
// references were computed in float64; tolerances below are for our float32.
#include <functional>
#include <map>

#include "qkv/io.h"
#include "qkv/ops.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::all_close;
using V = std::vector<Tensor>;
using Extra = std::map<std::string, Tensor>;
using GoldenFn = std::function<Tensor(const V&, const Extra&)>;

std::map<std::string, GoldenFn> golden_ops() {
  return {
      {"add_bcast", [](const V& x, const Extra&) { return add(x[0], x[1]); }},
      {"sub_bcast", [](const V& x, const Extra&) { return sub(x[0], x[1]); }},
      {"mul_bcast", [](const V& x, const Extra&) { return mul(x[0], x[1]); }},
      {"div_bcast", [](const V& x, const Extra&) { return div(x[0], x[1]); }},
      {"scale", [](const V& x, const Extra&) { return scale(x[0], -1.5f); }},
      {"add_scalar", [](const V& x, const Extra&) { return add_scalar(x[0], 3.0f); }},
      {"sum_all", [](const V& x, const Extra&) { return sum(x[0]); }},
      {"sum_axes", [](const V& x, const Extra&) { return sum(x[0], {0, 2}); }},
      {"mean_keepdim", [](const V& x, const Extra&) { return mean(x[0], {-1}, {.keepdim = true}); }},
      {"exp", [](const V& x, const Extra&) { return exp(x[0]); }},
      {"log", [](const V& x, const Extra&) { return log(x[0]); }},
      {"tanh", [](const V& x, const Extra&) { return tanh(x[0]); }},
      {"sigmoid", [](const V& x, const Extra&) { return sigmoid(x[0]); }},
      {"relu", [](const V& x, const Extra&) { return relu(x[0]); }},
      {"gelu", [](const V& x, const Extra&) { return gelu(x[0]); }},
      {"gelu_tanh", [](const V& x, const Extra&) { return gelu(x[0], GeluApproximation::Tanh); }},
      {"silu", [](const V& x, const Extra&) { return silu(x[0]); }},
      {"matmul_batched", [](const V& x, const Extra&) { return matmul(x[0], x[1]); }},
      {"linear", [](const V& x, const Extra&) { return linear(x[0], x[1], x[2]); }},
      {"softmax", [](const V& x, const Extra&) { return softmax(x[0]); }},
      {"log_softmax", [](const V& x, const Extra&) { return log_softmax(x[0]); }},
      {"layer_norm", [](const V& x, const Extra&) { return layer_norm(x[0], x[1], x[2], 1e-5f); }},
      {"rms_norm", [](const V& x, const Extra&) { return rms_norm(x[0], x[1], 1e-6f); }},
      {"embedding", [](const V& x, const Extra& e) { return embedding(x[0], e.at("ids")); }},
      {"masked_fill", [](const V& x, const Extra& e) { return masked_fill(x[0], e.at("mask"), -2.5f); }},
      {"concat", [](const V& x, const Extra&) { return concat({x[0], x[1], x[2]}, 1); }},
      {"split",
       [](const V& x, const Extra&) {
         auto parts = split(x[0], {2, 3}, 1);
         return concat({scale(parts[1], 2.0f), parts[0]}, 1);
       }},
      {"matmul_transposed", [](const V& x, const Extra&) { return matmul(x[0].transpose(0, 1), x[1].transpose(0, 1)); }},
      {"cross_entropy",
       [](const V& x, const Extra& e) {
         return cross_entropy(x[0], e.at("targets"), {.ignore_index = -100, .label_smoothing = 0.1f});
       }},
  };
}

class Golden : public ::testing::TestWithParam<std::string> {
protected:
  static const std::map<std::string, Tensor>& fixture() { return testing::fixture_tensors("ops_golden.safetensors"); }
};

TEST_P(Golden, ForwardAndGradientsMatchPyTorch) {
  const std::string& name = GetParam();
  auto& f = fixture();
  ASSERT_TRUE(f.count(name + ".out")) << "fixture has no case " << name << "; rerun scripts/make_fixtures.py";
  V inputs;
  Extra extra;
  for (int i = 0; f.count(name + ".in" + std::to_string(i)); ++i)
    inputs.push_back(f.at(name + ".in" + std::to_string(i)).clone().set_requires_grad(true));
  for (const char* key : {"ids", "mask", "targets"})
    if (f.count(name + "." + key)) extra[key] = f.at(name + "." + key);
  Tensor out = golden_ops().at(name)(inputs, extra);
  // float32 against float64 references, within the float32 rounding bound
  // (tests/test_util.h) of one op of a few passes (a norm: mean, variance,
  // scale), summing at most the longest dimension of its inputs; its
  // backward a few passes more.
  const int64_t terms = testing::largest_dim(inputs);
  EXPECT_TRUE(testing::float32_close(out, f.at(name + ".out"), {.terms = terms, .stages = 4})) << "forward";
  sum(mul(out, f.at(name + ".r"))).backward();
  for (size_t i = 0; i < inputs.size(); ++i)
    EXPECT_TRUE(testing::float32_close(inputs[i].grad(), f.at(name + ".grad" + std::to_string(i)),
                                       {.terms = terms, .stages = 8}))
        << "gradient of input " << i;
}

std::vector<std::string> golden_names() {
  std::vector<std::string> names;
  for (auto& [name, fn] : golden_ops()) names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(PyTorch, Golden, ::testing::ValuesIn(golden_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(GoldenFixture, CoversEveryCase) {
  // Every case in the fixture has a C++ twin above, and none is silently skipped.
  const auto& f = testing::fixture_tensors("ops_golden.safetensors");
  auto ops = golden_ops();
  int cases = 0;
  for (auto& [key, t] : f) {
    if (key.size() > 4 && key.substr(key.size() - 4) == ".out") {
      ++cases;
      EXPECT_TRUE(ops.count(key.substr(0, key.size() - 4))) << key;
    }
  }
  EXPECT_EQ(cases, (int)ops.size());
}

}  // namespace
}  // namespace qkv
