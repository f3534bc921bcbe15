// Language-model training and generation: documents pack into one stream;
// a tiny model trained for seconds on a repetitive text reproduces it from a
// prompt; cached generation equals recomputing; sampling is seeded; the
// stream never splits a UTF-8 character; a prompt longer than the context is
// an error unless truncation is asked for; the folder reloads.
#include <omp.h>

#include <filesystem>

#include "qkv/io.h"
#include "qkv/lm_trainer.h"
#include "qkv/train_run.h"
#include "qkv/utf8.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

TEST(ByteTokenizer, RoundTripsAnyTextAndPacksDocuments) {
  std::unique_ptr<Tokenizer> tok = train_tokenizer(TokenizerConfig{.type = TokenizerKind::Bytes}, {"unused"});
  EXPECT_EQ(tok->size(), 260);
  const std::string text = "私は中国人です, abc\n";
  std::vector<int64_t> ids = tok->encode(text);
  EXPECT_EQ(ids.size(), text.size());  // one token per byte
  EXPECT_EQ(tok->decode(ids), text);
  std::vector<int64_t> packed = pack_documents(*tok, "ab\ncd\n\n\nef\n");
  std::vector<int64_t> want = {Tokenizer::kBos};
  for (int64_t id : tok->encode("ab\ncd")) want.push_back(id);
  want.push_back(Tokenizer::kEos);
  want.push_back(Tokenizer::kBos);
  for (int64_t id : tok->encode("ef")) want.push_back(id);
  want.push_back(Tokenizer::kEos);
  EXPECT_EQ(packed, want);
  try {
    pack_documents(*tok, "good\nbad \xff\n");
    FAIL() << "invalid UTF-8 was packed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2: invalid UTF-8"), std::string::npos) << e.what();
  }
}

const char* kTinyConfig = R"({"arch": "decoder", "d_model": 64, "nhead": 4, "num_layers": 2, "dim_feedforward": 128,
                             "context": 48, "train": {"steps": 400, "batch_size": 8, "lr": 0.01, "warmup_steps": 20,
                             "eval_every": 200}})";

TEST(LanguageModel, ReproducesARepetitiveTextAndGeneratesFromTheCache) {
  omp_set_num_threads(1);
  std::string text;
  for (int i = 0; i < 40; ++i) text += "the cat sat on the mat. ";
  LanguageModel m = new_language_model(kTinyConfig, "config", text, 3);
  std::vector<int64_t> stream = pack_documents(*m.tokenizer, text);
  const std::string dir = testing::temp_dir("lm");
  std::vector<LmEvalReport> reports;
  train_language_model(m, stream, stream, LmTrainOptions::from_json(kTinyConfig, "config"), dir,
                       {.evaluated = [&](const LmEvalReport& r) { reports.push_back(r); }});
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_LT(reports.back().perplexity, 1.5) << "a repeated sentence is easy to predict";

  LanguageModel loaded = load_language_model(dir);
  std::string streamed;
  std::vector<int64_t> out = generate(loaded, "the cat sat", {.max_new_tokens = 20, .temperature = 0},
                                      [&](const std::string& piece) { streamed += piece; });
  EXPECT_EQ(streamed, " on the mat. the cat");
  EXPECT_EQ(replace_invalid_utf8(loaded.tokenizer->decode(out)), streamed);

  // Greedy generation with the cache equals greedy generation recomputing the whole sequence.
  NoGradGuard no_grad;
  std::vector<int64_t> seq = {Tokenizer::kBos};
  for (int64_t id : loaded.tokenizer->encode("the cat sat")) seq.push_back(id);
  std::vector<int64_t> recomputed;
  for (int i = 0; i < 20; ++i) {
    Tensor logits = loaded.model->forward(Tensor::from_ints(seq, {1, (int64_t)seq.size()}));
    const int64_t V = logits.size(-1);
    const float* last = logits.data<float>() + (seq.size() - 1) * V;
    int64_t best = Tokenizer::kEos;
    for (int64_t v = Tokenizer::kEos; v < V; ++v)
      if (v != Tokenizer::kUnk && last[v] > last[best]) best = v;
    if (best == Tokenizer::kEos) break;
    recomputed.push_back(best);
    seq.push_back(best);
  }
  EXPECT_EQ(out, recomputed);

  // Sampling: the same seed gives the same text; top-k 1 is greedy, and so
  // is min-p 1 (only the most likely token is as likely as itself).
  GenerateOptions s{.max_new_tokens = 15, .temperature = 1.5f, .top_k = 0, .top_p = 0.9f, .seed = 7};
  EXPECT_EQ(generate(loaded, "the", s), generate(loaded, "the", s));
  EXPECT_EQ(generate(loaded, "the cat sat", {.max_new_tokens = 20, .temperature = 1.0f, .top_k = 1}), out);
  EXPECT_EQ(generate(loaded, "the cat sat", {.max_new_tokens = 20, .temperature = 1.0f, .min_p = 1.0f}), out);

  // Too long a prompt: an error, or its last tokens with --truncate-prompt.
  const std::string long_prompt(60, 'a');
  EXPECT_THROW(generate(loaded, long_prompt, {.max_new_tokens = 3}), Error);
  std::vector<int64_t> kept = generate(loaded, long_prompt, {.max_new_tokens = 3, .temperature = 0,
                                                             .truncate_prompt = true});
  EXPECT_LE(kept.size(), 3u);
  std::filesystem::remove_all(dir);
}

TEST(LanguageModel, SentencePieceBpeModelTrainsSavesAndLoads) {
  omp_set_num_threads(1);
  std::string text;
  for (int i = 0; i < 40; ++i) text += "私は中国人です。彼は日本人です。\n\n";
  LanguageModel m = new_language_model(R"({"arch": "decoder", "d_model": 32, "nhead": 4, "num_layers": 1,
      "dim_feedforward": 64, "context": 24, "tokenizer": {"type": "sentencepiece", "model_type": "bpe",
      "vocab_size": 40}})", "config", text, 2);
  EXPECT_EQ(m.tokenizer->file_name(), "tokenizer.model");
  EXPECT_LE(m.tokenizer->size(), 40);
  EXPECT_EQ(m.model->config().vocab_size, m.tokenizer->size());
  std::vector<int64_t> stream = pack_documents(*m.tokenizer, text);
  EXPECT_LT(stream.size(), text.size() / 3);  // pieces, not bytes
  const std::string dir = testing::temp_dir("lm");
  LmTrainOptions o;
  o.steps = 40, o.batch_size = 4, o.lr = 0.01f, o.warmup_steps = 4, o.eval_every = 40;
  train_language_model(m, stream, stream, o, dir, {});
  EXPECT_TRUE(std::filesystem::exists(dir + "/tokenizer.model"));
  LanguageModel back = load_language_model(dir);
  EXPECT_EQ(back.tokenizer->encode("彼は日本人です。"), m.tokenizer->encode("彼は日本人です。"));
  GenerateOptions greedy{.max_new_tokens = 8, .temperature = 0};
  EXPECT_EQ(generate(back, "私は", greedy), generate(m, "私は", greedy));
  std::filesystem::remove_all(dir);
}

TEST(LanguageModel, StreamNeverSplitsACharacter) {
  // A byte model writes each 3-byte character of Japanese one byte per step;
  // every piece handed to the stream must still be valid UTF-8 on its own.
  std::string text;
  for (int i = 0; i < 30; ++i) text += "私は猫です。";
  LanguageModel m = new_language_model(R"({"arch": "decoder", "d_model": 32, "nhead": 4, "num_layers": 1,
      "dim_feedforward": 64, "context": 40})", "config", text, 5);
  std::vector<int64_t> stream = pack_documents(*m.tokenizer, text);
  const std::string dir = testing::temp_dir("lm");
  LmTrainOptions o;
  o.steps = 60, o.batch_size = 8, o.lr = 0.01f, o.warmup_steps = 5, o.eval_every = 60;
  train_language_model(m, stream, stream, o, dir, {});
  std::vector<std::string> pieces;
  generate(m, "私", {.max_new_tokens = 30, .temperature = 0.8f, .seed = 3},
           [&](const std::string& p) { pieces.push_back(p); });
  ASSERT_FALSE(pieces.empty());
  for (auto& p : pieces) EXPECT_EQ(invalid_utf8_offset(p), std::string::npos) << "a piece split a character";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qkv

namespace qkv {
namespace {

// Stopped at step 6 and resumed to 12 (its trainer state: weights, AdamW
// moments, step, RNG streams; the windows of a step depend on the seed and
// the step only), the weights equal those of a straight run to 12, bit for bit.
TEST(LanguageModelTraining, ResumedRunEqualsStraightRunBitForBit) {
  omp_set_num_threads(1);
  const char* config = R"({"arch": "decoder", "d_model": 16, "nhead": 2, "num_layers": 1, "dim_feedforward": 32,
                           "context": 12, "dropout": 0.1, "train": {"steps": 12, "batch_size": 2, "eval_every": 3}})";
  std::string text;
  for (int i = 0; i < 20; ++i) text += "a rose is a rose. ";
  LmTrainOptions o = LmTrainOptions::from_json(config, "c");
  LanguageModel straight = new_language_model(config, "c", text, 5);
  std::vector<int64_t> stream = pack_documents(*straight.tokenizer, text);
  const std::string a = testing::temp_dir("lm_straight"), b = testing::temp_dir("lm_halves");
  train_language_model(straight, stream, stream, o, a, {});
  LanguageModel first = new_language_model(config, "c", text, 5);
  LmTrainOptions half = o;
  half.steps = 6;
  train_language_model(first, stream, stream, half, b, {});
  LanguageModel resumed = load_language_model(b);
  resumed.model->train();
  LmTrainOptions rest = o;
  rest.resume = true;
  train_language_model(resumed, stream, stream, rest, b, {});
  auto want = straight.model->named_parameters();
  auto got = resumed.model->named_parameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(testing::all_close(got[i].second, want[i].second, 0, 0)) << want[i].first;
  EXPECT_THROW(train_language_model(resumed, stream, stream, rest, b, {}), Error);  // nothing left to do
}

}  // namespace
}  // namespace qkv

namespace qkv {
namespace {

// qkv train --init: a Hugging Face Llama folder fine-tuned through
// train_from_config starts from its weights (one step at a learning rate of
// 1e-9 leaves every weight within 1e-6 of the folder's, where a fresh model
// would differ everywhere), keeps its tokenizer, and saves a qkv folder that
// loads back; a config that also describes a model is refused.
TEST(FineTuning, InitStartsFromTheFoldersWeightsAndSavesAFolderThatLoads) {
  omp_set_num_threads(1);
  const std::string hf = std::string(QKV_FIXTURES_DIR) + "/hf/llama", out = testing::temp_dir("finetune");
  const std::string text_path = testing::temp_dir("finetune") + "/text.txt";
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + "\n";
  write_file_atomic(text_path, text);
  TrainRun run{.config_text = R"({"train": {"batch_size": 2, "lr": 1e-9, "warmup_steps": 0}})",
               .config_source = "ft.json", .train = text_path, .out = out, .init = hf, .steps = 1};
  train_from_config(run, {});
  const LanguageModel before = load_language_model(hf), after = load_language_model(out);
  EXPECT_EQ(after.model->summary(), before.model->summary());
  const std::string probe = "the quick brown fox 🙂";
  EXPECT_EQ(after.tokenizer->encode(probe), before.tokenizer->encode(probe));
  const StateDict a = before.model->state_dict(), b = after.model->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(testing::all_close(b.at(name), t, 1e-6f, 0)) << name;
  }
  // Twenty steps at a real learning rate lower the validation loss.
  TrainRun longer = run;
  longer.config_text = R"({"train": {"batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "eval_every": 20}})";
  longer.out = testing::temp_dir("finetune");
  longer.steps = 20;
  std::vector<double> losses;
  TrainHooks hooks;
  hooks.language.evaluated = [&](const LmEvalReport& r) { losses.push_back(r.valid_loss); };
  train_from_config(longer, hooks);
  ASSERT_FALSE(losses.empty());
  const LanguageModel start = load_language_model(hf);
  EXPECT_LT(losses.back(), 0.9 * std::log((double)start.tokenizer->size())) << "barely better than uniform";
  TrainRun both = run;
  both.config_text = R"({"d_model": 16, "train": {}})";
  EXPECT_EQ(testing::error_of([&] { train_from_config(both, {}); }),
            "train --init: the model comes from " + hf +
                " (a decoder-only language model); ft.json may hold only its \"train\" section, not 'd_model'");
}

}  // namespace
}  // namespace qkv
