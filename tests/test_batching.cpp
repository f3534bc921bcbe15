// Continuous batching: the batched decoding step against one sequence at a
// time, and the generator's tokens against generate() for the same requests.
#include <gtest/gtest.h>

#include <cmath>
#include <future>

#include "qkv/batching.h"
#include "qkv/ops.h"
#include "qkv/utf8.h"

namespace qkv {
namespace {

LanguageModel random_model(std::shared_ptr<const Tokenizer> tok, const std::string& json, uint64_t seed = 7) {
  DecoderConfig c = DecoderConfig::from_json(json, "test");
  c.vocab_size = tok->size();
  Rng rng(seed);
  auto model = std::make_shared<DecoderLM>(c, rng);
  model->eval();
  return {tok, model};
}

LanguageModel random_byte_model(const std::string& json) {
  TokenizerConfig tc;
  tc.type = TokenizerKind::Bytes;
  return random_model(train_tokenizer(tc, {}), json);
}

const char* kRope = R"({"d_model": 32, "nhead": 4, "num_kv_heads": 2, "num_layers": 2, "dim_feedforward": 48,
                        "context": 48, "qk_norm": true, "positions": "rope"})";
const char* kLearned = R"({"d_model": 24, "nhead": 2, "num_layers": 2, "dim_feedforward": 32, "context": 40,
                           "positions": "learned", "mlp": "dense", "norm": "layernorm", "norm_first": false})";

std::vector<int64_t> with_bos(const LanguageModel& m, const std::string& text) {
  std::vector<int64_t> ids = {Tokenizer::kBos};
  for (int64_t id : m.tokenizer->encode(text)) ids.push_back(id);
  return ids;
}

class RowsStep : public ::testing::TestWithParam<const char*> {};

// Three sequences at different lengths: one batched step per token gives the
// logits that each sequence gets alone with its own cache.
TEST_P(RowsStep, EqualsOneSequenceAtATime) {
  NoGradGuard no_grad;
  LanguageModel m = random_byte_model(GetParam());
  DecoderLM& model = *m.model;
  const std::vector<std::string> prompts = {"a", "the cat sat", "我是中国人"};
  std::vector<std::vector<KVCache>> alone, batched;
  std::vector<int64_t> next;
  for (const std::string& p : prompts) {
    const std::vector<int64_t> ids = with_bos(m, p);
    alone.push_back(model.make_caches(1, model.config().context));
    batched.push_back(model.make_caches(1, model.config().context));
    for (KVCache& cache : batched.back()) cache.k.fill_(NAN), cache.v.fill_(NAN);  // unwritten positions are never read
    Tensor a = model.forward_cached(Tensor::from_ints(ids, {1, (int64_t)ids.size()}), alone.back());
    model.forward_cached(Tensor::from_ints(ids, {1, (int64_t)ids.size()}), batched.back());
    next.push_back(4 + (int64_t)ids.size());  // any byte token
  }
  for (int step = 0; step < 5; ++step) {
    std::vector<std::vector<KVCache>*> rows;
    for (auto& c : batched) rows.push_back(&c);
    Tensor got = model.forward_cached_rows(Tensor::from_ints(next, {3, 1}), rows);
    ASSERT_EQ(got.shape(), (Shape{3, 1, model.config().vocab_size}));
    for (size_t b = 0; b < 3; ++b) {
      Tensor want = model.forward_cached(Tensor::from_ints({next[b]}, {1, 1}), alone[b]);
      EXPECT_EQ(batched[b][0].length, alone[b][0].length);
      const float* g = got.data<float>() + b * (size_t)got.size(-1);
      const float* w = want.data<float>();
      double worst = 0, scale = 0;
      for (int64_t v = 0; v < want.numel(); ++v) {
        worst = std::max(worst, (double)std::fabs(g[v] - w[v]));
        scale = std::max(scale, (double)std::fabs(w[v]));
      }
      // The same sums, but a GEMM over 3 rows may order them differently from a GEMV over one.
      EXPECT_LE(worst, 1e-5 * std::max(1.0, scale)) << "row " << b << " step " << step;
      next[b] = 4 + (next[b] * 7 + 3) % 200;
    }
  }
  std::vector<std::vector<KVCache>*> short_rows = {&batched[0]};
  EXPECT_THROW(model.forward_cached_rows(Tensor::from_ints(next, {3, 1}), short_rows), Error);
}

// Three sequences' tokens packed into one pass, twice (the second pass
// continues each from where its cache stands, as a prompt longer than a
// pass does): each position's output is the one its sequence gets alone.
TEST_P(RowsStep, PackedPrefillEqualsEachSequenceAlone) {
  NoGradGuard no_grad;
  LanguageModel m = random_byte_model(GetParam());
  DecoderLM& model = *m.model;
  const std::vector<std::string> prompts = {"a", "the cat sat", "我是中国人"};
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::vector<KVCache>> alone, packed;
  for (const std::string& p : prompts) {
    ids.push_back(with_bos(m, p));
    alone.push_back(model.make_caches(1, model.config().context));
    packed.push_back(model.make_caches(1, model.config().context));
    for (KVCache& cache : packed.back()) cache.k.fill_(NAN), cache.v.fill_(NAN);  // unwritten positions are never read
  }
  std::vector<std::vector<KVCache>*> rows;
  for (auto& c : packed) rows.push_back(&c);
  // Pass 1: the first 1, 4 and 9 tokens; pass 2: the rest (1 of "a"'s 2, 8 of 12, 7 of 16).
  const std::vector<std::vector<int64_t>> passes = {{1, 4, 9}, {1, 8, 7}};
  std::vector<int64_t> done(3, 0);
  for (const std::vector<int64_t>& lengths : passes) {
    std::vector<int64_t> packed_ids;
    for (size_t b = 0; b < 3; ++b)
      packed_ids.insert(packed_ids.end(), ids[b].begin() + done[b], ids[b].begin() + done[b] + lengths[b]);
    const int64_t N = (int64_t)packed_ids.size();
    const Tensor logits =
        model.logits(model.forward_cached_packed(Tensor::from_ints(packed_ids, {1, N}), lengths, rows));
    ASSERT_EQ(logits.shape(), (Shape{1, N, model.config().vocab_size}));
    int64_t at = 0;
    for (size_t b = 0; b < 3; ++b) {
      const std::vector<int64_t> part(ids[b].begin() + done[b], ids[b].begin() + done[b] + lengths[b]);
      const Tensor want = model.forward_cached(Tensor::from_ints(part, {1, lengths[b]}), alone[b]).contiguous();
      EXPECT_EQ(packed[b][0].length, alone[b][0].length);
      const Tensor got = logits.slice(1, at, at + lengths[b]).contiguous();
      double worst = 0, scale = 0;
      for (int64_t i = 0; i < want.numel(); ++i) {
        worst = std::max(worst, (double)std::fabs(got.data<float>()[i] - want.data<float>()[i]));
        scale = std::max(scale, (double)std::fabs(want.data<float>()[i]));
      }
      // The same sums, but a GEMM over more rows may take another kernel, summing in another order.
      EXPECT_LE(worst, 1e-5 * std::max(1.0, scale)) << "sequence " << b << " from position " << done[b];
      at += lengths[b];
      done[b] += lengths[b];
    }
  }
  for (size_t b = 0; b < 3; ++b) ASSERT_EQ(done[b], (int64_t)ids[b].size());
  const Tensor two = Tensor::from_ints({5, 6}, {1, 2});
  EXPECT_THROW(model.forward_cached_packed(two, {1, 2}, {rows[0], rows[1]}), Error);  // lengths sum to 3
  EXPECT_THROW(model.forward_cached_packed(two, {2, 0}, {rows[0], rows[1]}), Error);  // an empty sequence
  EXPECT_THROW(model.forward_cached_packed(two, {2}, {rows[0], rows[1]}), Error);     // a length per sequence
}

INSTANTIATE_TEST_SUITE_P(Batching, RowsStep, ::testing::Values(kRope, kLearned));

struct Collected {
  std::string pieces;
  BatchResult result;
  bool done = false;
};

BatchRequest request_for(const LanguageModel& m, const std::string& prompt, GenerateOptions o, Collected& into,
                         std::vector<std::string> stop = {}) {
  BatchRequest r;
  r.prompt = with_bos(m, prompt);
  r.options = o;
  r.stop = std::move(stop);
  r.on_text = [&into](const std::string& piece, const std::vector<TokenLogprob>&) { into.pieces += piece; };
  r.on_done = [&into](const BatchResult& result) { into.result = result, into.done = true; };
  return r;
}

void run_until_idle(BatchGenerator& g) {
  for (int i = 0; i < 10000 && g.step(); ++i) {
  }
}

// Seven requests through three slots (four of them wait at first): each
// gets the tokens that generate() gives it alone, greedy and sampled.
TEST(Batching, GeneratorGivesWhatGenerateGivesWhateverSharesTheBatch) {
  LanguageModel m = random_byte_model(kRope);
  const std::vector<std::string> prompts = {"a", "the cat", "私は", "hello world", "x", "yy", "中国"};
  std::vector<GenerateOptions> options;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions o;
    o.max_new_tokens = 6 + (int64_t)i * 3;
    o.temperature = i % 2 ? 0.9f : 0.0f;
    o.top_k = i % 3 == 1 ? 20 : 0;
    o.top_p = i % 3 == 2 ? 0.8f : 1.0f;
    o.seed = 100 + i;
    options.push_back(o);
  }
  BatchGenerator g(m, 3, m.model->config().context, 8);
  std::vector<Collected> got(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) ASSERT_TRUE(g.submit(request_for(m, prompts[i], options[i], got[i])));
  EXPECT_EQ(g.stats().waiting, 7);
  run_until_idle(g);
  int64_t tokens = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::string streamed;
    const std::vector<int64_t> want = generate(m, prompts[i], options[i], [&](const std::string& p) { streamed += p; });
    ASSERT_TRUE(got[i].done) << i;
    EXPECT_EQ(got[i].result.text, streamed) << "request " << i;
    EXPECT_EQ(got[i].pieces, streamed) << "request " << i;
    EXPECT_EQ(got[i].result.completion_tokens, (int64_t)want.size()) << "request " << i;
    EXPECT_EQ(got[i].result.prompt_tokens, 1 + (int64_t)m.tokenizer->encode(prompts[i]).size());
    EXPECT_EQ(got[i].result.finish_reason, (int64_t)want.size() == options[i].max_new_tokens ? "length" : "stop");
    tokens += (int64_t)want.size();
  }
  const BatchStats s = g.stats();
  EXPECT_EQ(s.active, 0);
  EXPECT_EQ(s.waiting, 0);
  // Batched: far fewer steps than tokens (each request's first token comes from its prefill).
  EXPECT_LT(s.steps, tokens - (int64_t)prompts.size());
}

// A folder's logits processors (LanguageModel::generation.rules) act in the
// batch as in generate(): each request's rules see its own prompt and
// outputs, whatever shares the step; they change all three greedy texts.
TEST(Batching, TheFoldersRulesActAsInGenerate) {
  LanguageModel m = random_byte_model(kRope);
  const std::vector<std::string> prompts = {"a", "the cat", "私は", "hello world", "xyz"};
  std::vector<std::string> plain;
  for (const std::string& p : prompts)
    plain.push_back(
        replace_invalid_utf8(m.tokenizer->decode(generate(m, p, {.max_new_tokens = 12, .temperature = 0}))));
  m.generation.rules = {.repetition_penalty = 1.5f, .no_repeat_ngram_size = 2, .min_new_tokens = 3};
  BatchGenerator g(m, 3, m.model->config().context, 8);
  std::vector<Collected> got(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions o{.max_new_tokens = 12, .temperature = i % 2 ? 0.8f : 0.0f, .seed = 7 + i};
    ASSERT_TRUE(g.submit(request_for(m, prompts[i], o, got[i])));
  }
  run_until_idle(g);
  int changed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions o{.max_new_tokens = 12, .temperature = i % 2 ? 0.8f : 0.0f, .seed = 7 + i};
    const std::string want = replace_invalid_utf8(m.tokenizer->decode(generate(m, prompts[i], o)));
    ASSERT_TRUE(got[i].done) << i;
    EXPECT_EQ(got[i].result.text, want) << "request " << i;
    changed += i % 2 == 0 && want != plain[i];
  }
  EXPECT_EQ(changed, 3) << "the rules should change the greedy texts";

  // A rule that fails on this vocabulary (a folder's file is checked when it
  // loads; these rules are set by hand) ends its request with the error, and
  // the generator goes on serving.
  m.generation.rules = {.bad_words = {{1 << 20}}};
  BatchGenerator h(m, 2, m.model->config().context, 4);
  Collected bad, good;
  ASSERT_TRUE(h.submit(request_for(m, "a", {.max_new_tokens = 4, .temperature = 0}, bad)));
  run_until_idle(h);
  ASSERT_TRUE(bad.done);
  EXPECT_EQ(bad.result.finish_reason, "error");
  EXPECT_NE(bad.result.error.find("past the vocabulary"), std::string::npos) << bad.result.error;
  m.generation.rules = {};
  BatchGenerator ok(m, 2, m.model->config().context, 4);
  ASSERT_TRUE(ok.submit(request_for(m, "a", {.max_new_tokens = 4, .temperature = 0}, good)));
  run_until_idle(ok);
  EXPECT_EQ(good.result.finish_reason, "length");
}

// A request's penalties and logit_bias act in the batch as in generate(),
// each on its own outputs: greedy and sampled texts equal generate()'s with
// the same options, the greedy ones differ from those without, and a byte
// biased by -100 never comes out.
TEST(Batching, PenaltiesAndLogitBiasActAsInGenerate) {
  LanguageModel m = random_byte_model(kRope);
  const std::vector<std::string> prompts = {"a", "the cat", "私は", "hello world"};
  const int64_t banned = 4 + 'e';  // the byte model's id of 'e'
  auto options = [&](size_t i) {
    return GenerateOptions{.max_new_tokens = 16,
                           .temperature = i % 2 ? 0.8f : 0.0f,
                           .seed = 3 + i,
                           .presence_penalty = 0.5f,
                           .frequency_penalty = 1.0f,
                           .logit_bias = {{banned, -100}}};
  };
  BatchGenerator g(m, 3, m.model->config().context, 8);
  std::vector<Collected> got(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) ASSERT_TRUE(g.submit(request_for(m, prompts[i], options(i), got[i])));
  run_until_idle(g);
  int changed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int64_t> ids = generate(m, prompts[i], options(i));
    ASSERT_TRUE(got[i].done) << i;
    EXPECT_EQ(got[i].result.text, replace_invalid_utf8(m.tokenizer->decode(ids))) << "request " << i;
    EXPECT_EQ(std::count(ids.begin(), ids.end(), banned), 0) << "request " << i;
    const std::vector<int64_t> plain = generate(m, prompts[i], {.max_new_tokens = 16, .temperature = 0});
    changed += i % 2 == 0 && plain != ids;
  }
  EXPECT_EQ(changed, 2) << "the penalties should change the greedy texts";
}

TEST(Batching, StopSequencesEndTheTextBeforeThem) {
  // Characters (a random byte model writes invalid UTF-8, shown as U+FFFD, which a stop sequence cannot name).
  LanguageModel m = random_model(std::make_shared<CharTokenizer>(CharTokenizer::build({"abcdefgh ijklmnop"})), kRope);
  GenerateOptions o;
  o.max_new_tokens = 30, o.temperature = 0.7f, o.seed = 5;
  std::string full;
  generate(m, "the", o, [&](const std::string& p) { full += p; });
  ASSERT_GE(full.size(), 8u) << "the random model stopped too early to test a stop sequence";
  const std::string stop = full.substr(4, 3);
  BatchGenerator g(m, 2, m.model->config().context, 4);
  Collected a, b;
  ASSERT_TRUE(g.submit(request_for(m, "the", o, a, {stop, "never in it \x01"})));
  ASSERT_TRUE(g.submit(request_for(m, "the", o, b, {"never in it \x01"})));
  run_until_idle(g);
  EXPECT_EQ(a.result.text, full.substr(0, full.find(stop)));
  EXPECT_EQ(a.pieces, a.result.text);  // nothing of the stop sequence was streamed
  EXPECT_EQ(a.result.finish_reason, "stop");
  EXPECT_EQ(b.result.text, full);
}

TEST(Batching, QueueIsBoundedAndCancelledRequestsFreeTheirSlot) {
  LanguageModel m = random_byte_model(kRope);
  BatchGenerator g(m, 1, 32, 1);
  GenerateOptions o;
  o.max_new_tokens = 20, o.temperature = 0;
  Collected a, b, c;
  BatchRequest first = request_for(m, "a", o, a);
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  first.cancel = cancel;
  first.on_text = [&](const std::string& piece, const std::vector<TokenLogprob>&) {
    a.pieces += piece, *cancel = true;
  };
  ASSERT_TRUE(g.submit(std::move(first)));       // takes the free slot at the next step
  ASSERT_TRUE(g.submit(request_for(m, "b", o, b)));  // waits
  EXPECT_FALSE(g.submit(request_for(m, "c", o, c)));  // the queue of 1 is full
  run_until_idle(g);
  EXPECT_EQ(a.result.finish_reason, "cancelled");
  EXPECT_LT(a.result.completion_tokens, o.max_new_tokens);
  EXPECT_TRUE(b.done);
  EXPECT_FALSE(c.done);
  std::string want;
  generate(m, "b", o, [&](const std::string& p) { want += p; });
  EXPECT_EQ(b.result.text, want);

  // A request cancelled while it waits holds no place in the queue, and the
  // next step ends it without taking a slot (no text).
  Collected d, e, f;
  BatchRequest busy = request_for(m, "a", o, d), gone = request_for(m, "b", o, e);
  auto gone_cancel = std::make_shared<std::atomic<bool>>(false);
  gone.cancel = gone_cancel;
  ASSERT_TRUE(g.submit(std::move(busy)));
  ASSERT_TRUE(g.step());                              // `busy` takes the slot
  ASSERT_TRUE(g.submit(std::move(gone)));             // waits
  EXPECT_FALSE(g.submit(request_for(m, "c", o, f)));  // the queue of 1 is full...
  *gone_cancel = true;
  ASSERT_TRUE(g.submit(request_for(m, "c", o, f)));  // ...until its one request is cancelled
  g.step();
  EXPECT_TRUE(e.done && e.pieces.empty());
  EXPECT_EQ(e.result.completion_tokens, 0);
  EXPECT_EQ(e.result.finish_reason, "cancelled");
  run_until_idle(g);
  EXPECT_TRUE(d.done && f.done);
  EXPECT_EQ(f.result.finish_reason, "length");

  // Bad requests are errors, never queued.
  BatchRequest too_long = request_for(m, std::string(40, 'x'), o, c);
  EXPECT_THROW(g.submit(std::move(too_long)), Error);
  GenerateOptions bad = o;
  bad.top_p = 0;
  EXPECT_THROW(g.submit(request_for(m, "a", bad, c)), Error);
  EXPECT_THROW(g.submit(request_for(m, "a", o, c, {""})), Error);
  EXPECT_THROW(BatchGenerator(m, 0, 32, 1), Error);
  EXPECT_THROW(BatchGenerator(m, 1, 49, 1), Error);  // past the model's context
}

// The generator's own thread: requests from other threads, then a drain.
TEST(Batching, ThreadServesRequestsAndStopDrainsThem) {
  LanguageModel m = random_byte_model(kRope);
  BatchGenerator g(m, 2, 48, 8);
  g.start(1);
  GenerateOptions o;
  o.max_new_tokens = 10, o.temperature = 0;
  std::vector<Collected> got(5);  // written on the generator's thread, read after it is joined
  for (auto& c : got) ASSERT_TRUE(g.submit(request_for(m, "the", o, c)));
  g.stop();  // waits for all five
  Collected late;
  EXPECT_FALSE(g.submit(request_for(m, "the", o, late)));
  std::string want;
  generate(m, "the", o, [&](const std::string& p) { want += p; });
  for (auto& c : got) {
    EXPECT_TRUE(c.done);
    EXPECT_EQ(c.result.text, want);
  }
}

// A task posted to the generator runs on its thread, between steps, while requests are decoded.
TEST(Batching, PostedTasksRunBetweenStepsOnTheGeneratorsThread) {
  LanguageModel m = random_byte_model(kRope);
  BatchGenerator g(m, 2, 48, 8);
  g.start(1);
  GenerateOptions o;
  o.max_new_tokens = 20, o.temperature = 0, o.ignore_eos = true;
  Collected a;
  ASSERT_TRUE(g.submit(request_for(m, "the", o, a)));
  std::promise<std::thread::id> ran;
  Tensor weights;
  g.post([&] {
    NoGradGuard no_grad;
    m.model->forward(Tensor::from_ints({1, 5, 6, 7}, {1, 4}), /*need_weights=*/true);
    weights = m.model->layers.back()->last_self_weights;
    ran.set_value(std::this_thread::get_id());
  });
  EXPECT_NE(ran.get_future().get(), std::this_thread::get_id());
  g.stop();
  ASSERT_TRUE(a.done);
  EXPECT_EQ(a.result.completion_tokens, 20);
  std::string want;
  generate(m, "the", o, [&](const std::string& p) { want += p; });
  EXPECT_EQ(a.result.text, want);
  // The decoder's masked self-attention: [1, H, T, T], each row a distribution over the keys up to its own.
  ASSERT_EQ(weights.shape(), (Shape{1, 4, 4, 4}));
  const float* w = weights.contiguous().data<float>();
  for (int64_t h = 0; h < 4; ++h) {
    for (int64_t t = 0; t < 4; ++t) {
      float sum = 0;
      for (int64_t j = 0; j < 4; ++j) {
        sum += w[(h * 4 + t) * 4 + j];
        if (j > t) {
          EXPECT_EQ(w[(h * 4 + t) * 4 + j], 0.0f);
        }
      }
      EXPECT_NEAR(sum, 1.0f, 1e-5f);
    }
  }
}

// Log-probabilities, of the prompt (echo) and of sampled tokens, sharing a
// batch with another request: each is log_softmax of the logits of one
// forward pass over the whole text without a cache (in double here), at the
// position before the token, and its top 3 are that row's likeliest. The
// prompt's are heard once by on_prompt, before any text; the pieces'
// tokens, streamed, are the result's; their texts join to the
// completion's bytes. A prompt is scored with max_new_tokens 0.
TEST(Batching, LogprobsAreTheLogSoftmaxOfOneForwardOverTheText) {
  LanguageModel m = random_byte_model(kRope);
  GenerateOptions o;
  o.max_new_tokens = 7;
  o.temperature = 1.2f;  // sampled: the chosen token is often not the likeliest
  o.seed = 11;
  o.ignore_eos = true;
  BatchGenerator g(m, 2, m.model->config().context, 4);
  Collected scored, other, prompt_only;
  std::vector<TokenLogprob> streamed;
  BatchRequest r = request_for(m, "the cat", o, scored);
  r.logprobs = 3;
  r.prompt_logprobs = true;
  std::vector<TokenLogprob> heard_prompt;  // on_prompt's, once, before any text
  int prompts_heard = 0;
  r.on_prompt = [&](const std::vector<TokenLogprob>& tokens) {
    EXPECT_TRUE(streamed.empty() && scored.pieces.empty());
    heard_prompt = tokens, ++prompts_heard;
  };
  r.on_text = [&](const std::string& piece, const std::vector<TokenLogprob>& tokens) {
    scored.pieces += piece;
    streamed.insert(streamed.end(), tokens.begin(), tokens.end());
  };
  ASSERT_TRUE(g.submit(std::move(r)));
  ASSERT_TRUE(g.submit(request_for(m, "我是中国人", o, other)));
  run_until_idle(g);
  ASSERT_TRUE(scored.done && other.done);
  const BatchResult& res = scored.result;
  const std::vector<int64_t> prompt = with_bos(m, "the cat");
  ASSERT_EQ(res.prompt_logprobs.size(), prompt.size());
  ASSERT_EQ(prompts_heard, 1);
  ASSERT_EQ(heard_prompt.size(), prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) {
    EXPECT_EQ(heard_prompt[i].token, res.prompt_logprobs[i].token);
    EXPECT_EQ(heard_prompt[i].text, res.prompt_logprobs[i].text);
    if (i > 0) {
      EXPECT_EQ(heard_prompt[i].logprob, res.prompt_logprobs[i].logprob);
    }
  }
  ASSERT_EQ(res.logprobs.size(), 7u);
  EXPECT_TRUE(std::isnan(res.prompt_logprobs[0].logprob) && res.prompt_logprobs[0].top.empty());
  std::vector<int64_t> ids = prompt, completion;
  std::string text;
  for (const TokenLogprob& t : res.logprobs) ids.push_back(t.token), completion.push_back(t.token), text += t.text;
  EXPECT_EQ(text, m.tokenizer->decode(completion));
  ASSERT_EQ(streamed.size(), res.logprobs.size());
  for (size_t i = 0; i < streamed.size(); ++i) EXPECT_EQ(streamed[i].token, res.logprobs[i].token);

  NoGradGuard no_grad;
  const Tensor logits = m.model->forward(Tensor::from_ints(ids, {1, (int64_t)ids.size()})).contiguous();
  const int64_t V = logits.size(-1);
  int chosen_not_likeliest = 0;
  auto check = [&](const TokenLogprob& t, size_t position) {  // `position`'s logits predict the token
    const float* row = logits.data<float>() + position * V;
    double max = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; ++v) max = std::max(max, (double)row[v]);
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - max);
    auto logprob = [&](int64_t v) { return row[v] - max - std::log(sum); };
    EXPECT_EQ(t.token, ids[position + 1]);
    EXPECT_NEAR(t.logprob, logprob(t.token), 1e-4) << "position " << position;
    std::vector<int64_t> order(V);
    for (int64_t v = 0; v < V; ++v) order[v] = v;
    std::partial_sort(order.begin(), order.begin() + 3, order.end(),
                      [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    ASSERT_EQ(t.top.size(), 3u);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(t.top[k].first, order[k]) << "position " << position;
      EXPECT_NEAR(t.top[k].second, logprob(order[k]), 1e-4);
    }
    chosen_not_likeliest += t.token != order[0];
  };
  for (size_t i = 1; i < prompt.size(); ++i) check(res.prompt_logprobs[i], i - 1);
  for (size_t j = 0; j < res.logprobs.size(); ++j) check(res.logprobs[j], prompt.size() - 1 + j);
  EXPECT_GT(chosen_not_likeliest, 0);  // the test sees sampled tokens, not only the argmax

  GenerateOptions none = o;
  none.max_new_tokens = 0;
  BatchRequest q = request_for(m, "the cat", none, prompt_only);
  q.logprobs = 0;
  q.prompt_logprobs = true;
  ASSERT_TRUE(g.submit(std::move(q)));
  run_until_idle(g);
  ASSERT_TRUE(prompt_only.done);
  EXPECT_EQ(prompt_only.result.finish_reason, "length");
  EXPECT_EQ(prompt_only.result.completion_tokens, 0);
  ASSERT_EQ(prompt_only.result.prompt_logprobs.size(), prompt.size());
  for (size_t i = 1; i < prompt.size(); ++i) {
    EXPECT_FLOAT_EQ(prompt_only.result.prompt_logprobs[i].logprob, res.prompt_logprobs[i].logprob);
    EXPECT_TRUE(prompt_only.result.prompt_logprobs[i].top.empty());
  }
  EXPECT_TRUE(other.result.logprobs.empty() && other.result.prompt_logprobs.empty());  // none asked
}

// Scored prompts admitted in one step share prefill passes of up to 1,024
// positions; a longer one goes alone, and its logits are kept 256 positions
// at a time. Each prompt's log-probabilities are still those of one uncached
// forward over it, and its tokens' texts join to the decoded prompt. A
// prompt that is not scored, beside them, still gets generate()'s text.
TEST(Batching, ScoredPromptsShareAPassAndALongOneIsScoredInChunks) {
  LanguageModel m = random_byte_model(R"({"d_model": 16, "nhead": 2, "num_layers": 1, "dim_feedforward": 16,
                                          "context": 1200, "positions": "rope"})");
  std::string text;
  for (int i = 0; i < 75; ++i) text += "the cat 我是 ";  // 1,125 bytes
  ASSERT_GT(with_bos(m, text).size(), 1024u);
  // The long one first (a pass of its own, five chunks of logits), then two
  // short ones that share the next pass.
  const std::vector<std::string> scored = {text, "the cat", "我是中国人"};
  GenerateOptions o;
  o.max_new_tokens = 0;
  std::vector<Collected> got(scored.size());
  GenerateOptions greedy;
  greedy.max_new_tokens = 4;
  greedy.ignore_eos = true;
  Collected beside;
  BatchGenerator g(m, 4, m.model->config().context, 4);
  for (size_t i = 0; i < scored.size(); ++i) {
    BatchRequest r = request_for(m, scored[i], o, got[i]);
    r.logprobs = 1;
    r.prompt_logprobs = true;
    ASSERT_TRUE(g.submit(std::move(r)));
  }
  ASSERT_TRUE(g.submit(request_for(m, text, greedy, beside)));
  run_until_idle(g);
  ASSERT_TRUE(beside.done);
  std::string streamed;
  generate(m, text, greedy, [&](const std::string& piece) { streamed += piece; });
  EXPECT_EQ(beside.result.text, streamed);
  EXPECT_EQ(beside.result.completion_tokens, 4);
  NoGradGuard no_grad;
  for (size_t r = 0; r < scored.size(); ++r) {
    ASSERT_TRUE(got[r].done);
    const std::vector<int64_t> prompt = with_bos(m, scored[r]);
    const std::vector<TokenLogprob>& lp = got[r].result.prompt_logprobs;
    ASSERT_EQ(lp.size(), prompt.size());
    std::string joined;
    for (const TokenLogprob& t : lp) joined += t.text;
    EXPECT_EQ(joined, scored[r]);
    const Tensor logits =
        log_softmax(m.model->forward(Tensor::from_ints(prompt, {1, (int64_t)prompt.size()}))).contiguous();
    const int64_t V = logits.size(-1);
    double worst = 0;
    for (size_t i = 1; i < prompt.size(); ++i) {
      ASSERT_EQ(lp[i].token, prompt[i]);
      worst = std::max(worst, (double)std::fabs(lp[i].logprob - logits.data<float>()[(i - 1) * V + prompt[i]]));
    }
    EXPECT_LT(worst, 1e-4) << "prompt " << r;
  }
}

// reuse_prefix: a prompt that begins as an earlier request's prompt and
// completion (a chat's next turn) takes that request's slot and prefills
// only the rest; its log-probabilities are still those of one uncached
// forward over its text. Without reuse_prefix, or scoring its prompt, it
// prefills all of it.
TEST(Batching, APromptReusesTheCachedPositionsItBeginsWith) {
  LanguageModel m = random_byte_model(kRope);
  BatchGenerator g(m, 2, m.model->config().context, 2);
  GenerateOptions o;
  o.max_new_tokens = 6;
  o.ignore_eos = true;
  Collected first;
  BatchRequest a = request_for(m, "the cat", o, first);
  a.logprobs = 0;  // for its tokens
  a.reuse_prefix = true;
  const std::vector<int64_t> a_prompt = a.prompt;
  ASSERT_TRUE(g.submit(std::move(a)));
  run_until_idle(g);
  ASSERT_TRUE(first.done);
  ASSERT_EQ(first.result.logprobs.size(), 6u);
  EXPECT_EQ(first.result.cached_tokens, 0);
  // The next turn: the first prompt, its 6 tokens, and more. The slot holds
  // the prompt and 5 of them (the last one drawn was never fed).
  std::vector<int64_t> next = a_prompt;
  for (const TokenLogprob& t : first.result.logprobs) next.push_back(t.token);
  for (int64_t id : m.tokenizer->encode(" sat")) next.push_back(id);
  auto ask = [&](bool reuse, bool score_prompt) {
    Collected c;
    BatchRequest r;
    r.prompt = next;
    r.options.max_new_tokens = 4;
    r.options.ignore_eos = true;
    r.logprobs = 2;
    r.prompt_logprobs = score_prompt;
    r.reuse_prefix = reuse;
    r.on_done = [&c](const BatchResult& result) { c.result = result, c.done = true; };
    EXPECT_TRUE(g.submit(std::move(r)));
    run_until_idle(g);
    EXPECT_TRUE(c.done);
    return c.result;
  };
  const BatchResult reused = ask(true, false);
  EXPECT_EQ(reused.cached_tokens, (int64_t)a_prompt.size() + 5);
  EXPECT_EQ(reused.prompt_tokens, (int64_t)next.size());
  ASSERT_EQ(reused.logprobs.size(), 4u);
  std::vector<int64_t> ids = next;
  for (const TokenLogprob& t : reused.logprobs) ids.push_back(t.token);
  {
    NoGradGuard no_grad;
    const Tensor logp = log_softmax(m.model->forward(Tensor::from_ints(ids, {1, (int64_t)ids.size()}))).contiguous();
    const int64_t V = logp.size(-1);
    for (size_t j = 0; j < reused.logprobs.size(); ++j) {
      const size_t position = next.size() - 1 + j;  // its logits predict token j
      EXPECT_NEAR(reused.logprobs[j].logprob, logp.data<float>()[position * V + reused.logprobs[j].token], 1e-4);
    }
  }
  // The request just ended left `next` and 3 tokens: the same prompt again keeps all but its last position.
  EXPECT_EQ(ask(true, false).cached_tokens, (int64_t)next.size() - 1);
  EXPECT_EQ(ask(false, false).cached_tokens, 0);
  EXPECT_EQ(ask(true, true).cached_tokens, 0);
}

// Which free slot a prompt takes: the one whose positions it keeps most of
// and overwrites least of. Another conversation beside a first takes the
// empty slot, not the first's (whose <bos> it shares), so the first's next
// turn still finds its history.
TEST(Batching, ANewConversationLeavesAnotherSlotsHistory) {
  LanguageModel m = random_byte_model(kRope);
  BatchGenerator g(m, 2, m.model->config().context, 2);
  GenerateOptions o;
  o.max_new_tokens = 3;
  o.ignore_eos = true;
  auto run = [&](const std::string& text) {
    Collected c;
    BatchRequest r = request_for(m, text, o, c);
    r.reuse_prefix = true;
    EXPECT_TRUE(g.submit(std::move(r)));
    run_until_idle(g);
    EXPECT_TRUE(c.done);
    return c.result;
  };
  EXPECT_EQ(run("the cat sat on the mat").cached_tokens, 0);
  EXPECT_EQ(run("我是中国人").cached_tokens, 0);  // the empty slot (else 1: the first's <bos>)
  // Each next turn keeps its first turn's <bos> and bytes (and a generated
  // byte more, where the model's first one happens to be the next byte here).
  auto kept_about = [](int64_t got, const std::string& first) {
    const int64_t want = 1 + (int64_t)first.size();
    EXPECT_TRUE(got >= want && got <= want + 2) << got << " for " << want;
  };
  kept_about(run("the cat sat on the mat, then").cached_tokens, "the cat sat on the mat");
  kept_about(run("我是中国人です").cached_tokens, "我是中国人");
}

// The same prompt admitted three times in one step (a request's `n`
// choices) is prefilled once: the other two copy its positions and its
// logits, and each samples with its own seed what generate() gives it.
TEST(Batching, ThePromptOfSeveralChoicesIsPrefilledOnce) {
  LanguageModel m = random_byte_model(kRope);
  BatchGenerator g(m, 4, m.model->config().context, 4);
  const std::string prompt = "the cat sat";
  std::vector<GenerateOptions> options(3);
  std::vector<Collected> got(4);
  for (size_t i = 0; i < 3; ++i) {
    options[i].max_new_tokens = 8;
    options[i].temperature = 0.9f;
    options[i].seed = 5 + i;
    options[i].ignore_eos = true;
    ASSERT_TRUE(g.submit(request_for(m, prompt, options[i], got[i])));
  }
  ASSERT_TRUE(g.submit(request_for(m, "我是", options[0], got[3])));
  run_until_idle(g);
  const int64_t P = (int64_t)with_bos(m, prompt).size();
  int copies = 0;
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(got[i].done);
    std::string streamed;
    generate(m, prompt, options[i], [&](const std::string& piece) { streamed += piece; });
    EXPECT_EQ(got[i].result.text, streamed) << "choice " << i;
    EXPECT_TRUE(got[i].result.cached_tokens == 0 || got[i].result.cached_tokens == P);
    copies += got[i].result.cached_tokens == P;
  }
  EXPECT_EQ(copies, 2);
  EXPECT_EQ(got[3].result.cached_tokens, 0);
  EXPECT_NE(got[0].result.text, got[1].result.text);  // sampled apart
}

// A prompt holding an id outside the vocabulary is refused when it is
// submitted, rather than failing the prefill pass it would share.
TEST(Batching, APromptOutsideTheVocabularyIsRefused) {
  LanguageModel m = random_byte_model(kRope);
  BatchGenerator g(m, 1, m.model->config().context, 1);
  Collected got;
  BatchRequest r = request_for(m, "a", GenerateOptions{}, got);
  r.prompt.push_back(m.model->config().vocab_size);
  EXPECT_THROW(g.submit(r), Error);
  r.prompt.back() = -1;
  EXPECT_THROW(g.submit(r), Error);
  EXPECT_EQ(g.stats().waiting, 0);
}

// A NaN among a position's logits (here every position's: the output row of
// a byte the prompt never holds is NaN) ranks last, and the other tokens'
// log-probabilities are those of the tokens left, when a prompt is scored as
// when a token is drawn. (The library's log-softmax, which scores a prompt's
// rows, would make the whole row NaN.)
TEST(Batching, ANanLogitRanksLastAndLeavesTheOthersScored) {
  LanguageModel m = random_byte_model(R"({"d_model": 16, "nhead": 2, "num_layers": 1, "dim_feedforward": 16,
                                          "context": 32, "tie_output": false})");
  const int64_t poisoned = m.tokenizer->encode("z").at(0);
  {
    NoGradGuard no_grad;
    m.model->output_proj->weight.slice(0, poisoned, poisoned + 1).fill_(NAN);
  }
  const std::string text = "the cat";
  const std::vector<int64_t> prompt = with_bos(m, text);
  GenerateOptions o;
  o.max_new_tokens = 2;
  Collected got;
  BatchRequest r = request_for(m, text, o, got);
  r.logprobs = 3;
  r.prompt_logprobs = true;
  BatchGenerator g(m, 1, m.model->config().context, 1);
  ASSERT_TRUE(g.submit(std::move(r)));
  run_until_idle(g);
  ASSERT_TRUE(got.done);
  ASSERT_EQ(got.result.prompt_logprobs.size(), prompt.size());
  ASSERT_EQ(got.result.logprobs.size(), 2u);
  std::vector<int64_t> ids = prompt;
  for (const TokenLogprob& t : got.result.logprobs) ids.push_back(t.token);
  NoGradGuard no_grad;
  const Tensor logits = m.model->forward(Tensor::from_ints(ids, {1, (int64_t)ids.size()})).contiguous();
  const int64_t V = logits.size(-1);
  auto check = [&](const TokenLogprob& t, size_t position) {
    const float* row = logits.data<float>() + position * V;
    ASSERT_TRUE(std::isnan(row[poisoned]));
    double max = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; ++v)
      if (v != poisoned) max = std::max(max, (double)row[v]);
    for (int64_t v = 0; v < V; ++v)
      if (v != poisoned) sum += std::exp(row[v] - max);
    EXPECT_NEAR(t.logprob, row[t.token] - max - std::log(sum), 1e-4) << "position " << position;
    ASSERT_EQ(t.top.size(), 3u);
    for (const auto& [id, logprob] : t.top) {
      EXPECT_NE(id, poisoned);
      EXPECT_NEAR(logprob, row[id] - max - std::log(sum), 1e-4);
    }
  };
  for (size_t i = 1; i < prompt.size(); ++i) check(got.result.prompt_logprobs[i], i - 1);
  for (size_t j = 0; j < got.result.logprobs.size(); ++j) check(got.result.logprobs[j], prompt.size() - 1 + j);
}

}  // namespace
}  // namespace qkv
