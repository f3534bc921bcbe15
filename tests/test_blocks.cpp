// Golden tests of the building blocks against PyTorch with the same weights
// and inputs (scripts/make_fixtures.py -> tests/fixtures/blocks_golden.safetensors):
// nn.MultiheadAttention (self with causal + padding masks, cross with T != S),
// nn.TransformerEncoderLayer / DecoderLayer with norm_first both ways, and
// plain PyTorch references for grouped-query attention + QK-Norm + RoPE,
// SwiGLU, RoPE, and F.scaled_dot_product_attention. Forward, the gradient of
// every input and of every parameter. References are float64; we compute in
// float32, so tolerances are a few float32 ulps of the values' scale.
#include <omp.h>

#include <functional>

#include "qkv/blocks.h"
#include "qkv/io.h"
#include "qkv/position.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::all_close;
using Fixture = std::map<std::string, Tensor>;

const Fixture& fixture() {
  return testing::fixture_tensors("blocks_golden.safetensors");
}

StateDict params_of(const std::string& c) {
  StateDict p;
  const std::string prefix = c + ".param.";
  for (auto& [k, v] : fixture())
    if (k.rfind(prefix, 0) == 0) p[k.substr(prefix.size())] = v;
  return p;
}

Tensor input(const std::string& c, const std::string& name) {
  return fixture().at(c + "." + name).clone().set_requires_grad(true);
}

// Runs `forward`, backpropagates sum(out * r), and compares everything the fixture holds.
void check_case(const std::string& c, Module* module, const std::vector<std::string>& input_names,
                const std::function<Tensor(const std::vector<Tensor>&)>& forward) {
  if (module) module->load_state_dict(params_of(c));
  std::vector<Tensor> xs;
  for (auto& n : input_names) xs.push_back(input(c, n));
  // The float32 rounding bound (tests/test_util.h) of one layer, whose
  // longest sum is over the widths and lengths of its tensors.
  const int64_t terms = testing::largest_dim(xs, module ? params_of(c) : StateDict{});
  const testing::Float32Bound fwd = testing::model_forward(terms, 1), bwd = testing::model_backward(terms, 1);
  Tensor out = forward(xs);
  EXPECT_TRUE(testing::float32_close(out, fixture().at(c + ".out"), fwd)) << c << " forward";
  sum(mul(out, fixture().at(c + ".r"))).backward();
  for (size_t i = 0; i < xs.size(); ++i)
    EXPECT_TRUE(testing::float32_close(xs[i].grad(), fixture().at(c + ".grad." + input_names[i]), bwd))
        << c << " gradient of " << input_names[i];
  if (!module) return;
  int checked = 0;
  for (auto& [name, p] : module->named_parameters()) {
    auto it = fixture().find(c + ".pgrad." + name);
    ASSERT_NE(it, fixture().end()) << c << ": fixture lacks the gradient of " << name;
    EXPECT_TRUE(testing::float32_close(p.grad(), it->second, bwd)) << c << " gradient of " << name;
    ++checked;
  }
  EXPECT_EQ(checked, (int)params_of(c).size());
}

Tensor lengths(const std::string& c) { return fixture().at(c + ".lengths"); }

TEST(Blocks, MultiheadSelfAttentionMatchesTorch) {
  Rng rng(0);
  MultiheadAttention m({.d_model = 16, .nhead = 4}, rng);
  check_case("mha_self", &m, {"x"}, [&](const std::vector<Tensor>& x) {
    return m.forward(x[0], {.causal = true, .key_padding_lengths = lengths("mha_self")}).out;
  });
}

TEST(Blocks, MultiheadCrossAttentionMatchesTorch) {
  Rng rng(0);
  MultiheadAttention m({.d_model = 16, .nhead = 4, .cross_attention = true}, rng);
  check_case("mha_cross", &m, {"x", "memory"}, [&](const std::vector<Tensor>& x) {
    return m.forward(x[0], x[1], {.key_padding_lengths = lengths("mha_cross")}).out;
  });
}

TEST(Blocks, NaivePathMatchesTorchToo) {
  Rng rng(0);
  MultiheadAttention m({.d_model = 16, .nhead = 4}, rng);
  check_case("mha_self", &m, {"x"}, [&](const std::vector<Tensor>& x) {
    AttentionOutput o = m.forward(x[0], {.causal = true, .key_padding_lengths = lengths("mha_self"), .need_weights = true});
    EXPECT_EQ(o.weights.shape(), (Shape{2, 4, 6, 6}));
    return o.out;
  });
}

TEST(Blocks, PackedAndSplitSelfAttentionAgree) {
  // Self-attention takes the packed path (flash on the fused projection in
  // place) unless weights are asked for; both paths must give the same output
  // and the same gradients, here with grouped-query heads, causal and padding.
  omp_set_num_threads(2);
  Rng rng(3);
  MultiheadAttention m({.d_model = 64, .nhead = 4, .num_kv_heads = 2}, rng);
  Tensor x = Tensor::randn({3, 21, 64}, rng), r = Tensor::randn({3, 21, 64}, rng);
  Tensor lens = Tensor::from_ints({21, 5, 13}, {3});
  auto run = [&](bool need_weights) {
    Tensor xi = x.clone().set_requires_grad(true);
    for (Tensor& p : m.parameters()) p.zero_grad();
    Tensor out = m.forward(xi, {.causal = true, .key_padding_lengths = lens, .need_weights = need_weights}).out;
    sum(mul(out, r)).backward();
    std::vector<Tensor> grads = {xi.grad()};
    for (Tensor& p : m.parameters()) grads.push_back(p.grad().clone());
    return std::pair{out, grads};
  };
  auto [packed, packed_grads] = run(false);
  auto [split, split_grads] = run(true);
  EXPECT_TRUE(all_close(packed, split, 1e-5f, 1e-4f));
  ASSERT_EQ(packed_grads.size(), split_grads.size());
  for (size_t i = 0; i < packed_grads.size(); ++i)
    EXPECT_TRUE(all_close(packed_grads[i], split_grads[i], 1e-4f, 1e-3f)) << "gradient " << i;
}

class LayerGolden : public ::testing::TestWithParam<bool> {};

TEST_P(LayerGolden, EncoderLayerMatchesTorch) {
  const bool norm_first = GetParam();
  const std::string c = norm_first ? "encoder_pre" : "encoder_post";
  Rng rng(0);
  TransformerEncoderLayer layer({.d_model = 16, .dim_feedforward = 32, .dropout = 0.0f, .norm_first = norm_first,
                                 .attention = {.nhead = 4}},
                                rng);
  check_case(c, &layer, {"x"}, [&](const std::vector<Tensor>& x) {
    return layer.forward(x[0], {.key_padding_lengths = lengths(c)});
  });
}

TEST_P(LayerGolden, DecoderLayerMatchesTorch) {
  const bool norm_first = GetParam();
  const std::string c = norm_first ? "decoder_pre" : "decoder_post";
  Rng rng(0);
  TransformerDecoderLayer layer({.d_model = 16, .dim_feedforward = 32, .dropout = 0.0f, .norm_first = norm_first,
                                 .attention = {.nhead = 4}},
                                rng);
  check_case(c, &layer, {"x", "memory"}, [&](const std::vector<Tensor>& x) {
    return layer.forward(x[0], x[1], {.causal = true}, {.key_padding_lengths = lengths(c)});
  });
}

INSTANTIATE_TEST_SUITE_P(NormFirst, LayerGolden, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "PreNorm" : "PostNorm"; });

TEST(Blocks, GroupedQueryAttentionWithQKNormAndRopeMatchesTorch) {
  Rng rng(0);
  MultiheadAttention m({.d_model = 16, .nhead = 4, .num_kv_heads = 2, .qk_norm = true, .rotary = true}, rng);
  check_case("gqa_qknorm_rope", &m, {"x"}, [&](const std::vector<Tensor>& x) {
    return m.forward(x[0], {.causal = true, .position_offset = 3}).out;
  });
}

TEST(Blocks, SwiGLUMatchesTorch) {
  Rng rng(0);
  SwiGLU m(16, 24, rng);
  check_case("swiglu", &m, {"x"}, [&](const std::vector<Tensor>& x) { return m.forward(x[0]); });
}

TEST(Blocks, RopeMatchesTorch) {
  check_case("rope", nullptr, {"x"}, [](const std::vector<Tensor>& x) { return rope(x[0], {.offset = 5}); });
}

TEST(Blocks, RopeScoresDependOnlyOnOffset) {
  // q_m . k_n after RoPE depends on m - n only: shift both positions by 7.
  Rng rng(2);
  Tensor q = Tensor::randn({1, 1, 1, 8}, rng), k = Tensor::randn({1, 1, 1, 8}, rng);
  auto score = [&](int64_t m, int64_t n) {
    return sum(mul(rope(q, {.offset = m}), rope(k, {.offset = n}))).item();
  };
  EXPECT_NEAR(score(3, 1), score(10, 8), 1e-5f);
  EXPECT_NEAR(score(0, 5), score(7, 12), 1e-5f);
}

TEST(Blocks, ScaledDotProductAttentionMatchesTorch) {
  for (AttentionImpl impl : {AttentionImpl::Naive, AttentionImpl::Flash})
    check_case("sdpa_causal_gqa", nullptr, {"q", "k", "v"}, [&](const std::vector<Tensor>& x) {
      return scaled_dot_product_attention(x[0], x[1], x[2], {.causal = true, .impl = impl});
    });
  check_case("sdpa_bool_mask", nullptr, {"q", "k", "v"}, [](const std::vector<Tensor>& x) {
    return scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = fixture().at("sdpa_bool_mask.mask")});
  });
}

TEST(Position, SinusoidalEncodings) {
  Tensor pe = sinusoidal_encoding(50, 16);
  std::vector<float> v = pe.to_vector();
  EXPECT_FLOAT_EQ(v[0], 0.0f);                                             // sin(0)
  EXPECT_FLOAT_EQ(v[1], 1.0f);                                             // cos(0)
  EXPECT_NEAR(v[3 * 16 + 2], std::sin(3.0 / std::pow(10000.0, 2.0 / 16)), 1e-6);
  EXPECT_TRUE(all_close(sinusoidal_encoding(10, 16, 40), pe.slice(0, 40, 50), 1e-6f, 0));
  Tensor pe2 = sinusoidal_encoding_2d(3, 4, 16);
  EXPECT_EQ(pe2.shape(), (Shape{12, 16}));
  // Patch (row 2, col 1): first half encodes row 2, second half column 1.
  EXPECT_TRUE(all_close(pe2.slice(0, 9, 10).slice(1, 0, 8), sinusoidal_encoding(3, 8).slice(0, 2, 3), 0, 0));
  EXPECT_TRUE(all_close(pe2.slice(0, 9, 10).slice(1, 8, 16), sinusoidal_encoding(4, 8).slice(0, 1, 2), 0, 0));
  EXPECT_THROW(sinusoidal_encoding(4, 7), Error);
}

TEST(Position, LearnedPositionsAreTrainableRows) {
  Rng rng(0);
  LearnedPositionalEmbedding pos(10, 4, rng);
  Tensor rows = pos.forward(3, 2);
  EXPECT_TRUE(all_close(rows, pos.weight.slice(0, 2, 5), 0, 0));
  sum(rows).backward();
  std::vector<float> g = pos.weight.grad().to_vector();
  for (int64_t p = 0; p < 10; ++p) EXPECT_EQ(g[p * 4], (p >= 2 && p < 5) ? 1.0f : 0.0f) << p;
  EXPECT_THROW(pos.forward(9, 2), Error);
}

TEST(Blocks, ConfigurationErrors) {
  Rng rng(0);
  EXPECT_THROW(MultiheadAttention({.d_model = 10, .nhead = 4}, rng), Error);
  EXPECT_THROW(MultiheadAttention({.d_model = 16, .nhead = 4, .num_kv_heads = 3}, rng), Error);
  MultiheadAttention self({.d_model = 16, .nhead = 4}, rng);
  EXPECT_THROW(self.forward(Tensor::zeros({2, 3, 8})), Error);
  EXPECT_THROW(self.forward(Tensor::zeros({2, 3, 16}), Tensor::zeros({2, 4, 16})), Error);
}

}  // namespace
}  // namespace qkv

namespace qkv {
namespace {

TEST(Blocks, MixtureOfExpertsMatchesTorch) {
  const std::string c = "moe";
  Rng rng(0);
  MixtureOfExperts moe(16, 24, {.num_experts = 4, .top_k = 2, .aux_loss_weight = 0.01f}, rng);
  moe.load_state_dict(params_of(c));
  Tensor x = input(c, "x");
  const int64_t terms = testing::largest_dim({x}, params_of(c));
  const testing::Float32Bound fwd = testing::model_forward(terms, 1), bwd = testing::model_backward(terms, 1);
  Tensor out = moe.forward(x);
  EXPECT_TRUE(testing::float32_close(out, fixture().at(c + ".out"), fwd)) << "forward";
  EXPECT_NEAR(moe.aux_loss().item(), fixture().at(c + ".aux").item(), 1e-6f);
  EXPECT_EQ(moe.expert_counts(), fixture().at(c + ".counts").to_ints());
  add(sum(mul(out, fixture().at(c + ".r"))), moe.aux_loss()).backward();
  EXPECT_TRUE(testing::float32_close(x.grad(), fixture().at(c + ".grad.x"), bwd)) << "gradient of x";
  for (auto& [name, p] : moe.named_parameters())
    EXPECT_TRUE(testing::float32_close(p.grad(), fixture().at(c + ".pgrad." + name), bwd)) << "gradient of " << name;
}

TEST(Blocks, MixtureOfExpertsInALayer) {
  Rng rng(0);
  TransformerEncoderLayer layer({.d_model = 16, .dim_feedforward = 32, .dropout = 0.0f, .norm_first = true,
                                 .norm = NormKind::RMSNorm, .mlp = MLPKind::MoE, .moe = {.num_experts = 4, .top_k = 1},
                                 .attention = {.nhead = 2}},
                                rng);
  Tensor x = Tensor::randn({2, 5, 16}, rng);
  Tensor y = layer.forward(x);
  EXPECT_EQ(y.shape(), x.shape());
  auto* moe = dynamic_cast<MixtureOfExperts*>(layer.mlp.get());
  ASSERT_NE(moe, nullptr);
  int64_t routed = 0;
  for (int64_t n : moe->expert_counts()) routed += n;
  EXPECT_EQ(routed, 10);  // every token to exactly top_k = 1 expert
  EXPECT_GT(moe->aux_loss().item(), 0.0f);
  EXPECT_THROW(MixtureOfExperts(16, 8, {.num_experts = 2, .top_k = 3}, rng), Error);
}

}  // namespace
}  // namespace qkv
