// The decoder-only language model: forward and every gradient against a
// plain PyTorch reference with the same weights (scripts/make_fixtures.py ->
// tests/fixtures/decoder_golden.safetensors), dense and MoE; cached
// decoding (prefill, then one token at a time) equals the full forward.
#include <cmath>

#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "qkv/lm.h"
#include "qkv/tokenizer.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::all_close;

const std::map<std::string, Tensor>& golden() {
  return testing::fixture_tensors("decoder_golden.safetensors");
}

DecoderConfig golden_config(const std::string& name) {
  if (name == "lm_separate") {  // through the config keys, as a converted checkpoint would set them
    return DecoderConfig::from_json(R"({"vocab_size": 23, "d_model": 16, "nhead": 4, "num_kv_heads": 2, "head_dim": 6,
        "num_layers": 2, "dim_feedforward": 24, "dropout": 0, "context": 10, "qkv_layout": "separate",
        "k_bias": false, "out_bias": false, "qk_norm": true, "qk_norm_eps": 0.001, "norm_eps": 0.01,
        "rope_theta": 500000})", "lm_separate");
  }
  DecoderConfig c;
  c.vocab_size = 23, c.d_model = 16, c.nhead = 4, c.num_layers = 2, c.dim_feedforward = 24, c.dropout = 0;
  c.context = 10;
  if (name == "lm_moe") {
    c.norm = NormKind::LayerNorm, c.positions = PositionKind::Learned, c.mlp = MLPKind::MoE, c.tie_output = false;
    c.moe.num_experts = 4, c.moe.top_k = 2;
  } else {
    c.norm = NormKind::RMSNorm, c.positions = PositionKind::Rope, c.mlp = MLPKind::SwiGLU, c.qk_norm = true;
    c.num_kv_heads = 2;
  }
  return c;
}

class DecoderGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderGolden, ForwardAndGradientsMatchPyTorch) {
  const std::string c = GetParam();
  const bool moe = c == "lm_moe";
  Rng rng(0);
  DecoderLM model(golden_config(c), rng);
  StateDict params;
  const std::string prefix = c + ".param.";
  for (auto& [k, v] : golden())
    if (k.rfind(prefix, 0) == 0) params[k.substr(prefix.size())] = v;
  model.load_state_dict(params);  // every parameter, none extra
  // The float32 rounding bound (tests/test_util.h) for 2 layers, the longest
  // sum being the feed-forward width, the vocabulary or the tokens. Honest
  // runs stay under 0.2 of it; a dropped term exceeds it 3900x or more (the
  // mutations listed at float32_close).
  const int64_t terms = testing::largest_dim({golden().at(c + ".out")}, params);
  Tensor logits = model.forward(golden().at(c + ".ids"));
  EXPECT_TRUE(testing::float32_close(logits, golden().at(c + ".out"), testing::model_forward(terms, 2))) << c << " forward";
  Tensor loss = sum(mul(logits, golden().at(c + ".r")));
  if (moe) {
    ASSERT_TRUE(model.aux_loss().defined());
    EXPECT_NEAR(model.aux_loss().item(), golden().at(c + ".aux").item(), 1e-5);
    loss = add(loss, model.aux_loss());
  }
  loss.backward();
  int checked = 0;
  for (auto& [name, p] : model.named_parameters()) {
    auto it = golden().find(c + ".pgrad." + name);
    ASSERT_NE(it, golden().end()) << c << ": no reference gradient for " << name;
    EXPECT_TRUE(testing::float32_close(p.grad(), it->second, testing::model_backward(terms, 2)))
        << c << " gradient of " << name;
    ++checked;
  }
  EXPECT_EQ(checked, (int)params.size());
}

// lm_separate: separate q/k/v with a bias on q and v only, head_dim != d_model / nhead,
// rope_theta, norm_eps and qk_norm_eps all away from their defaults.
INSTANTIATE_TEST_SUITE_P(PyTorch, DecoderGolden, ::testing::Values("lm_dense", "lm_moe", "lm_separate"));

class DecoderCache : public ::testing::TestWithParam<std::string> {};

// Prefill 5 tokens, then 6 single steps: every step's logits equal the full
// forward's at that position, and the greedy tokens agree. The caches start
// as NaN: nothing may read a position before it is written (make_cache
// leaves them uninitialized); a step that read the whole capacity would give
// NaN logits.
TEST_P(DecoderCache, CachedEqualsFullForward) {
  DecoderConfig c = DecoderConfig::from_json(GetParam(), "case");
  c.vocab_size = 31;
  Rng rng(7);
  DecoderLM model(c, rng);
  model.eval();
  NoGradGuard no_grad;
  std::vector<int64_t> prompt = {3, 9, 4, 27, 1, 8, 8, 20, 5, 6};  // two rows of 5
  Tensor ids = Tensor::from_ints(prompt, {2, 5});
  std::vector<KVCache> caches = model.make_caches(2, 16);
  for (KVCache& cache : caches) cache.k.fill_(NAN), cache.v.fill_(NAN);
  Tensor step_logits = model.forward_cached(ids, caches);
  {  // a prefill keeping the last position's logits only: those, and the same caches
    std::vector<KVCache> again = model.make_caches(2, 16);
    Tensor last = model.forward_cached(ids, again, /*last_only=*/true);
    ASSERT_EQ(last.shape(), (Shape{2, 1, c.vocab_size})) << GetParam();
    EXPECT_TRUE(all_close(last, step_logits.slice(1, 4, 5).contiguous(), 1e-5f, 1e-5f)) << GetParam();
    EXPECT_EQ(again[0].length, 5);
    EXPECT_TRUE(
        all_close(again.back().k.slice(2, 0, 5).contiguous(), caches.back().k.slice(2, 0, 5).contiguous(), 0, 0))
        << GetParam();
  }
  std::vector<std::vector<int64_t>> seq = {{3, 9, 4, 27, 1}, {8, 8, 20, 5, 6}};
  const int64_t V = c.vocab_size;
  for (int step = 0; step < 6; ++step) {
    std::vector<int64_t> flat;
    for (auto& s : seq) flat.insert(flat.end(), s.begin(), s.end());
    const int64_t T = (int64_t)seq[0].size();
    Tensor full = model.forward(Tensor::from_ints(flat, {2, T}));
    Tensor full_last = full.slice(1, T - 1, T).contiguous();
    Tensor cached_last = step_logits.slice(1, step_logits.size(1) - 1, step_logits.size(1)).contiguous();
    ASSERT_TRUE(all_close(cached_last, full_last, 1e-5f, 1e-5f)) << GetParam() << " step " << step;
    std::vector<int64_t> next;
    for (int64_t b = 0; b < 2; ++b) {
      const float* row = cached_last.data<float>() + b * V;
      next.push_back(std::max_element(row, row + V) - row);
      seq[b].push_back(next.back());
    }
    step_logits = model.forward_cached(Tensor::from_ints(next, {2, 1}), caches);
  }
  EXPECT_EQ(caches[0].length, 11);
}

// Every Linear weight in bfloat16 (qkv generate --dtype bf16): the logits
// move by the format's rounding only. Each product rounds both its operands
// to 8 bits (a relative 2^-8 at most, together); a layer chains about three
// products and the head one more, so the logits move by at most
// (3 layers + 1) 2^-8 of their largest magnitude. A weight zeroed by the
// conversion moves them by their whole size.
// The logits of ids [2, 5] from every decoder variant in float32 and after
// convert_linear_weights(dtype), whole and from the KV cache; how far the
// converted ones move, as fractions of the largest float32 logit.
struct ConvertedLogits {
  float worst = 0, worst_cached = 0, largest = 0;
  std::vector<float> logits;  // after converting
  int64_t layers = 0;
  std::shared_ptr<DecoderLM> model;  // converted
};
ConvertedLogits converted_logits(const std::string& config, DType dtype) {
  DecoderConfig c = DecoderConfig::from_json(config, "case");
  c.vocab_size = 31;
  Rng rng(8);
  auto model = std::make_shared<DecoderLM>(c, rng);
  model->eval();
  NoGradGuard no_grad;
  Tensor ids = Tensor::from_ints({3, 9, 4, 27, 1, 8, 8, 20, 5, 6}, {2, 5});
  const std::vector<float> f32 = model->forward(ids).to_vector();
  const uint64_t bytes = model->parameter_bytes();
  EXPECT_GT(model->convert_linear_weights(dtype), 0);
  EXPECT_EQ(model->linear_weight_dtype(), dtype);
  EXPECT_LT(model->parameter_bytes(), bytes);
  ConvertedLogits r;
  r.logits = model->forward(ids).to_vector();
  std::vector<KVCache> caches = model->make_caches(2, 8);
  const std::vector<float> cached = model->forward_cached(ids, caches).to_vector();
  for (size_t i = 0; i < f32.size(); ++i) {
    r.largest = std::max(r.largest, std::fabs(f32[i]));
    r.worst = std::max(r.worst, std::fabs(r.logits[i] - f32[i]));
    r.worst_cached = std::max(r.worst_cached, std::fabs(cached[i] - r.logits[i]));
  }
  r.layers = c.num_layers;
  r.model = model;
  return r;
}

// For each of the 10 positions, the largest difference between decoding
// r's prompt one token at a time (rows of 2: the paths for few rows) and
// r.logits (the whole prompt at once: 10 rows, the paths for many).
std::vector<float> stepped_moves(const ConvertedLogits& r) {
  NoGradGuard no_grad;
  const Tensor ids = Tensor::from_ints({3, 9, 4, 27, 1, 8, 8, 20, 5, 6}, {2, 5});
  std::vector<KVCache> steps = r.model->make_caches(2, 8);
  std::vector<float> moves(10, 0.0f);
  const int64_t V = 31;
  for (int64_t t = 0; t < 5; ++t) {
    const std::vector<float> l = r.model->forward_cached(ids.slice(1, t, t + 1).contiguous(), steps).to_vector();
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t v = 0; v < V; ++v)
        moves[b * 5 + t] = std::max(moves[b * 5 + t], std::fabs(l[b * V + v] - r.logits[(b * 5 + t) * V + v]));
  }
  return moves;
}

float worst_stepped(const ConvertedLogits& r) {
  const std::vector<float> moves = stepped_moves(r);
  return *std::max_element(moves.begin(), moves.end());
}

TEST_P(DecoderCache, Bf16LinearWeightsMoveLogitsByTheirRoundingOnly) {
  const ConvertedLogits r = converted_logits(GetParam(), DType::BF16);
  EXPECT_LE(r.worst, (3 * r.layers + 1) * std::ldexp(1.0f, -8) * r.largest) << GetParam();
  EXPECT_LE(r.worst_cached, 1e-5f * r.largest) << GetParam();
}

// Every Linear weight in float16 (qkv generate --dtype f16): the same
// measure, with float16's rounding of the weights only (2^-11 of each; the
// activations stay float32), so the bound is (3 layers + 1) 2^-11 of the
// largest logit. One token at a time (rows of 2: the streamed path) against
// the whole prompt (10 rows: the widened path) agree to float32's sums.
TEST_P(DecoderCache, F16LinearWeightsMoveLogitsByTheirRoundingOnly) {
  const ConvertedLogits r = converted_logits(GetParam(), DType::F16);
  EXPECT_LE(r.worst, (3 * r.layers + 1) * std::ldexp(1.0f, -11) * r.largest) << GetParam();
  EXPECT_LE(r.worst_cached, 1e-5f * r.largest) << GetParam();
  EXPECT_LE(worst_stepped(r), 1e-5f * r.largest) << GetParam();
}

// Every Linear weight in blockwise int8 (qkv generate --dtype int8): the
// same measure with int8's steps. A quantized operand moves by at most half
// a step, 1/254 of its block's largest magnitude; against the typical value
// of a block of 32 normal values (whose largest is about 2.5 times it), two
// rounded operands move a product by about 2 x 2.5 / 254 ~ 2^-5.6 of its size
// in the worst case, so the bound is (3 layers + 1) 2^-5 of the largest
// logit. Measured on these configs: at most 0.012 of it. Zeroing one weight's
// last block of 32 (a dropped block) moved the logits by 0.9-1.4 of it.
TEST_P(DecoderCache, Int8LinearWeightsMoveLogitsByTheirStepsOnly) {
  const ConvertedLogits r = converted_logits(GetParam(), DType::I8);
  DecoderLM* model = r.model.get();
  EXPECT_LE(r.worst, (3 * r.layers + 1) * std::ldexp(1.0f, -6) * r.largest) << GetParam();
  EXPECT_LE(r.worst_cached, 1e-5f * r.largest) << GetParam();
  // One token at a time (rows of 2: the streamed integer path) against the
  // whole prompt (10 rows: the VNNI tiles, or the dequantized path). The
  // two attend in float32 in another order (one query row against tiles),
  // and linear_int8 quantizes its input in blocks of 32: an input a float32
  // ulp from a midpoint between two int8 steps can land on either, which
  // moves that position (and, through the later layers' keys and values,
  // the positions after it in its sequence) by up to a step's worth,
  // within the int8 bound above, twice (each side against float32). So
  // every position stays within that, and a sequence whose positions all
  // agree to float32's sums (1e-4 of the largest logit) must remain: a
  // flip is rare (none on these configs so far), a wrong path moves all.
  const std::vector<float> moves = stepped_moves(r);
  int agreeing_sequences = 0;
  for (int b = 0; b < 2; ++b) {
    bool agrees = true;
    for (int t = 0; t < 5; ++t) {
      EXPECT_LE(moves[b * 5 + t], 2 * (3 * r.layers + 1) * std::ldexp(1.0f, -6) * r.largest) << GetParam();
      agrees = agrees && moves[b * 5 + t] <= 1e-4f * r.largest;
    }
    agreeing_sequences += agrees;
  }
  EXPECT_GE(agreeing_sequences, 1) << GetParam();
  NoGradGuard no_grad;
  model->convert_linear_weights(DType::F32);
  EXPECT_EQ(model->linear_weight_dtype(), DType::F32);
}

// With bfloat16 weights the attention of 128 tokens or more multiplies
// bfloat16 operands too (DecoderLM::forward; the flash kernel's threshold),
// whole and from the KV cache. Against the naive attention (need_weights:
// float32 products) the logits then move by the rounding of Q, K, V and P:
// each product's operands together by at most 2^-8 of it, two products an
// attention, so at most (2 layers x 2) 2^-8 of the largest logit. Below 128
// tokens both run float32 attention and differ in float32's last bits, but a
// bf16 Linear after them rounds its input to bfloat16 (AVX512-BF16, AMX), so
// an input within a float32 ulp of a rounding midpoint moves by a bfloat16
// ulp there (seen on Zen 4: one position of 100 moved by 0.5% of the largest
// logit), and in layers after the first the later positions, whose keys
// and values it then changes, move too, by about its move over their count
// of keys. So below 128 tokens at most a tenth of the positions may move by
// more than 1e-4 of the largest logit (ten times float32's 1e-5, above what
// such a change spreads to the others), and at 136 more than half must
// (measured on Zen 4: 0-2 of 100, and 132-135 of 136 past 1e-4, 134-135
// past 1e-5; the guard left out of DecoderLM::forward fails the second count).
TEST_P(DecoderCache, Bf16WeightsTakeBf16AttentionFrom128Tokens) {
  DecoderConfig c = DecoderConfig::from_json(GetParam(), "case");
  c.vocab_size = 31;
  Rng rng(9);
  DecoderLM model(c, rng);
  model.eval();
  NoGradGuard no_grad;
  const Tensor five = Tensor::from_ints({3, 9, 4, 27, 1}, {1, 5});
  Tensor mixed;
  {  // float32 weights under mixed precision: the guard the model sets for
     // bfloat16 weights must not turn off one already on
    Bf16AutocastGuard autocast(true);
    mixed = model.forward(five);
  }
  EXPECT_FALSE(all_close(mixed, model.forward(five), 0, 0)) << GetParam();
  model.convert_linear_weights(DType::BF16);
  auto ids_of = [&](int64_t t) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < t; ++i) v.push_back((int64_t)rng.next_below(31));
    return Tensor::from_ints(v, {1, t});
  };
  auto worst = [](const Tensor& a, const Tensor& b, float* largest) {
    const std::vector<float> x = a.to_vector(), y = b.to_vector();
    float w = 0;
    *largest = 0;
    for (size_t i = 0; i < x.size(); ++i)
      w = std::max(w, std::fabs(x[i] - y[i])), *largest = std::max(*largest, std::fabs(y[i]));
    return w;
  };
  // Positions (rows of [1, T, V] logits) where a and b differ by more than tol.
  auto positions_beyond = [](const Tensor& a, const Tensor& b, float tol) {
    const std::vector<float> x = a.to_vector(), y = b.to_vector();
    const size_t V = (size_t)a.size(-1);
    int64_t n = 0;
    for (size_t r = 0; r < x.size() / V; ++r) {
      bool moved = false;
      for (size_t i = r * V; i < r * V + V; ++i) moved = moved || std::fabs(x[i] - y[i]) > tol;
      n += moved;
    }
    return n;
  };
  float largest = 0;
  const Tensor short_ids = ids_of(100);
  const Tensor short_flash = model.forward(short_ids), short_naive = model.forward(short_ids, /*need_weights=*/true);
  const float short_worst = worst(short_flash, short_naive, &largest);
  EXPECT_LE(positions_beyond(short_flash, short_naive, 1e-4f * largest), 100 / 10) << GetParam();
  if (c.mlp != MLPKind::MoE) {
    EXPECT_LE(short_worst, 2 * c.num_layers * std::ldexp(1.0f, -8) * largest) << GetParam();
  }
  const Tensor ids = ids_of(136);
  const Tensor flash = model.forward(ids), naive = model.forward(ids, /*need_weights=*/true);
  const float moved = worst(flash, naive, &largest);
  EXPECT_GT(positions_beyond(flash, naive, 1e-4f * largest), 136 / 2) << GetParam();
  // (Measured: 0.3-0.5 of the bound for the dense configs. A mixture of
  // experts has none, most likely because a token whose router scores change
  // order goes to another expert: 4.8 times the bound here at 136 tokens.)
  if (c.mlp != MLPKind::MoE) {
    EXPECT_LE(moved, 2 * c.num_layers * std::ldexp(1.0f, -8) * largest) << GetParam();
  }
  std::vector<KVCache> caches = model.make_caches(1, 144);
  const float cached = worst(model.forward_cached(ids, caches), flash, &largest);
  EXPECT_LE(cached, 1e-5f * largest) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(
    Configs, DecoderCache,
    ::testing::Values(R"({"d_model": 32, "nhead": 4, "num_layers": 2, "dim_feedforward": 48})",
                      R"({"d_model": 32, "nhead": 4, "num_kv_heads": 1, "num_layers": 2, "dim_feedforward": 48,
                          "qk_norm": true})",
                      R"({"d_model": 32, "nhead": 4, "num_layers": 2, "dim_feedforward": 48, "positions": "learned",
                          "norm": "layernorm", "mlp": "dense", "tie_output": false})",
                      R"({"d_model": 32, "nhead": 4, "num_layers": 2, "dim_feedforward": 48, "positions": "sinusoidal",
                          "norm_first": false, "norm": "layernorm", "mlp": "dense"})",
                      R"({"d_model": 32, "nhead": 4, "num_layers": 2, "dim_feedforward": 32, "mlp": "moe",
                          "num_experts": 3, "top_k": 2})",
                      R"({"d_model": 32, "nhead": 4, "num_kv_heads": 2, "head_dim": 6, "num_layers": 2,
                          "dim_feedforward": 48, "qkv_layout": "separate", "q_bias": false, "qk_norm": true,
                          "rope_theta": 500000})"));

TEST(DecoderConfig, RejectsNonsenseAndOverlongSequences) {
  for (const char* bad : {R"({"arch": "transformer"})", R"({"d_model": 30, "nhead": 4})",
                          R"({"nhead": 4, "num_kv_heads": 3})", R"({"positions": "alibi"})",
                          R"({"mlp": "moe", "num_experts": 2, "top_k": 3})", R"({"layers": 2})",
                          R"({"context": 1})", R"({"context": 0})", R"({"head_dim": 5})",
                          R"({"qkv_layout": "fused", "k_bias": false})", R"({"rope_theta": 0})",
                          R"({"norm_eps": -1})", R"({"qkv_layout": "split"})"}) {
    EXPECT_THROW(DecoderConfig::from_json(bad, "c"), Error) << bad;
  }
  DecoderConfig c = DecoderConfig::from_json(R"({"vocab_size": 11, "context": 8, "d_model": 16, "num_layers": 1})", "c");
  EXPECT_EQ(DecoderConfig::from_json(c.to_json(), "again").to_json(), c.to_json());
  Rng rng(1);
  DecoderLM model(c, rng);
  EXPECT_THROW(model.forward(Tensor::from_ints(std::vector<int64_t>(9, 1), {1, 9})), Error);
  EXPECT_THROW(model.make_caches(1, 9), Error);
}

TEST(DecoderConfig, BenchmarkRecipesKeepTheirShapes) {
  // The benchmark sizes keep the shapes docs/benchmarks.md gives them.
  struct Size {
    const char* name;
    int64_t vocab, d_model, nhead, num_layers, dim_feedforward;
  };
  for (const Size& z : {Size{"lm-20m", 4096, 512, 8, 6, 1408}, Size{"lm-100m", 16000, 768, 12, 12, 2048}}) {
    const std::string path = std::string(QKV_SOURCE_DIR) + "/configs/" + z.name + ".json";
    const std::string text = read_file(path);
    DecoderConfig c = DecoderConfig::from_json(text, path);
    EXPECT_EQ(c.d_model, z.d_model) << z.name;
    EXPECT_EQ(c.nhead, z.nhead) << z.name;
    EXPECT_EQ(c.num_layers, z.num_layers) << z.name;
    EXPECT_EQ(c.dim_feedforward, z.dim_feedforward) << z.name;
    EXPECT_EQ(c.mlp, MLPKind::SwiGLU) << z.name;
    EXPECT_EQ(TokenizerConfig::from_json(nlohmann::json::parse(text)["tokenizer"].dump(), path).vocab_size, z.vocab)
        << z.name;
  }
}

}  // namespace
}  // namespace qkv
