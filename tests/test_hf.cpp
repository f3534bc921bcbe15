// Hugging Face folders (tests/fixtures/hf, from scripts/make_hf_fixtures.py):
// a tiny random LlamaForCausalLM (float32, GQA, rope_theta 500000 with the
// "llama3" frequency scaling, untied), Qwen2ForCausalLM (bfloat16, q/k/v bias,
// head_dim 12, tied), Qwen3ForCausalLM (float16 in three shards, q_norm and
// k_norm, head_dim 16), MistralForCausalLM (sliding_window 32),
// MixtralForCausalLM (4 SwiGLU experts, top 2) and GPT2LMHeadModel (learned positions, LayerNorm, gelu_new, Conv1D) load as qkv
// decoders whose logits match transformers' to 1e-4 and whose greedy tokens
// through the KV cache are transformers' exactly; options qkv does not
// implement are one error naming the field. With their tokenizer.json (the
// llama3 and qwen2 tokenizers of tests/fixtures/tokenizers), qkv's generate()
// gives transformers' generate() ids and text for a prompt.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <nlohmann/json.hpp>

#include "qkv/checkpoint.h"
#include "qkv/allocator.h"
#include "qkv/infer.h"
#include "qkv/io.h"
#include "qkv/lm.h"
#include "qkv/position.h"
#include "qkv/registry.h"
#include "qkv/utf8.h"
#include "src/infer/sampling.h"
#include "src/kernels/kernels.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::error_of;

std::string hf(const std::string& name) { return std::string(QKV_FIXTURES_DIR) + "/hf/" + name; }

// A copy of a fixture folder (its config and weights) whose config.json has
// `changes` merged in.
std::string with_config(const std::string& name, const nlohmann::json& changes) {
  const std::string dir = testing::temp_dir("hf");
  for (const auto& entry : std::filesystem::directory_iterator(hf(name))) {
    const std::string f = entry.path().filename().string();
    if (f == "config.json" || f.find(".safetensors") != std::string::npos)
      std::filesystem::copy_file(entry.path(), dir + "/" + f);
  }
  nlohmann::json c = nlohmann::json::parse(read_file(dir + "/config.json"));
  c.merge_patch(changes);
  write_file_atomic(dir + "/config.json", c.dump(2));
  return dir;
}

class HfParity : public ::testing::TestWithParam<const char*> {};

TEST_P(HfParity, LogitsAndGreedyTokensMatchTransformers) {
  const std::string name = GetParam();
  LanguageModel m = load_language_model(hf(name));
  SafetensorsFile expected = load_safetensors(hf(name + ".expected.safetensors"));
  const Tensor ids = *expected.find("ids");
  NoGradGuard no_grad;
  EXPECT_TRUE(testing::all_close(m.model->forward(ids), *expected.find("logits"), 1e-4f, 1e-4f)) << name;
  // Greedy through the KV cache: the prompt at once, then one token at a time.
  std::vector<KVCache> caches = m.model->make_caches(1, m.model->config().context);
  Tensor logits = m.model->forward_cached(ids, caches);
  std::vector<int64_t> greedy;
  for (int i = 0; i < 16; ++i) {
    const int64_t V = logits.size(-1);
    const std::vector<float> last = logits.slice(1, logits.size(1) - 1, logits.size(1)).reshape({V}).to_vector();
    const int64_t next = std::max_element(last.begin(), last.end()) - last.begin();
    greedy.push_back(next);
    logits = m.model->forward_cached(Tensor::from_ints({next}, {1, 1}), caches);
  }
  EXPECT_EQ(greedy, expected.find("greedy")->to_ints()) << name;
}

// Text in, text out: the prompt through tokenizer.json (with the template's
// <|begin_of_text|> for llama), greedy decoding until the folder's
// eos_token_id (two of them for qwen2) or 16 tokens.
TEST_P(HfParity, GenerateGivesTransformersTextThroughTheTokenizer) {
  const std::string name = GetParam();
  LanguageModel m = load_language_model(hf(name));
  ASSERT_NE(m.tokenizer, nullptr);
  const nlohmann::json expected = nlohmann::json::parse(read_file(hf(name + ".expected.json")));
  const std::string prompt = expected["prompt"].get<std::string>();
  EXPECT_EQ(m.tokenizer->encode_prompt(prompt), expected["prompt_ids"].get<std::vector<int64_t>>()) << name;
  const std::vector<int64_t> ids = generate(m, prompt, {.max_new_tokens = 16, .temperature = 0});
  EXPECT_EQ(ids, expected["new_ids"].get<std::vector<int64_t>>()) << name;
  EXPECT_EQ(replace_invalid_utf8(m.tokenizer->decode(ids)), expected["text"].get<std::string>()) << name;
  // Streamed, the text is the same: a character the tokens so far end inside
  // is held back until it is complete, and at the end it is U+FFFD, as in the
  // decoded text. Every length from 1 to 16 tokens, so that such ends occur.
  int cut_inside = 0;
  for (int n = 1; n <= (int)ids.size(); ++n) {
    std::string streamed;
    generate(m, prompt, {.max_new_tokens = n, .temperature = 0}, [&](const std::string& piece) { streamed += piece; });
    const std::string raw = m.tokenizer->decode({ids.begin(), ids.begin() + n});
    EXPECT_EQ(streamed, replace_invalid_utf8(raw)) << name << ", " << n << " tokens";
    cut_inside += detail::complete_utf8_prefix(raw) < raw.size();
  }
  if (name != "qwen3") {  // the fixtures whose tokens end inside a character at some length (4 to 6 lengths each)
    EXPECT_GT(cut_inside, 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity, ::testing::Values("llama", "qwen2", "qwen3", "mistral", "mixtral", "gpt2"));

// generate()'s logits processors on a decoder, from a generation_config.json,
// counting the prompt as generate() does (make_hf_fixtures.py --only
// llama-rules): 8 prompts, greedy, 24 new tokens, a second eos id that ends
// 4 of the plain outputs early; repetition_penalty above and below 1,
// no_repeat_ngram_size 1 and 2, bad_words_ids of one id and of a pair,
// min_length, min_new_tokens and three together. 38 of the 72 outputs differ
// from those without the rules and every rule set changes some, so a rule
// left out, or one that skips the prompt (min_length counting the outputs
// only; the penalty on the outputs alone), fails here.
// min_p (as transformers' MinPLogitsWarper and llama.cpp's min-p sampler):
// only tokens at least min_p times as likely as the most likely one, after
// the temperature. Logits 0, -1, -2, -3, -10, -0.5 are, at temperature 1,
// 1, 0.37, 0.14, 0.05, 0.00005 and 0.61 times the first's probability: min_p
// 0.1 keeps ids 0, 1, 2 and 5; at temperature 2 id 3 (0.22) too.
TEST(Sampling, MinPKeepsOnlyTokensNearTheMostLikely) {
  const std::vector<float> logits = {0, -1, -2, -3, -10, -0.5f};
  Tokenizer::Specials specials;
  specials.never_sampled.clear();  // (by default qkv's <pad>, <bos> and <unk>: ids 0, 1 and 3)
  auto counts = [&](float temperature, float min_p) {
    std::vector<int> seen(logits.size());
    Rng rng(3);
    const GenerateOptions o{.temperature = temperature, .min_p = min_p};
    for (int i = 0; i < 4000; ++i)
      ++seen[detail::sample_token(logits.data(), (int64_t)logits.size(), o, specials, rng)];
    return seen;
  };
  const std::vector<int> t1 = counts(1.0f, 0.1f), t2 = counts(2.0f, 0.1f), off = counts(1.0f, 0.0f);
  for (int v : {0, 1, 2, 5}) EXPECT_GT(t1[v], 0) << v;
  EXPECT_EQ(t1[3], 0);
  EXPECT_EQ(t1[4], 0);
  for (int v : {0, 1, 2, 3, 5}) EXPECT_GT(t2[v], 0) << v;
  EXPECT_EQ(t2[4], 0);
  EXPECT_GT(off[3], 0);  // without min_p, id 3 (2.3% of the mass) is drawn
}

// typical_p, epsilon_cutoff and eta_cutoff keep the tokens transformers'
// TypicalLogitsWarper, EpsilonLogitsWarper and EtaLogitsWarper keep (the
// expected sets are theirs, after TemperatureLogitsWarper and, in one case,
// MinPLogitsWarper, on the same logits): 3,000 draws must meet every kept
// token and no other. Typical sampling can leave out the most likely token
// (typical_p 0.2 keeps only id 5, whose surprise is nearest the entropy).
TEST(Sampling, TypicalEpsilonAndEtaKeepTheTokensTransformersKeeps) {
  const std::vector<float> logits = {0, -1, -2, -3, -10, -0.5f};
  Tokenizer::Specials specials;
  specials.never_sampled.clear();
  struct Case {
    GenerateOptions o;
    std::set<int64_t> kept;
  };
  const std::vector<Case> cases = {
      {{.temperature = 1, .typical_p = 0.5f}, {0, 1, 5}},
      {{.temperature = 1, .typical_p = 0.2f}, {5}},
      {{.temperature = 1, .typical_p = 0.99f}, {0, 1, 2, 3, 5}},
      {{.temperature = 2, .typical_p = 0.95f}, {0, 1, 2, 3, 5}},
      {{.temperature = 0.5f, .typical_p = 0.6f}, {0}},
      {{.temperature = 1, .epsilon_cutoff = 0.2f}, {0, 5}},
      {{.temperature = 1, .epsilon_cutoff = 0.05f}, {0, 1, 2, 5}},
      {{.temperature = 2, .epsilon_cutoff = 0.05f}, {0, 1, 2, 3, 5}},
      {{.temperature = 1, .eta_cutoff = 0.9f}, {0, 5}},
      {{.temperature = 1, .eta_cutoff = 0.1f}, {0, 1, 5}},
      {{.temperature = 1, .eta_cutoff = 0.02f}, {0, 1, 2, 3, 5}},
      {{.temperature = 1, .min_p = 0.1f, .typical_p = 0.5f}, {0, 5}},
      {{.temperature = 1, .typical_p = 0.9f, .epsilon_cutoff = 0.1f}, {0, 1, 5}},
  };
  // The same with id 4 at -inf (as a rule such as bad_words_ids leaves it):
  // its probability 0 must not make the entropy NaN.
  const std::vector<float> ruled = {0, -1, -2, -3, -INFINITY, -0.5f};
  for (const std::vector<float>* l : {&logits, &ruled})
    for (size_t c = 0; c < cases.size(); ++c) {
      std::set<int64_t> seen;
      Rng rng(11);
      for (int i = 0; i < 3000; ++i)
        seen.insert(detail::sample_token(l->data(), (int64_t)l->size(), cases[c].o, specials, rng));
      EXPECT_EQ(seen, cases[c].kept) << "case " << c << (l == &ruled ? ", id 4 at -inf" : "");
    }
}

// OpenAI's presence and frequency penalties and logit_bias, against the
// definition written out here: logit[v] - count(v) * f - (count(v) > 0) * p
// + bias[v], count(v) over the outputs only. The penalties flip a greedy
// choice, the prompt's ids are not penalized, a bias of -100 bans and one
// of +100 forces, and values out of range are errors.
TEST(Sampling, PenaltiesAndLogitBiasActAsOpenAIDefinesThem) {
  const std::vector<float> logits = {0.5f, 1, 3, 2, -1, 0.25f};
  const std::vector<int64_t> outputs = {2, 2, 5, 2, 0};
  const GenerateOptions o{.presence_penalty = 0.75f, .frequency_penalty = -0.5f, .logit_bias = {{4, 1.5f}, {1, -3}}};
  std::vector<float> got = logits;
  detail::apply_penalties(o, outputs, got.data(), (int64_t)got.size());
  for (int64_t v = 0; v < (int64_t)logits.size(); ++v) {
    const auto count = (float)std::count(outputs.begin(), outputs.end(), v);
    float want = logits[v] - count * o.frequency_penalty - (count > 0 ? o.presence_penalty : 0.0f);
    for (const auto& [id, bias] : o.logit_bias) want += id == v ? bias : 0.0f;
    EXPECT_FLOAT_EQ(got[v], want) << "id " << v;
  }
  Tokenizer::Specials specials;
  specials.never_sampled.clear();
  Rng rng(1);
  const int64_t V = (int64_t)logits.size();
  auto greedy = [&](GenerateOptions g, std::vector<int64_t> prefix, std::vector<int64_t> outs) {
    g.temperature = 0;
    return detail::next_token(logits.data(), V, g, specials, rng, {}, prefix, outs);
  };
  EXPECT_EQ(greedy({}, {}, {2}), 2);
  EXPECT_EQ(greedy({.frequency_penalty = 1.5f}, {}, {2}), 3);    // 3 - 1.5 < 2
  EXPECT_EQ(greedy({.presence_penalty = 1.5f}, {}, {2, 2}), 3);  // once, whatever the count
  EXPECT_EQ(greedy({.frequency_penalty = 0.4f}, {}, {2}), 2);    // 2.6 still first
  EXPECT_EQ(greedy({.frequency_penalty = 0.4f}, {}, {2, 2, 2}), 3);
  EXPECT_EQ(greedy({.frequency_penalty = 2}, {2, 2, 2}, {}), 2);  // the prompt is not penalized
  EXPECT_EQ(greedy({.logit_bias = {{2, -100}}}, {}, {}), 3);
  EXPECT_EQ(greedy({.logit_bias = {{4, 100}}}, {}, {}), 4);
  for (const GenerateOptions& bad :
       {GenerateOptions{.presence_penalty = 2.5f}, GenerateOptions{.frequency_penalty = -3},
        GenerateOptions{.logit_bias = {{1, 101}}}, GenerateOptions{.logit_bias = {{-1, 1}}}})
    EXPECT_THROW(detail::check_options(bad), Error);
  std::vector<float> row = logits;
  EXPECT_THROW(detail::apply_penalties({.logit_bias = {{6, 1}}}, {}, row.data(), V), Error);  // past the vocabulary
}

TEST(Hf, TokenRulesChangeADecodersOutputsAsGenerateDoes) {
  const nlohmann::json e = nlohmann::json::parse(read_file(hf("llama.rules.expected.json")));
  const auto prompts = e["prompts"].get<std::vector<std::string>>();
  const auto prompt_ids = e["prompt_ids"].get<std::vector<std::vector<int64_t>>>();
  const auto plain = e["outputs"].get<std::vector<std::vector<int64_t>>>();
  const GenerateOptions greedy{.max_new_tokens = e["max_new_tokens"].get<int64_t>(), .temperature = 0};
  // The folder with a generation_config.json of the second eos and `rules`.
  const auto folder = [&](const nlohmann::json& rules) {
    const std::string dir = testing::temp_dir("hf-rules");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
      std::filesystem::copy_file(hf("llama") + "/" + f, dir + "/" + f);
    nlohmann::json g = rules;
    g["eos_token_id"] = e["eos_token_id"];
    write_file_atomic(dir + "/generation_config.json", g.dump());
    return dir;
  };
  LanguageModel m = load_language_model(folder(nlohmann::json::object()));
  ASSERT_TRUE(m.generation.rules.empty());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(m.tokenizer->encode_prompt(prompts[i]), prompt_ids[i]) << prompts[i];
    EXPECT_EQ(generate(m, prompts[i], greedy), plain[i]) << prompts[i];
  }
  int64_t differ = 0;
  for (const nlohmann::json& c : e["cases"]) {
    m = load_language_model(folder(c["rules"]));
    ASSERT_FALSE(m.generation.rules.empty()) << c["rules"].dump();
    const auto want = c["outputs"].get<std::vector<std::vector<int64_t>>>();
    int64_t changed = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(generate(m, prompts[i], greedy), want[i]) << prompts[i] << ", rules " << c["rules"].dump();
      changed += want[i] != plain[i];
    }
    EXPECT_GT(changed, 0) << c["rules"].dump() << " changes no output";
    differ += changed;
  }
  EXPECT_EQ(differ, 38) << "the cases should tell the rules apart";
  // An id past the vocabulary is one error when the folder loads, not at the first token.
  const std::string bad = folder({{"bad_words_ids", {{5}, {4, 100000}}}});
  EXPECT_EQ(testing::error_of([&] { load_language_model(bad); }),
            bad + "/generation_config.json: bad_words_ids: id 100000 is past the vocabulary of 512");
}

TEST(Hf, TheEosIdsComeFromGenerationConfig) {
  EXPECT_EQ(load_language_model(hf("qwen2")).tokenizer->specials().eos, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(load_language_model(hf("llama")).tokenizer->specials().eos, std::vector<int64_t>{1});
  // Without generation_config.json, config.json's; a tokenizer larger than the model's vocabulary is refused.
  std::string dir = with_config("llama", {{"eos_token_id", {1, 3}}});
  std::filesystem::copy_file(hf("llama") + "/tokenizer.json", dir + "/tokenizer.json");
  EXPECT_EQ(load_language_model(dir).tokenizer->specials().eos, (std::vector<int64_t>{1, 3}));
  dir = with_config("llama", {{"eos_token_id", "end"}});
  std::filesystem::copy_file(hf("llama") + "/tokenizer.json", dir + "/tokenizer.json");
  EXPECT_EQ(error_of([&] { load_language_model(dir); }), dir + "/config.json: eos_token_id must be an id or a list of ids");
}

// A folder with tokenizer.model and no tokenizer.json (Llama 2's kind):
// SentencePiece's ids with <s> first, the folder's eos_token_id; a qkv folder
// written from it keeps the file and reads the same.
TEST(Hf, ATokenizerModelAloneIsTheFoldersTokenizer) {
  const std::string dir = with_config("llama", {{"eos_token_id", 2}});
  const std::string spm = std::string(QKV_FIXTURES_DIR) + "/tokenizers/llama2-spm";
  for (const char* f : {"tokenizer.model", "tokenizer_config.json"})
    std::filesystem::copy_file(spm + "/" + f, dir + "/" + f);
  const LanguageModel m = load_language_model(dir);
  ASSERT_TRUE(m.tokenizer);
  EXPECT_EQ(m.tokenizer->specials().eos, std::vector<int64_t>{2});
  const std::vector<int64_t> prompt = m.tokenizer->encode_prompt("我是中国人 -> 私は");
  EXPECT_EQ(prompt.front(), 1);
  const std::string out = testing::temp_dir("hf");
  save_model_folder(out, family_of_folder(dir), *m.model, m.tokenizer.get(), "");
  const LanguageModel back = load_language_model(out);
  EXPECT_EQ(back.tokenizer->encode_prompt("我是中国人 -> 私は"), prompt);
  EXPECT_EQ(back.tokenizer->specials().eos, std::vector<int64_t>{2});
  EXPECT_EQ(read_file(out + "/tokenizer.model"), read_file(spm + "/tokenizer.model"));
}

TEST(Hf, TheConfigMapsOntoTheDecoderFields) {
  const DecoderConfig llama = load_language_model(hf("llama")).model->config();
  EXPECT_EQ(llama.rope_theta, 500000.0f);
  EXPECT_EQ(llama.num_kv_heads, 2);
  EXPECT_FALSE(llama.tie_output);
  EXPECT_FALSE(llama.bias.q);
  const DecoderConfig qwen = load_language_model(hf("qwen2")).model->config();
  EXPECT_EQ(qwen.head_dim, 12);
  EXPECT_TRUE(qwen.tie_output);
  EXPECT_TRUE(qwen.bias.q && qwen.bias.k && qwen.bias.v);
  EXPECT_FALSE(qwen.bias.out);
  EXPECT_EQ(qwen.rope_theta, 1000000.0f);
  EXPECT_FALSE(qwen.qk_norm);
  EXPECT_FALSE(qwen.rope_scaling.active());
  // Llama 3.1's frequency scaling; Qwen3's QK-Norm with the model's eps; Mistral's window as the context.
  EXPECT_EQ(llama.rope_scaling.factor, 8.0f);
  EXPECT_EQ(llama.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(llama.rope_scaling.high_freq_factor, 32.0f);
  EXPECT_EQ(llama.rope_scaling.original_context, 256);
  const DecoderConfig qwen3 = load_language_model(hf("qwen3")).model->config();
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.qk_norm_eps, 1e-5f);
  EXPECT_EQ(qwen3.head_dim, 16);
  EXPECT_FALSE(qwen3.bias.q || qwen3.bias.out);
  EXPECT_EQ(load_language_model(hf("mistral")).model->config().context, 32);
  const DecoderConfig mixtral = load_language_model(hf("mixtral")).model->config();
  EXPECT_EQ(mixtral.mlp, MLPKind::MoE);
  EXPECT_EQ(mixtral.moe.num_experts, 4);
  EXPECT_EQ(mixtral.moe.top_k, 2);
  EXPECT_EQ(mixtral.moe.expert, MLPKind::SwiGLU);
}

// The scaled frequencies in their three bands (head_dim 8, theta 500000,
// original context 256, factors 1 and 32, as the llama fixture): the fastest
// pair (wavelength 2 pi) is kept, the next (167) blended, the slow two
// divided by the factor 8. The values are transformers' _compute_llama3_parameters.
TEST(Hf, Llama3FrequencyScaling) {
  const std::vector<double> f =
      rope_frequencies(8, 500000.0f, {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 32, .original_context = 256});
  const double plain1 = std::pow(500000.0, -0.25), smooth = (256.0 * plain1 / (2 * M_PI) - 1.0) / 31.0;
  ASSERT_EQ(f.size(), 4u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_DOUBLE_EQ(f[1], (1 - smooth) * plain1 / 8 + smooth * plain1);
  EXPECT_DOUBLE_EQ(f[2], std::pow(500000.0, -0.5) / 8);
  EXPECT_DOUBLE_EQ(f[3], std::pow(500000.0, -0.75) / 8);
  EXPECT_EQ(rope_frequencies(8, 500000.0f)[1], plain1);  // no scaling
}

// "linear" rotary scaling (position interpolation): every frequency divided
// by the factor. The llama fixture's weights with it in place of llama3's give
// transformers' logits (llama-linear.expected.safetensors), and the llama3
// ones would not.
TEST(Hf, LinearFrequencyScaling) {
  const std::vector<double> f = rope_frequencies(8, 500000.0f, {.kind = RopeScalingKind::Linear, .factor = 4});
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(f[i], std::pow(500000.0, -0.25 * i) / 4) << i;
  const nlohmann::json linear = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 500000.0},
                                 {"low_freq_factor", nullptr}, {"high_freq_factor", nullptr},
                                 {"original_max_position_embeddings", nullptr}};
  const LanguageModel m = load_language_model(with_config("llama", {{"rope_parameters", linear}}));
  EXPECT_EQ(m.model->config().rope_scaling.kind, RopeScalingKind::Linear);
  SafetensorsFile expected = load_safetensors(hf("llama-linear.expected.safetensors"));
  NoGradGuard no_grad;
  const Tensor logits = m.model->forward(*expected.find("ids"));
  EXPECT_TRUE(testing::all_close(logits, *expected.find("logits"), 1e-4f, 1e-4f));
  EXPECT_FALSE(testing::all_close(load_language_model(hf("llama")).model->forward(*expected.find("ids")),
                                  *expected.find("logits"), 1e-4f, 1e-4f));
  // Its config.json names the kind and the factor only.
  const nlohmann::json written = nlohmann::json::parse(m.model->config().to_json());
  EXPECT_EQ(written["rope_scaling_type"], "linear");
  EXPECT_EQ(written["rope_scaling_factor"], 4.0);
  EXPECT_FALSE(written.contains("rope_low_freq_factor"));
}

// "yarn" rotary scaling: the frequencies transformers computes (kept, blended
// half and half, divided by 4, for the fixture's 4 pairs), the attention
// factor 0.1 ln 4 + 1 on q and k, and so transformers' logits
// (llama-yarn.expected.safetensors). The config round trip keeps every field.
TEST(Hf, YarnFrequencyScaling) {
  SafetensorsFile expected = load_safetensors(hf("llama-yarn.expected.safetensors"));
  const nlohmann::json yarn = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4096},
                               {"rope_theta", 500000.0}};
  const LanguageModel m =
      load_language_model(with_config("llama", {{"rope_parameters", yarn}, {"max_position_embeddings", 16384}}));
  const RopeScaling& s = m.model->config().rope_scaling;
  EXPECT_EQ(s.kind, RopeScalingKind::Yarn);
  EXPECT_EQ(s.original_context, 4096);
  EXPECT_NEAR(s.attention_factor, expected.find("attention_scaling")->to_vector()[0], 1e-6);
  const std::vector<double> f = rope_frequencies(8, 500000.0f, s);
  const std::vector<float> inv_freq = expected.find("inv_freq")->to_vector();
  ASSERT_EQ(f.size(), inv_freq.size());
  for (size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(f[i], inv_freq[i], 1e-6 * inv_freq[i]) << i;  // theirs: float32
  EXPECT_DOUBLE_EQ(f[1], 0.5 * std::pow(500000.0, -0.25) + 0.5 * std::pow(500000.0, -0.25) / 4);  // the blended pair
  NoGradGuard no_grad;
  const Tensor logits = m.model->forward(*expected.find("ids"));
  EXPECT_TRUE(testing::all_close(logits, *expected.find("logits"), 1e-4f, 1e-4f));
  nlohmann::json written = nlohmann::json::parse(m.model->config().to_json());
  EXPECT_EQ(written["rope_scaling_type"], "yarn");
  EXPECT_EQ(written["rope_beta_fast"], 32.0);
  EXPECT_EQ(written["rope_truncate"], true);
  EXPECT_FALSE(written.contains("rope_low_freq_factor"));
  // The attention factor multiplies the rotated vector (q and k alike).
  const Tensor x = Tensor::randn({1, 1, 3, 8}, *std::make_unique<Rng>(1));
  RopeScaling plain = s;
  plain.attention_factor = 1.0f;
  EXPECT_TRUE(testing::all_close(rope(x, {.theta = 500000.0f, .scaling = s}),
                                 scale(rope(x, {.theta = 500000.0f, .scaling = plain}), s.attention_factor), 1e-6f, 1e-6f));
  // transformers' other readings: mscale over mscale_all_dim, no factor (max_position_embeddings / L), truncate false.
  const nlohmann::json variant = {{"rope_type", "yarn"},       {"factor", nullptr},      {"mscale", 0.707},
                                  {"mscale_all_dim", 0.707},  {"truncate", false},      {"beta_fast", 16.0},
                                  {"original_max_position_embeddings", 4096}, {"rope_theta", 500000.0}};
  const RopeScaling v = load_language_model(with_config("llama", {{"rope_parameters", variant},
                                                                  {"max_position_embeddings", 32768}}))
                            .model->config()
                            .rope_scaling;
  EXPECT_EQ(v.factor, 8.0f);
  EXPECT_EQ(v.attention_factor, 1.0f);
  EXPECT_EQ(v.beta_fast, 16.0f);
  EXPECT_FALSE(v.truncate);
}

// "dynamic" (NTK-aware) rotary scaling: plain frequencies within the
// original context L, past it a larger theta for the call's length n. The
// llama fixture's weights with it past a context of 8 give transformers'
// logits for 14 tokens in one pass, and step by step through the KV cache,
// where each step rotates its token with the frequencies of its own n and
// the cached keys keep theirs (llama-dynamic.expected.safetensors: the two
// differ by up to 0.09 at the last position, so a cache that rotated every
// key anew, or the one-pass frequencies for every step, would fail).
TEST(Hf, DynamicFrequencyScaling) {
  const RopeScaling s{.kind = RopeScalingKind::Dynamic, .factor = 2, .original_context = 8};
  EXPECT_EQ(rope_frequencies(8, 500000.0f, s, 8), rope_frequencies(8, 500000.0f));  // within L: plain
  const double base = 500000.0 * std::pow(2.0 * 14 / 8 - 1.0, 8.0 / 6.0);
  const std::vector<double> f = rope_frequencies(8, 500000.0f, s, 14);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(f[i], std::pow(base, -0.25 * i)) << i;
  const nlohmann::json dynamic = {{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 500000.0}};
  const LanguageModel m =
      load_language_model(with_config("llama", {{"rope_parameters", dynamic}, {"max_position_embeddings", 8}}));
  const DecoderConfig& c = m.model->config();
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::Dynamic);
  EXPECT_EQ(c.rope_scaling.original_context, 8);
  EXPECT_EQ(c.context, 16);  // factor times the original
  SafetensorsFile expected = load_safetensors(hf("llama-dynamic.expected.safetensors"));
  const Tensor ids = *expected.find("ids");
  NoGradGuard no_grad;
  EXPECT_TRUE(testing::all_close(m.model->forward(ids), *expected.find("logits"), 1e-4f, 1e-4f));
  std::vector<KVCache> caches = m.model->make_caches(1, c.context);
  std::vector<Tensor> steps = {m.model->forward_cached(ids.slice(1, 0, 6), caches)};
  for (int64_t t = 6; t < ids.size(1); ++t) steps.push_back(m.model->forward_cached(ids.slice(1, t, t + 1), caches));
  EXPECT_TRUE(testing::all_close(concat(steps, 1), *expected.find("cached_logits"), 1e-4f, 1e-4f));
  const nlohmann::json written = nlohmann::json::parse(c.to_json());
  EXPECT_EQ(written["rope_scaling_type"], "dynamic");
  EXPECT_EQ(written["rope_original_context"], 8);
}

// What would silently change the model is refused, naming the field.
TEST(Hf, OptionsQkvDoesNotImplementAreOneErrorNamingTheField) {
  auto error_with = [](const nlohmann::json& changes) {
    const std::string dir = with_config("llama", changes);
    return error_of([&] { load_language_model(dir); }).substr(dir.size() + 1);
  };
  EXPECT_EQ(error_with({{"rope_parameters", {{"rope_type", "longrope"}, {"factor", 8.0}}}}),
            "config.json: 'rope_parameters' of type 'longrope' is not supported yet (a different model would run)");
  EXPECT_EQ(error_with({{"rope_parameters", {{"rope_type", "dynamic"}, {"factor", nullptr}}}}),
            "config.json: 'rope_parameters': 'factor' is missing");
  EXPECT_EQ(error_with({{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", nullptr}}}}),
            "config.json: 'rope_parameters': 'original_max_position_embeddings' is missing");
  EXPECT_EQ(error_with({{"rope_parameters", {{"low_freq_factor", nullptr}}}}),
            "config.json: 'rope_parameters': 'low_freq_factor' is missing");
  EXPECT_EQ(error_with({{"rope_parameters", {{"low_freq_factor", 40.0}}}}),
            "config.json: rope_low_freq_factor 40 must be below rope_high_freq_factor 32");
  EXPECT_EQ(error_with({{"layer_types", {"full_attention", "sliding_attention"}}}),
            "config.json: 'layer_types' with \"sliding_attention\" is not supported yet (a different model would run)");
  EXPECT_EQ(error_with({{"hidden_act", "gelu"}}),
            "config.json: 'hidden_act' is \"gelu\"; the SwiGLU MLP of these models uses silu");
  EXPECT_EQ(error_with({{"mlp_bias", true}}),
            "config.json: 'mlp_bias': true is not supported yet (a different model would run)");
  EXPECT_EQ(error_with({{"vocab_size", nullptr}}), "config.json: 'vocab_size' is missing");
  EXPECT_EQ(error_with({{"hidden_size", "wide"}}),
            "config.json: 'hidden_size' must be a whole number from 1 to 262144, got \"wide\"");
  // A float where a count belongs is refused, never cast (1e30 does not fit an integer).
  EXPECT_EQ(error_with({{"hidden_size", 1e30}}),
            "config.json: 'hidden_size' must be a whole number from 1 to 262144, got 1e+30");
  EXPECT_EQ(error_with({{"max_position_embeddings", 64.5}}),
            "config.json: 'max_position_embeddings' must be a whole number from 1 to 9223372036854775807, got 64.5");
  EXPECT_EQ(error_with({{"rope_theta", "big"}}).rfind("config.json: a field has the wrong type (", 0), 0u);
  EXPECT_EQ(error_with({{"num_key_value_heads", 3}}).rfind("config.json: ", 0), 0u);  // 4 heads over 3: the decoder's check
  EXPECT_EQ(error_with({{"architectures", {"T5Model"}}}),
            "config.json: a Hugging Face model of architecture T5Model; qkv reads MarianMTModel, LlamaForCausalLM, "
            "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, GPT2LMHeadModel, "
            "ViTForImageClassification, BertModel");
  // The wrong task names what the folder holds, as for qkv's own folders.
  EXPECT_NE(error_of([] { load_translation_model(hf("llama"), "translate"); }).find("a decoder-only language model"),
            std::string::npos);
  // A weight of the wrong shape, or one the model has no place for, names the file
  // (the first such tensor in the file: down_proj, read before gate_proj).
  const std::string dir = with_config("llama", {{"intermediate_size", 48}});
  EXPECT_EQ(error_of([&] { load_language_model(dir); }),
            dir + "/model.safetensors: load_state_dict: tensor 'layers.0.mlp.w3.weight' has shape [32,64], model "
                  "expects [32,48]");
}

TEST(Hf, Gpt2OptionsAndCheckpointNames) {
  auto error_with = [](const nlohmann::json& changes) {
    const std::string dir = with_config("gpt2", changes);
    return error_of([&] { load_language_model(dir); }).substr(dir.size() + 1);
  };
  EXPECT_EQ(error_with({{"activation_function", "swish"}}),
            "config.json: 'activation_function' 'swish' is not supported yet (a different model would run)");
  EXPECT_EQ(error_with({{"scale_attn_by_inverse_layer_idx", true}}),
            "config.json: 'scale_attn_by_inverse_layer_idx': true is not supported yet (a different model would run)");
  EXPECT_EQ(error_with({{"n_positions", nullptr}}), "config.json: 'n_positions' is missing");
  const DecoderConfig c = load_language_model(hf("gpt2")).model->config();
  EXPECT_EQ(c.positions, PositionKind::Learned);
  EXPECT_EQ(c.norm, NormKind::LayerNorm);
  EXPECT_EQ(c.activation, Activation::GeluTanh);
  EXPECT_EQ(c.dim_feedforward, 128);  // n_inner null: 4 x n_embd
  EXPECT_TRUE(c.tie_output);
  // The original GPT-2 files: no "transformer." prefix, and the causal mask saved as h.N.attn.bias (skipped).
  const std::string dir = with_config("gpt2", nlohmann::json::object());
  std::vector<std::pair<std::string, Tensor>> renamed;
  for (auto& [name, t] : load_safetensors(dir + "/model.safetensors").as_map())
    renamed.emplace_back(name.rfind("transformer.", 0) == 0 ? name.substr(12) : name, t);
  renamed.emplace_back("h.0.attn.bias", Tensor::ones({1, 1, 64, 64}));
  save_safetensors(dir + "/model.safetensors", renamed);
  LanguageModel m = load_language_model(dir);
  SafetensorsFile expected = load_safetensors(hf("gpt2.expected.safetensors"));
  NoGradGuard no_grad;
  EXPECT_TRUE(testing::all_close(m.model->forward(*expected.find("ids")), *expected.find("logits"), 1e-4f, 1e-4f));
  // Both spellings at once: the second copy of a weight is an error, not a silent choice.
  renamed.emplace_back("transformer.wte.weight", *load_safetensors(hf("gpt2/model.safetensors")).find("transformer.wte.weight"));
  save_safetensors(dir + "/model.safetensors", renamed);
  EXPECT_NE(error_of([&] { load_language_model(dir); }).find("is a second copy of embed.weight"), std::string::npos);
}

// model.safetensors.index.json: each tensor in the shard the index names,
// or one error naming the file and the tensor.
TEST(Hf, ShardedWeightsFollowTheIndex) {
  auto index_of = [](const std::string& dir) {
    return nlohmann::json::parse(read_file(dir + "/model.safetensors.index.json"));
  };
  auto with_index = [&](const nlohmann::json& index) {
    const std::string dir = with_config("qwen3", nlohmann::json::object());
    write_file_atomic(dir + "/model.safetensors.index.json", index.dump());
    return dir;
  };
  const nlohmann::json index = index_of(hf("qwen3"));
  const std::string shard = index["weight_map"]["model.norm.weight"].get<std::string>();
  // Two tensors' files swapped in the index: each is then in a file the index does not give it.
  nlohmann::json swapped = index;
  const std::string other = index["weight_map"]["model.embed_tokens.weight"].get<std::string>();
  ASSERT_NE(shard, other);
  swapped["weight_map"]["model.norm.weight"] = other;
  swapped["weight_map"]["model.embed_tokens.weight"] = shard;
  std::string dir = with_index(swapped);
  const std::string error = error_of([&] { load_language_model(dir); });
  EXPECT_NE(error.find("is not listed for this file in " + dir + "/model.safetensors.index.json"), std::string::npos)
      << error;
  // A tensor the index lists that its shard lacks.
  nlohmann::json extra = index;
  extra["weight_map"]["model.layers.9.mlp.up_proj.weight"] = shard;
  dir = with_index(extra);
  EXPECT_EQ(error_of([&] { load_language_model(dir); }),
            dir + "/" + shard + ": tensor 'model.layers.9.mlp.up_proj.weight', which " + dir +
                "/model.safetensors.index.json places here, is missing");
  // A file name that leaves the folder, a missing map, a missing shard.
  nlohmann::json outside = index;
  outside["weight_map"]["model.norm.weight"] = "../" + shard;
  dir = with_index(outside);
  EXPECT_EQ(error_of([&] { load_language_model(dir); }),
            dir + "/model.safetensors.index.json: '../" + shard + "' is not a file name in the folder");
  dir = with_index(nlohmann::json::object());
  EXPECT_EQ(error_of([&] { load_language_model(dir); }),
            dir + "/model.safetensors.index.json: expected an object with a \"weight_map\" object");
  dir = with_index(index);
  std::filesystem::remove(dir + "/" + shard);
  EXPECT_NE(error_of([&] { load_language_model(dir); }).find(dir + "/" + shard + ": cannot open"), std::string::npos);
}

// A Llama folder of random weights whose Linear weights are most of its bytes
// (4 layers of width 128, 64 tokens), every tensor in `dtype`.
std::string random_llama(DType dtype) {
  const int64_t D = 128, F = 384, V = 64, layers = 4, kv = 64;
  const std::string dir = testing::temp_dir("hf-bf16");
  const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                                 {"hidden_size", D}, {"intermediate_size", F}, {"num_hidden_layers", layers},
                                 {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
                                 {"vocab_size", V}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
                                 {"rope_theta", 10000.0}, {"tie_word_embeddings", false}, {"hidden_act", "silu"}};
  write_file_atomic(dir + "/config.json", config.dump(2));
  Rng rng(7);
  std::vector<std::pair<std::string, Tensor>> tensors;
  auto add = [&](const std::string& name, const Shape& shape, bool norm = false) {
    Tensor t = norm ? Tensor::full(shape, 1.0f) + Tensor::randn(shape, rng, 0.1f) : Tensor::randn(shape, rng, 0.05f);
    tensors.emplace_back(name, t.to(dtype));
  };
  add("model.embed_tokens.weight", {V, D});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, true);
    add(p + "self_attn.q_proj.weight", {D, D});
    add(p + "self_attn.k_proj.weight", {kv, D});
    add(p + "self_attn.v_proj.weight", {kv, D});
    add(p + "self_attn.o_proj.weight", {D, D});
    add(p + "post_attention_layernorm.weight", {D}, true);
    add(p + "mlp.gate_proj.weight", {F, D});
    add(p + "mlp.up_proj.weight", {F, D});
    add(p + "mlp.down_proj.weight", {D, F});
  }
  add("model.norm.weight", {D}, true);
  add("lm_head.weight", {V, D});
  save_safetensors(dir + "/model.safetensors", tensors);
  return dir;
}

// Every parameter of `a` and `b`, in order: the same name, dtype and bytes.
// Returns how many are in `dtype`.
int64_t expect_same_parameters(const Module& a, const Module& b, DType dtype) {
  // state_dict(): the values of a weight held packed only too (Linear::unpack_weight)
  const StateDict sa = a.state_dict(), sb = b.state_dict();
  EXPECT_EQ(sa.size(), sb.size());
  int64_t in_dtype = 0;
  for (const auto& [name, t] : sa) {
    auto other = sb.find(name);
    if (other == sb.end()) {
      ADD_FAILURE() << name << " is only in the first";
      continue;
    }
    const Tensor& u = other->second;
    if (t.dtype() != u.dtype() || t.shape() != u.shape()) {
      ADD_FAILURE() << name << ": " << dtype_name(t.dtype()) << " " << shape_str(t.shape()) << " vs "
                    << dtype_name(u.dtype()) << " " << shape_str(u.shape());
      continue;
    }
    const size_t bytes = (size_t)t.numel() * dtype_size(t.dtype());
    EXPECT_EQ(std::memcmp(t.contiguous().raw_data(), u.contiguous().raw_data(), bytes), 0) << name;
    in_dtype += t.dtype() == dtype;
  }
  return in_dtype;
}

// A bfloat16 checkpoint loaded for bf16: its Linear weights are built in
// bfloat16 and filled from the file, one tensor at a time; for int8, each is
// quantized as soon as it is in. The model is the one a float32 load
// converted afterwards gives (every parameter, bit for bit), and the memory
// it took on the way is that model plus two tensors at most (as float32).
// Measured: bf16 1.63 MB, the model itself (bound 2.02 MB); int8 1.22 MB for
// a model of 0.93 MB (bound 1.32 MB). Mutations tried: Linear weights built
// in float32 took 3.51 and 3.38 MB; the int8 load reading the file whole
// before filling the model in took 1.88 MB (for bf16 that costs nothing: the
// file's tensors become the weights).
TEST(Hf, Bfloat16CheckpointLoadsForBf16WithoutAFloat32Copy) {
  const std::string dir = random_llama(DType::BF16);
  uint64_t largest = 0;
  const SafetensorsReader file(dir + "/model.safetensors");
  for (const SafetensorsEntry& e : file.entries())
    largest = std::max<uint64_t>(largest, (uint64_t)shape_numel(e.shape) * sizeof(float));
  for (const auto& [name, dtype] : {std::pair<std::string, DType>{"bf16", DType::BF16}, {"int8", DType::I8}}) {
    LanguageModel before = load_language_model(dir);
    before.model->convert_linear_weights(dtype);
    const uint64_t base = allocator_stats().bytes_in_use;
    reset_peak_bytes();
    LanguageModel m = load_language_model(dir, "generate", name);
    const uint64_t peak = allocator_stats().peak_bytes_in_use - base;
    // What the model holds: its parameters' values, less the BF16 weights held packed only (on the meta
    // device), plus their packed copies (Linear::weight_packed), where this CPU keeps them.
    uint64_t model = 0, packed = 0;
    int64_t packed_only = 0;
    for (const auto& [pname, p] : m.model->named_parameters()) {
      if (p.device() == Device::Cpu) model += (uint64_t)p.numel() * dtype_size(p.dtype());
      if (const Linear* lin = m.model->linear_of(pname); lin && lin->weight_packed.defined()) {
        packed += 4 * (uint64_t)lin->weight_packed.numel();
        packed_only += lin->weight.device() == Device::Meta;
      }
    }
    const bool packs = dtype == DType::BF16 && kernels_for(Device::Cpu).gemm_bf16_packed_b_words(64, 64) > 0;
    EXPECT_EQ(packed > 0, packs);
    EXPECT_EQ(packed_only, packs ? 4 * 7 + 1 : 0) << name;  // every Linear weight once, packed
    EXPECT_LE(peak, model + packed + 2 * largest)
        << name << ": peak " << peak << " bytes, model " << model << " bytes, packed " << packed << ", largest tensor "
        << largest << " as float32";
    EXPECT_EQ(m.model->linear_weight_dtype(), dtype) << name;
    EXPECT_EQ(expect_same_parameters(*m.model, *before.model, dtype), 4 * 7 + 1) << name;  // every Linear weight
  }
}

// Every family that reads Hugging Face folders, in every dtype: loading in
// the dtype gives the model that loading and then converting gives, every
// parameter bit for bit (float32, bfloat16 and float16 files, sharded too), and
// for a decoder the same logits (its tied head's copy included).
class HfDtypes : public ::testing::TestWithParam<const char*> {};

TEST_P(HfDtypes, LoadingInADtypeIsLoadingThenConverting) {
  const std::string dir = hf(GetParam());
  for (const auto& [name, dtype] : {std::pair<std::string, DType>{"f32", DType::F32}, {"bf16", DType::BF16},
                                    {"f16", DType::F16}, {"int8", DType::I8}}) {
    ModelFolder converted = load_model_folder(dir);
    converted.model->convert_linear_weights(dtype);
    ModelFolder direct = load_model_folder(dir, {name});
    const int64_t in_dtype = expect_same_parameters(*direct.model, *converted.model, dtype);
    EXPECT_GT(in_dtype, 0) << GetParam() << " " << name;
    EXPECT_EQ(direct.model->linear_weight_dtype(), dtype) << GetParam() << " " << name;
    if (auto lm = std::dynamic_pointer_cast<DecoderLM>(direct.model)) {
      NoGradGuard no_grad;
      const Tensor ids = Tensor::from_ints({1, 5, 9, 2}, {1, 4});
      const Tensor a = lm->forward(ids), b = std::dynamic_pointer_cast<DecoderLM>(converted.model)->forward(ids);
      EXPECT_EQ(a.to_vector(), b.to_vector()) << GetParam() << " " << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfDtypes,
                         ::testing::Values("llama", "qwen2", "qwen3", "mistral", "mixtral", "gpt2", "marian",
                                           "marian-separate", "vit", "bert"));

// Float32 weights loaded for f16 convert as they are filled in; a value
// float16 cannot hold is an error naming the tensor, not an infinity.
TEST(Hf, AFloat16LoadRefusesAValuePastItsRange) {
  const std::string dir = random_llama(DType::F32);
  LanguageModel m = load_language_model(dir, "generate", "f16");
  EXPECT_EQ(m.model->linear_weight_dtype(), DType::F16);
  SafetensorsFile f = load_safetensors(dir + "/model.safetensors");
  for (auto& [name, t] : f.tensors)
    if (name == "model.layers.2.mlp.up_proj.weight") t.data<float>()[5] = 70000.0f;
  save_safetensors(dir + "/model.safetensors", f.tensors);
  EXPECT_EQ(error_of([&] { load_language_model(dir, "generate", "f16"); }),
            dir + "/model.safetensors: load_state_dict: tensor 'layers.2.mlp.w2.weight' holds a value of magnitude "
                  "70000, which float16 cannot hold (largest finite value 65504); use bf16");
  EXPECT_EQ(error_of([&] { load_language_model(dir, "generate", "f8"); }), "dtype 'f8': expected f32, bf16, f16 or int8");
}

}  // namespace
}  // namespace qkv
