// Modules, optimizers, schedules, clipping; a PyTorch-checked AdamW training
// step; a tiny end-to-end learning task; allocation-free warm steps; determinism.
#include <omp.h>

#include <cmath>

#include "qkv/allocator.h"
#include "qkv/io.h"
#include "qkv/nn.h"
#include "qkv/optim.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::all_close;

class TwoLayer : public Module {
public:
  explicit TwoLayer(Rng& rng) {
    encoder = register_module("encoder", std::make_shared<MLP>(MLPOptions{2, 16, 8, Activation::Tanh}, rng));
    norm = register_module("norm", std::make_shared<LayerNorm>(8));
    head = register_module("head", std::make_shared<Linear>(LinearOptions{8, 2}, rng));
  }
  Tensor forward(const Tensor& x) { return head->forward(norm->forward(encoder->forward(x))); }
  std::shared_ptr<MLP> encoder;
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> head;
};

// A Linear weight converted for inference (bf16, f16, int8) and back to
// float32 is a trainable parameter again: `qkv train --init` of a folder qkv
// convert wrote converts every weight back and trains it.
TEST(Module, LinearWeightsConvertedBackToFloat32TrainAgain) {
  for (DType dtype : {DType::BF16, DType::F16, DType::I8}) {
    Rng rng(0);
    Linear l({.in_features = 3, .out_features = 4}, rng);
    l.convert_weight(dtype);
    EXPECT_FALSE(l.weight.requires_grad()) << dtype_name(dtype);
    l.convert_weight(DType::F32);
    ASSERT_TRUE(l.weight.requires_grad()) << dtype_name(dtype);
    sum(l.forward(Tensor::full({2, 3}, 1.0f))).backward();
    EXPECT_TRUE(l.weight.grad().defined()) << dtype_name(dtype);
  }
}

TEST(Module, HierarchicalNamesAndStateDict) {
  Rng rng(0);
  TwoLayer m(rng);
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"encoder.fc1.weight", "encoder.fc1.bias", "encoder.fc2.weight",
                                             "encoder.fc2.bias", "norm.weight", "norm.bias", "head.weight",
                                             "head.bias"}));
  EXPECT_EQ(m.parameter_count(), 2 * 16 + 16 + 16 * 8 + 8 + 8 + 8 + 8 * 2 + 2);
  Rng other(1);
  TwoLayer m2(other);
  m2.load_state_dict(m.state_dict());
  for (auto& [n, p] : m2.named_parameters()) EXPECT_TRUE(all_close(p, m.state_dict().at(n), 0, 0)) << n;
  StateDict bad = m.state_dict();
  bad["head.weight"] = Tensor::zeros({3, 8});
  try {
    m2.load_state_dict(bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "load_state_dict: tensor 'head.weight' has shape [3,8], model expects [2,8]");
  }
  bad = m.state_dict();
  bad.erase("norm.bias");
  EXPECT_THROW(m2.load_state_dict(bad), Error);
  bad = m.state_dict();
  bad["extra"] = Tensor::zeros({1});
  EXPECT_THROW(m2.load_state_dict(bad), Error);
  m.eval();
  EXPECT_FALSE(m.encoder->is_training());
  m.train();
  EXPECT_TRUE(m.head->is_training());
}

TEST(Optim, SGDMomentumByHand) {
  Tensor p = Tensor::from_vector({1.0f}, {1}).set_requires_grad(true);
  SGD opt({p}, {.lr = 0.1f, .momentum = 0.9f});
  // loss = p^2 -> g = 2p. v1 = 2; p1 = 1 - 0.2 = 0.8. g2 = 1.6; v2 = 1.8 + 1.6 = 3.4; p2 = 0.8 - 0.34
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    sum(mul(p, p)).backward();
    opt.step();
  }
  EXPECT_NEAR(p.item(), 0.46f, 1e-6f);
}

TEST(Optim, SchedulesAndClipping) {
  WarmupInverseSqrt inv{.peak_lr = 1.0f, .warmup_steps = 100};
  EXPECT_FLOAT_EQ(inv.lr_at(50), 0.5f);
  EXPECT_FLOAT_EQ(inv.lr_at(100), 1.0f);
  EXPECT_FLOAT_EQ(inv.lr_at(400), 0.5f);
  WarmupCosine cos{.peak_lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10, .total_steps = 110};
  EXPECT_FLOAT_EQ(cos.lr_at(5), 0.5f);
  EXPECT_FLOAT_EQ(cos.lr_at(10), 1.0f);
  EXPECT_NEAR(cos.lr_at(60), 0.55f, 1e-6f);
  EXPECT_NEAR(cos.lr_at(110), 0.1f, 1e-6f);
  EXPECT_NEAR(cos.lr_at(500), 0.1f, 1e-6f);

  Tensor a = Tensor::zeros({2}).set_requires_grad(true), b = Tensor::zeros({1}).set_requires_grad(true);
  a.set_grad(Tensor::from_vector({3, 0}, {2}));
  b.set_grad(Tensor::from_vector({4}, {1}));
  EXPECT_FLOAT_EQ(clip_grad_norm({a, b}, 1.0f), 5.0f);
  EXPECT_NEAR(a.grad().to_vector()[0], 0.6f, 1e-5f);
  EXPECT_NEAR(b.grad().to_vector()[0], 0.8f, 1e-5f);
  EXPECT_NEAR(clip_grad_norm({a, b}, 2.0f), 1.0f, 1e-5f);  // under the limit: unchanged
  EXPECT_NEAR(a.grad().to_vector()[0], 0.6f, 1e-5f);
}

TEST(Train, ClippingAndAdamWSplitBetweenThreadsMatchOneThread) {
  // Enough parameters that both run as one region with each thread taking a
  // share of every tensor (odd sizes, a parameter without a gradient, one
  // gradient set from a strided view): the same steps on one thread and on two.
  auto run = [](int threads) {
    omp_set_num_threads(threads);
    Rng rng(3);
    std::vector<Tensor> params;
    for (int64_t n : {70001, 3, 1000, 517}) params.push_back(Tensor::randn({n}, rng).set_requires_grad(true));
    AdamW opt(params, {.lr = 0.01f, .weight_decay = 0.1f});
    std::vector<float> norms;
    for (int step = 0; step < 3; ++step) {
      Rng g(10 + step);
      for (size_t i = 0; i < 3; ++i) params[i].set_grad(Tensor::randn(params[i].shape(), g, 3.0f));
      params[2].set_grad(Tensor::randn({1000, 2}, g).slice(1, 0, 1).reshape({1000}));  // stride 2
      norms.push_back(clip_grad_norm(params, 1.0f));
      opt.step();
    }
    omp_set_num_threads(1);
    return std::make_pair(params, norms);
  };
  auto [one, one_norms] = run(1);
  auto [two, two_norms] = run(2);
  for (size_t s = 0; s < one_norms.size(); ++s) EXPECT_NEAR(one_norms[s], two_norms[s], 1e-3f) << "step " << s;
  EXPECT_GT(one_norms[0], 100.0f);  // far over the limit: the clipping scaled every gradient
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(testing::all_close(one[i], two[i], 1e-6f, 1e-5f)) << "param " << i;
}

// Three AdamW steps of a 4 -> 8 -> 3 GELU MLP, against torch.optim.AdamW.
TEST(Golden, MLPAdamWStepsMatchPyTorch) {
  auto f = load_safetensors(testing::fixture("mlp_adamw.safetensors")).as_map();
  Rng rng(0);
  MLP mlp({4, 8, 3, Activation::Gelu}, rng);
  StateDict init;
  for (auto& [n, p] : mlp.named_parameters()) init[n] = f.at("init." + n);
  mlp.load_state_dict(init);
  AdamW opt(mlp.parameters(), {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f});
  std::vector<float> losses = f.at("losses").to_vector();
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy(mlp.forward(f.at("x")), f.at("y"));
    EXPECT_NEAR(loss.item(), losses[step], 1e-5f) << "step " << step;
    loss.backward();
    if (step == 0) {
      EXPECT_TRUE(all_close(mlp.fc1->weight.grad(), f.at("grad0.fc1.weight"), 1e-6f, 1e-4f));
      EXPECT_TRUE(all_close(mlp.fc2->weight.grad(), f.at("grad0.fc2.weight"), 1e-6f, 1e-4f));
    }
    opt.step();
  }
  for (auto& [n, p] : mlp.named_parameters())
    EXPECT_TRUE(all_close(p, f.at("final." + n), 1e-6f, 1e-5f)) << n;
}

struct XorRun {
  float first_loss = 0, last_loss = 0;
  uint64_t warm_system_allocs = 0;
  std::vector<float> final_params;
};

// XOR with a hidden layer: not linearly separable, so the MLP must learn.
XorRun train_xor(int steps, uint64_t seed) {
  Rng rng(seed);
  MLP mlp({2, 16, 2, Activation::Tanh}, rng);
  AdamW opt(mlp.parameters(), {.lr = 0.05f, .weight_decay = 0.0f});
  Tensor x = Tensor::from_vector({0, 0, 0, 1, 1, 0, 1, 1}, {4, 2});
  Tensor y = Tensor::from_ints({0, 1, 1, 0}, {4});
  XorRun run;
  for (int step = 0; step < steps; ++step) {
    uint64_t before = allocator_stats().system_allocs;
    opt.zero_grad();
    Tensor loss = cross_entropy(mlp.forward(x), y);
    loss.backward();
    clip_grad_norm(mlp.parameters(), 1.0f);
    opt.step();
    float l = loss.item();
    if (step == 0) run.first_loss = l;
    run.last_loss = l;
    if (step >= 3) run.warm_system_allocs += allocator_stats().system_allocs - before;
  }
  for (auto& p : mlp.parameters())
    for (float v : p.to_vector()) run.final_params.push_back(v);
  return run;
}

TEST(EndToEnd, MLPLearnsXor) {
  XorRun run = train_xor(300, 1);
  EXPECT_GT(run.first_loss, 0.5f);
  EXPECT_LT(run.last_loss, 0.05f) << "loss went from " << run.first_loss << " to " << run.last_loss;
}

TEST(EndToEnd, WarmStepAllocatesNothing) {
#ifdef QKV_NO_ALLOC_CACHE
  GTEST_SKIP() << "the allocator cache is off in sanitizer builds";
#endif
  XorRun run = train_xor(20, 1);
  EXPECT_EQ(run.warm_system_allocs, 0u) << "system allocations in 17 warm steps";
}

TEST(EndToEnd, SameSeedSameNumbers) {
  XorRun a = train_xor(30, 5), b = train_xor(30, 5), c = train_xor(30, 6);
  EXPECT_EQ(a.final_params, b.final_params);
  EXPECT_NE(a.final_params, c.final_params);
}

}  // namespace
}  // namespace qkv
