// Scaled dot-product attention: flash equals naive, forward and every
// gradient, over a table of shapes and masks; a hand-computed case; finite
// differences through the flash backward, which writes every gradient element
// itself; memory that grows linearly.
#include <omp.h>

#include <cmath>

#include "qkv/allocator.h"
#include "qkv/attention.h"
#include "qkv/ops.h"
#include "qkv/rng.h"
#include "src/kernels/kernels.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::all_close;

struct AttnCase {
  std::string name;
  int64_t batch, heads, kv_heads, t, s, dh, dv;
  bool causal = false;
  std::vector<int64_t> lengths = {};  // key padding lengths per batch, empty = none
};

void PrintTo(const AttnCase& c, std::ostream* os) { *os << c.name; }

struct AttnRun {
  Tensor out, dq, dk, dv;
};

AttnRun run_attention(const AttnCase& c, AttentionImpl impl) {
  Rng rng(17);
  Tensor q = Tensor::randn({c.batch, c.heads, c.t, c.dh}, rng).set_requires_grad(true);
  Tensor k = Tensor::randn({c.batch, c.kv_heads, c.s, c.dh}, rng).set_requires_grad(true);
  Tensor v = Tensor::randn({c.batch, c.kv_heads, c.s, c.dv}, rng).set_requires_grad(true);
  AttentionOptions o;
  o.causal = c.causal;
  o.impl = impl;
  if (!c.lengths.empty()) o.key_padding_lengths = Tensor::from_ints(c.lengths, {c.batch});
  Tensor out = scaled_dot_product_attention(q, k, v, o);
  Tensor r = Tensor::randn(out.shape(), rng);
  sum(mul(out, r)).backward();
  return {out, q.grad(), k.grad(), v.grad()};
}

std::vector<AttnCase> attention_table() {
  return {
      {"single", 1, 1, 1, 1, 1, 32, 32},
      {"one_tile", 1, 2, 2, 64, 64, 64, 64},
      {"ragged_cross", 2, 2, 2, 100, 77, 32, 32},
      {"ragged_cross_causal", 1, 2, 2, 70, 150, 64, 64, true},
      {"causal_square", 1, 3, 3, 130, 130, 64, 64, true},
      {"causal_decode_step", 2, 2, 2, 1, 200, 64, 64, true},
      {"causal_more_queries_than_keys", 1, 1, 1, 200, 50, 32, 32, true},  // first 150 rows see nothing
      {"padding", 3, 2, 2, 40, 150, 32, 32, false, {150, 7, 0}},             // batch 2 fully masked
      {"padding_causal", 2, 2, 2, 129, 129, 32, 32, true, {129, 64}},
      {"grouped_query", 2, 4, 2, 65, 90, 64, 64, true},
      {"multi_query", 1, 4, 1, 33, 140, 32, 32},
      {"head_dim_128", 1, 2, 2, 70, 260, 128, 128, true},
      {"value_dim_differs", 1, 2, 1, 50, 60, 32, 48},
  };
}

class FlashVsNaive : public ::testing::TestWithParam<AttnCase> {};

TEST_P(FlashVsNaive, ForwardAndGradientsAgree) {
  omp_set_num_threads(2);  // tiles and heads split across threads
  const AttnCase& c = GetParam();
  AttnRun flash = run_attention(c, AttentionImpl::Flash), naive = run_attention(c, AttentionImpl::Naive);
  // Same math in float, different summation order: a few ulps of the output scale.
  EXPECT_TRUE(all_close(flash.out, naive.out, 2e-5f, 1e-4f)) << "out";
  EXPECT_TRUE(all_close(flash.dq, naive.dq, 1e-4f, 1e-3f)) << "dq";
  EXPECT_TRUE(all_close(flash.dk, naive.dk, 1e-4f, 1e-3f)) << "dk";
  EXPECT_TRUE(all_close(flash.dv, naive.dv, 1e-4f, 1e-3f)) << "dv";
  for (float x : flash.out.to_vector()) ASSERT_FALSE(std::isnan(x));
  for (float x : flash.dq.to_vector()) ASSERT_FALSE(std::isnan(x));
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashVsNaive, ::testing::ValuesIn(attention_table()),
                         [](const ::testing::TestParamInfo<AttnCase>& info) { return info.param.name; });

// Self-attention from one packed [B, T, (H + 2 Hkv) Dh] projection: the flash
// path reads the heads in place and writes dqkv in one buffer; the naive path
// splits the heads out and composes ops. Both must agree, forward and backward.
TEST(Attention, PackedSelfAttentionFlashEqualsNaive) {
  omp_set_num_threads(2);
  const std::vector<AttnCase> cases = {
      {"single", 1, 1, 1, 1, 1, 16, 16},
      {"vit_like", 3, 4, 4, 16, 16, 32, 32},
      {"causal_two_tiles", 1, 3, 3, 130, 130, 64, 64, true},
      {"grouped_query_causal", 2, 4, 2, 70, 70, 32, 32, true},
      {"padding", 3, 2, 2, 40, 40, 16, 16, false, {40, 9, 0}},
  };
  for (const AttnCase& c : cases) {
    auto run = [&](AttentionImpl impl) {
      Rng rng(23);
      const int64_t C = (c.heads + 2 * c.kv_heads) * c.dh;
      Tensor qkv = Tensor::randn({c.batch, c.t, C}, rng).set_requires_grad(true);
      AttentionOptions o;
      o.causal = c.causal;
      o.impl = impl;
      if (!c.lengths.empty()) o.key_padding_lengths = Tensor::from_ints(c.lengths, {c.batch});
      Tensor out = packed_self_attention(qkv, c.heads, c.kv_heads, o);
      EXPECT_EQ(out.shape(), (Shape{c.batch, c.t, c.heads * c.dh})) << c.name;
      sum(mul(out, Tensor::randn(out.shape(), rng))).backward();
      return std::pair{out, qkv.grad()};
    };
    auto [flash_out, flash_grad] = run(AttentionImpl::Flash);
    auto [naive_out, naive_grad] = run(AttentionImpl::Naive);
    EXPECT_TRUE(all_close(flash_out, naive_out, 2e-5f, 1e-4f)) << c.name << " out";
    EXPECT_TRUE(all_close(flash_grad, naive_grad, 1e-4f, 1e-3f)) << c.name << " dqkv";
  }
  Tensor bad = Tensor::zeros({1, 2, 10});
  EXPECT_THROW(packed_self_attention(bad, 2, 1), Error);  // 10 is not a multiple of H + 2 Hkv = 4
  EXPECT_THROW(packed_self_attention(Tensor::zeros({1, 2, 12}), 3, 2), Error);  // H not a multiple of Hkv
}

// Decoding rows with caches of their own: one call equals a call of
// scaled_dot_product_attention (naive path) per row, for caches of different
// lengths (across the kernel's key tiles) read in place from larger buffers,
// with grouped queries; with a gradient to compute it takes the per-row path
// and still agrees; rows that disagree in heads are an error.
TEST(Attention, CachedRowsAttentionEqualsOneCallPerRow) {
  omp_set_num_threads(2);
  Rng rng(41);
  const int64_t H = 4, Hkv = 2, Dh = 16, capacity = 200;
  const std::vector<int64_t> lengths = {1, 64, 65, 150};
  const int64_t B = (int64_t)lengths.size();
  std::vector<Tensor> k_caches, v_caches, keys, values;
  for (int64_t n : lengths) {
    k_caches.push_back(Tensor::randn({1, Hkv, capacity, Dh}, rng));
    v_caches.push_back(Tensor::randn({1, Hkv, capacity, Dh}, rng));
    keys.push_back(k_caches.back().slice(2, 0, n));
    values.push_back(v_caches.back().slice(2, 0, n));
  }
  Tensor q = Tensor::randn({B, H, 1, Dh}, rng);
  std::vector<Tensor> expected;
  for (int64_t b = 0; b < B; ++b)
    expected.push_back(
        scaled_dot_product_attention(q.slice(0, b, b + 1), keys[b], values[b], {.impl = AttentionImpl::Naive}));
  {
    NoGradGuard no_grad;
    EXPECT_TRUE(all_close(cached_rows_attention(q, keys, values), concat(expected, 0), 1e-5f, 1e-4f));
  }
  Tensor qg = q.detach().set_requires_grad(true);
  Tensor with_grad = cached_rows_attention(qg, keys, values);
  EXPECT_TRUE(with_grad.requires_grad());
  EXPECT_TRUE(all_close(with_grad, concat(expected, 0), 1e-5f, 1e-4f));
  std::vector<Tensor> odd_keys = keys;
  odd_keys[2] = Tensor::randn({1, 1, 65, Dh}, rng);  // one key/value head where the others have two
  EXPECT_THROW(cached_rows_attention(q, odd_keys, values), Error);
  EXPECT_THROW(cached_rows_attention(q, keys, {values.begin(), values.end() - 1}), Error);
}

TEST(Attention, HandComputed) {
  // One query, two keys: scores q.k / sqrt(2) = [1, 0] -> weights softmax([1, 0]).
  Tensor q = Tensor::from_vector({std::sqrt(2.0f), 0}, {1, 1, 1, 2});
  Tensor k = Tensor::from_vector({1, 0, 0, 1}, {1, 1, 2, 2});
  Tensor v = Tensor::from_vector({10, 0, 0, 10}, {1, 1, 2, 2});
  float w0 = std::exp(1.0f) / (std::exp(1.0f) + 1.0f);
  Tensor expected = Tensor::from_vector({10 * w0, 10 * (1 - w0)}, {1, 1, 1, 2});
  for (AttentionImpl impl : {AttentionImpl::Naive, AttentionImpl::Flash})
    EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, {.impl = impl}), expected, 1e-5f, 1e-5f));
  AttentionWithWeights w = attention_with_weights(q, k, v);
  EXPECT_TRUE(all_close(w.weights, Tensor::from_vector({w0, 1 - w0}, {1, 1, 1, 2}), 1e-6f, 1e-6f));
  // A causal mask with T == S == 2: the first query sees only the first key.
  Tensor q2 = Tensor::zeros({1, 1, 2, 2});
  AttentionWithWeights c = attention_with_weights(q2, k, v, {.causal = true});
  EXPECT_EQ(c.weights.to_vector(), (std::vector<float>{1, 0, 0.5f, 0.5f}));
}

TEST(Attention, ArbitraryMasksOnTheNaivePath) {
  Rng rng(3);
  Tensor q = Tensor::randn({2, 2, 3, 8}, rng), k = Tensor::randn({2, 2, 5, 8}, rng), v = Tensor::randn({2, 2, 5, 8}, rng);
  // A boolean mask that hides keys 3 and 4 equals key padding with length 3.
  Tensor bool_mask = Tensor::from_ints({0, 0, 0, 1, 1}, {1, 1, 1, 5}).to(DType::U8);
  Tensor additive = Tensor::from_vector({0, 0, 0, -INFINITY, -INFINITY}, {5});
  Tensor lengths = Tensor::from_ints({3, 3}, {2});
  Tensor by_padding = scaled_dot_product_attention(q, k, v, {.key_padding_lengths = lengths});
  EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, {.attn_mask = bool_mask}), by_padding, 1e-5f, 1e-5f));
  EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, {.attn_mask = additive}), by_padding, 1e-5f, 1e-5f));
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {.attn_mask = bool_mask, .impl = AttentionImpl::Flash}), Error);
  EXPECT_THROW(scaled_dot_product_attention(q, k, Tensor::zeros({2, 2, 4, 8})), Error);
  EXPECT_THROW(scaled_dot_product_attention(q, Tensor::zeros({2, 3, 5, 8}), Tensor::zeros({2, 3, 5, 8})), Error);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {.key_padding_lengths = Tensor::from_ints({6, 1}, {2})}), Error);
}

// Central differences of sum(out * R) through the flash path itself.
TEST(Attention, FlashBackwardMatchesFiniteDifferences) {
  AttnCase c{"fd", 1, 2, 1, 5, 7, 4, 3, true, {6}};
  Rng rng(5);
  std::vector<Tensor> xs = {Tensor::randn({1, 2, 5, 4}, rng), Tensor::randn({1, 1, 7, 4}, rng),
                            Tensor::randn({1, 1, 7, 3}, rng)};
  Tensor r = Tensor::randn({1, 2, 5, 3}, rng);
  AttentionOptions o{.causal = true, .key_padding_lengths = Tensor::from_ints({6}, {1}), .impl = AttentionImpl::Flash};
  auto loss = [&] {
    NoGradGuard g;
    return sum(mul(scaled_dot_product_attention(xs[0], xs[1], xs[2], o), r)).item();
  };
  std::vector<Tensor> leaves;
  for (Tensor& x : xs) leaves.push_back(x.clone().detach().set_requires_grad(true));
  sum(mul(scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], o), r)).backward();
  const float eps = 1e-2f;
  for (size_t i = 0; i < xs.size(); ++i)
    EXPECT_TRUE(all_close(leaves[i].grad(), testing::numeric_gradient(xs[i], loss, eps), 5e-3f, 5e-3f)) << i;
}

// Peak extra bytes (allocator counters) of one flash forward + backward at length n.
uint64_t flash_peak_extra(int64_t n) {
  Rng rng(1);
  Tensor q = Tensor::randn({1, 1, n, 64}, rng).set_requires_grad(true);
  Tensor k = Tensor::randn({1, 1, n, 64}, rng).set_requires_grad(true);
  Tensor v = Tensor::randn({1, 1, n, 64}, rng).set_requires_grad(true);
  Tensor r = Tensor::randn({1, 1, n, 64}, rng);
  uint64_t base = allocator_stats().bytes_in_use;
  reset_peak_bytes();
  Tensor out = scaled_dot_product_attention(q, k, v, {.causal = true, .impl = AttentionImpl::Flash});
  sum(mul(out, r)).backward();
  return allocator_stats().peak_bytes_in_use - base;
}

TEST(Attention, FlashMemoryGrowsLinearly) {
  // The inputs are [n, 64]; everything the forward and backward allocate (the
  // output, the row statistics, the gradients, per-thread tiles) is O(n).
  // A single n x n float buffer at n = 8192 would be 256 MiB on its own.
  uint64_t at_1k = flash_peak_extra(1024), at_8k = flash_peak_extra(8192);
  std::printf("flash attention fwd+bwd peak extra bytes: n=1024 %llu, n=8192 %llu (ratio %.2f)\n",
              (unsigned long long)at_1k, (unsigned long long)at_8k, (double)at_8k / at_1k);
  EXPECT_LT(at_8k, 10 * at_1k) << "8x the length must cost at most ~8x the memory (quadratic would be 64x)";
  EXPECT_LT(at_8k, 8192ull * 8192 * 4 / 8) << "under an eighth of one n x n float buffer";
}

// Mixed precision: under Bf16AutocastGuard the flash path multiplies in
// bfloat16 (FlashShape::bf16) from 128 queries and keys on, forward and,
// after the guard has gone, the backward the op recorded: the op's values
// are the kernel's, called directly with the flag, and differ from the
// float32 kernel's. A shorter sequence (9) stays float32: its values are the
// float32 kernel's. Both the unpacked and the packed entry. (The kernels'
// own bound, short sequences' rounded copies included: tests/test_kernels.cpp.)
TEST(Attention, FlashUnderBf16AutocastMultipliesInBfloat16) {
  for (const int64_t T : {9, 130}) {
    SCOPED_TRACE(T);
    const int64_t H = 2, D = 16;
    Rng rng(8);
    Tensor q = Tensor::randn({1, H, T, D}, rng), k = Tensor::randn({1, H, T, D}, rng),
           v = Tensor::randn({1, H, T, D}, rng);
    Tensor r = Tensor::randn({1, H, T, D}, rng);
    auto kernel = [&](bool bf16, Tensor& out, Tensor& dq) {
      FlashShape f{1, H, H, T, T, D, D};
      f.scale = 0.25f, f.causal = true, f.bf16 = bf16;
      out = Tensor::empty({1, H, T, D}), dq = Tensor::empty({1, H, T, D});
      Tensor lse = Tensor::empty({1, H, T}), dk = Tensor::empty({1, H, T, D}), dv = Tensor::empty({1, H, T, D});
      kernels_for(Device::Cpu)
          .flash_attention_forward(f, q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                   lse.data<float>());
      kernels_for(Device::Cpu)
          .flash_attention_backward(f, q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                    r.data<float>(), lse.data<float>(), dq.data<float>(), dk.data<float>(),
                                    dv.data<float>());
    };
    Tensor out16, dq16, out32, dq32;
    kernel(true, out16, dq16);
    kernel(false, out32, dq32);
    EXPECT_FALSE(all_close(out16, out32, 1e-5f, 1e-5f));
    if (T < 128) out16 = out32, dq16 = dq32;  // what the op must give
    Tensor qg = q.clone().set_requires_grad(true);
    Tensor y;
    {
      Bf16AutocastGuard mixed;
      y = scaled_dot_product_attention(qg, k, v, {.causal = true, .impl = AttentionImpl::Flash});
    }
    sum(mul(y, r)).backward();
    EXPECT_TRUE(all_close(y, out16, 0, 0));
    EXPECT_TRUE(all_close(qg.grad(), dq16, 0, 0));
    // Packed: [1, T, 3 H D] with q, k, v side by side on each row.
    std::vector<float> rows(T * 3 * H * D);
    const std::vector<float> qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector();
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t from = (h * T + t) * D + d, to = t * 3 * H * D + h * D + d;
          rows[to] = qv[from], rows[to + H * D] = kv[from], rows[to + 2 * H * D] = vv[from];
        }
    Tensor packed = Tensor::from_vector(rows, {1, T, 3 * H * D});
    Tensor yp;
    {
      Bf16AutocastGuard mixed;
      yp = packed_self_attention(packed, H, H, {.causal = true, .impl = AttentionImpl::Flash});
    }
    EXPECT_TRUE(all_close(yp, out16.permute({0, 2, 1, 3}).reshape({1, T, H * D}), 0, 0));
  }
}

}  // namespace
}  // namespace qkv
