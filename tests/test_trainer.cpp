// The training loop: an interrupted and resumed run ends bit for bit where a
// straight run ends; non-finite steps are skipped without touching the model;
// too many in a row stop training with the last checkpoint intact.
#include <omp.h>

#include <filesystem>
#include <set>
#include <nlohmann/json.hpp>

#include "qkv/allocator.h"
#include "qkv/checkpoint.h"
#include "qkv/registry.h"
#include "qkv/io.h"
#include "qkv/trainer.h"
#include "qkv/ops.h"
#include "src/train/loop.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

const char* kConfig = R"({"d_model": 32, "nhead": 4, "num_encoder_layers": 1, "num_decoder_layers": 1,
                          "dim_feedforward": 64, "dropout": 0.1})";

TrainOptions small_options(int64_t steps) {
  TrainOptions o;
  o.steps = steps;
  o.batch_tokens = 256;
  o.warmup_steps = 4;
  o.eval_every = 6;
  o.eval_sentences = 5;
  return o;
}

std::map<std::string, Tensor> state_of(const std::string& dir) {
  return load_safetensors(dir + "/trainer_state.safetensors").as_map();
}

// Trains 12 steps straight and 6 then resumed to 12 at `precision`, expects
// the two states equal bit for bit, and returns the straight run's state.
std::map<std::string, Tensor> expect_exact_resume(Precision precision) {
  omp_set_num_threads(1);  // the same thread count gives the same numbers; one makes it simplest
  auto train = synth_zh_ja(120, 5), valid = synth_zh_ja(10, 6, train);
  const std::string straight = testing::temp_dir("trainer"), interrupted = testing::temp_dir("trainer");
  auto options = [&](int64_t steps) {
    TrainOptions o = small_options(steps);
    o.precision = precision;
    return o;
  };

  TranslationModel a = new_translation_model(kConfig, "config", train, 1);
  train_translation(a, train, valid, options(12), straight, {});

  TranslationModel b = new_translation_model(kConfig, "config", train, 1);
  train_translation(b, train, valid, options(6), interrupted, {});  // stops halfway
  TranslationModel resumed = load_translation_model(interrupted);
  TrainOptions o = options(12);
  o.resume = true;
  train_translation(resumed, train, valid, o, interrupted, {});

  auto sa = state_of(straight), sb = state_of(interrupted);
  EXPECT_EQ(sa.size(), sb.size());
  int compared = 0;
  for (auto& [name, t] : sa) {
    if (!sb.count(name)) {
      ADD_FAILURE() << name << " missing after the resume";
      continue;
    }
    EXPECT_EQ(t.shape(), sb.at(name).shape()) << name;
    if (name.rfind("model.", 0) == 0 || name.rfind("optimizer.", 0) == 0) {
      std::vector<float> x = t.to_vector(), y = sb.at(name).to_vector();
      EXPECT_TRUE(x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0)
          << name << " differs";
      ++compared;
    }
  }
  EXPECT_GT(compared, 20);
  EXPECT_EQ(sa.at("step").to_ints(), (std::vector<int64_t>{12}));
  // A resume with nothing left to do, or from a folder without state, is a clear error.
  EXPECT_THROW(train_translation(resumed, train, valid, o, interrupted, {}), Error);
  TranslationModel c = new_translation_model(kConfig, "config", train, 1);
  EXPECT_THROW(train_translation(c, train, valid, o, testing::temp_dir("trainer"), {}), Error);
  return sa;
}

TEST(Trainer, ResumedRunEqualsStraightRunBitForBit) { expect_exact_resume(Precision::F32); }

// "precision": "bf16" resumes exactly too, and its products are really taken
// in bfloat16: after 12 steps its weights differ from the float32 run's
// (every weight matrix), though by little next to the weights themselves.
TEST(Trainer, MixedPrecisionResumesExactlyAndRoundsItsProducts) {
  auto f32 = expect_exact_resume(Precision::F32), bf16 = expect_exact_resume(Precision::Bf16);
  int matrices = 0;
  for (auto& [name, t] : f32) {
    if (name.rfind("model.", 0) != 0 || t.dim() != 2) continue;
    std::vector<float> x = t.to_vector(), y = bf16.at(name).to_vector();
    double diff = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) diff += (x[i] - y[i]) * (double)(x[i] - y[i]), norm += x[i] * (double)x[i];
    EXPECT_GT(diff, 0) << name << ": the bf16 run took float32 products";
    EXPECT_LT(std::sqrt(diff / norm), 0.05) << name;
    ++matrices;
  }
  EXPECT_GT(matrices, 8);
}

// Weights, gradients and AdamW's two moments: a model whose four copies exceed
// the memory limit is refused before the first step, leaving no checkpoint.
TEST(Trainer, AModelThatFitsButCannotTrainIsRefusedBeforeTheFirstStep) {
  struct Restore {
    ~Restore() { set_memory_limit(0); }
  } restore;
  auto train = synth_zh_ja(40, 5), valid = synth_zh_ja(5, 6, train);
  TranslationModel m = new_translation_model(kConfig, "config", train, 1);
  const uint64_t weights = m.model->parameter_bytes();
  set_memory_limit(4 * weights - 1);
  const std::string dir = testing::temp_dir("trainer");
  const std::string e = testing::error_of([&] { train_translation(m, train, valid, small_options(6), dir, {}); });
  EXPECT_EQ(e, "training this model needs at least " + format_bytes(4 * weights) + " (" + format_bytes(weights) +
                   " of weights, as much again for their gradients and twice that for AdamW's moments), more than "
                   "qkv may use here (" + format_bytes(memory_limit()) + ")");
  EXPECT_FALSE(std::filesystem::exists(dir + "/trainer_state.safetensors"));
}

// A task of the one loop whose validation scores are scripted, one per step:
// what the loop makes of them (which is best, when it stops) is all there is.
class ScriptedTask final : public TrainTask {
public:
  explicit ScriptedTask(std::vector<std::pair<double, double>> scores) : scores_(std::move(scores)) {}
  std::vector<bool> best;  // per validation
  std::vector<float> lrs;   // per step

  Module& model() override { return model_; }
  int64_t total_steps() const override { return (int64_t)scores_.size(); }
  float lr_at(int64_t) override { return 0.1f; }
  StepLoss step_loss(int64_t, Shard) override {
    Tensor loss = sum(mul(model_.w, model_.w));
    return {loss, loss.item(), 1};
  }
  void progress(int64_t, float, float lr, double, double, int64_t) override { lrs.push_back(lr); }
  bool validate_after(int64_t) const override { return true; }
  Validation validate(int64_t step, float) override {
    auto [score, tiebreak] = scores_[step - 1];
    return {.score = score, .history = {{"step", step}}, .tiebreak = tiebreak};
  }
  nlohmann::ordered_json summary(int64_t step, double, int64_t, const nlohmann::json&) const override {
    return {{"step", step}};
  }
  bool validated(const Validation&, bool b) override {
    best.push_back(b);
    return false;
  }
  void save_best(const std::string& dir, const std::string& state) override {
    std::filesystem::create_directories(dir);
    write_file_atomic(dir + "/trainer_state.json", state);
  }
  const char* state_format() const override { return "scripted"; }
  const char* best_key() const override { return "best_score"; }
  double worst_score() const override { return -1; }
  bool better(double score, double best) const override { return score > best; }

private:
  struct One : Module {
    Tensor w = register_parameter("w", Tensor::from_vector({1.0f}, {1}));
  } model_;
  std::vector<std::pair<double, double>> scores_;
};

// (score, tie-break) per step: the tie-break decides between equal scores only.
const std::vector<std::pair<double, double>> kScores = {{1, 0}, {2, -5}, {2, -3}, {2, -3}, {1, 100}, {2, -4}};

TEST(TrainingLoop, EqualScoresAreDecidedByTheTieBreak) {
  ScriptedTask task(kScores);
  TrainOutcome out = run_training(task, {}, testing::temp_dir("loop"));
  EXPECT_EQ(task.best, (std::vector<bool>{true, true, true, false, false, false}));
  EXPECT_EQ(out.last_step, 6);
  EXPECT_TRUE(out.stopped_early.empty());
}

// Early stopping: `patience` validations in a row without a better score end
// the run; the count is saved, so a resumed run goes on counting.
TEST(TrainingLoop, PatienceEndsTheRunAndSurvivesAResume) {
  ScriptedTask task(kScores);
  TrainOutcome out = run_training(task, {.patience = 2}, testing::temp_dir("loop"));
  EXPECT_EQ(out.last_step, 5);
  EXPECT_EQ(out.stopped_early, "early stopping: 2 validations in a row without a better score (patience 2)");
  EXPECT_EQ(task.best.size(), 5u);

  // Four steps (one validation since the best), then resumed to six with patience 2:
  // it stops at 5 only if the resume remembered that one.
  const std::string dir = testing::temp_dir("loop");
  ScriptedTask first({kScores.begin(), kScores.begin() + 4});
  EXPECT_EQ(run_training(first, {}, dir).last_step, 4);
  ScriptedTask rest(kScores);
  TrainOutcome resumed = run_training(rest, {.patience = 2, .resume = true}, dir);
  EXPECT_EQ(resumed.last_step, 5);
  EXPECT_EQ(rest.best, (std::vector<bool>{false}));
  EXPECT_EQ(load_safetensors(dir + "/trainer_state.safetensors").metadata.at("validations_since_best"), "2");
}

// Reduce on plateau: every plateau_patience validations without a better
// score multiply the learning rate by plateau_factor, from the next step on.
TEST(TrainingLoop, APlateauLowersTheLearningRate) {
  ScriptedTask task(kScores);  // best at 1-3, then 4 and 5 not: the second of them halves the rate
  const std::string dir = testing::temp_dir("loop");
  run_training(task, {.plateau_factor = 0.5f, .plateau_patience = 2}, dir);
  EXPECT_EQ(task.lrs, (std::vector<float>{0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.05f}));
  EXPECT_EQ(std::stod(load_safetensors(dir + "/trainer_state.safetensors").metadata.at("lr_scale")), 0.5);
}

// keep_checkpoints: the model folders of the newest N validations, by step.
TEST(TrainingLoop, KeepsTheNewestCheckpoints) {
  ScriptedTask task(kScores);
  const std::string dir = testing::temp_dir("loop");
  std::filesystem::create_directories(dir + "/checkpoints/notes");  // not a save: left alone
  run_training(task, {.keep_checkpoints = 2}, dir);
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/checkpoints")) names.insert(e.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"notes", "step-5", "step-6"}));
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/step-6/trainer_state.json"));
}

// Checkpoint averaging: the element-wise mean, written as a model folder that
// loads; folders of different models are refused.
TEST(Checkpoints, AveragingTakesTheMeanOfOneModelsSaves) {
  auto train = synth_zh_ja(40, 5);
  TranslationModel a = new_translation_model(kConfig, "config", train, 1), b = new_translation_model(kConfig, "config", train, 2);
  const std::string da = testing::temp_dir("avg"), db = testing::temp_dir("avg"), out = testing::temp_dir("avg");
  const Family& family = find_family("transformer", "test");
  save_model_folder(da, family, *a.model, a.tokenizer.get(), "");
  save_model_folder(db, family, *b.model, b.tokenizer.get(), "");
  average_model_folders({da, db}, out);
  TranslationModel avg = load_translation_model(out);
  const StateDict sa = a.model->state_dict(), sb = b.model->state_dict(), sm = avg.model->state_dict();
  ASSERT_EQ(sm.size(), sa.size());
  for (auto& [name, t] : sm) {
    std::vector<float> x = sa.at(name).to_vector(), y = sb.at(name).to_vector(), m = t.to_vector();
    for (size_t k = 0; k < m.size(); ++k) ASSERT_NEAR(m[k], 0.5f * (x[k] + y[k]), 1e-6f) << name;
  }
  EXPECT_EQ(translate_texts(avg, {"我是中国人"}, 8).size(), 1u);

  EXPECT_NE(testing::error_of([&] { average_model_folders({da}, out); }).find("expected two or more"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { average_model_folders({da, db}, da); }).find("is one of the folders"),
            std::string::npos);
  const char* wider = R"({"d_model": 64, "nhead": 4, "num_encoder_layers": 1, "num_decoder_layers": 1,
                          "dim_feedforward": 64})";
  TranslationModel c = new_translation_model(wider, "config", train, 1);
  const std::string dc = testing::temp_dir("avg");
  save_model_folder(dc, family, *c.model, c.tokenizer.get(), "");
  EXPECT_NE(testing::error_of([&] { average_model_folders({da, dc}, out); }).find("is not the same model"),
            std::string::npos);
  TranslationModel d = new_translation_model(kConfig, "config", synth_zh_ja(40, 9), 1);
  const std::string dd = testing::temp_dir("avg");
  save_model_folder(dd, family, *d.model, d.tokenizer.get(), "");
  const std::string other = testing::error_of([&] { average_model_folders({da, dd}, out); });
  EXPECT_TRUE(other.find("another tokenizer") != std::string::npos || other.find("not the same model") != std::string::npos)
      << other;
}

// --config auto: the rules of docs/training.md, and configs that load.
TEST(Recipe, ChoosesTokenizerSizeAndLengthFromTheData) {
  auto config_of = [](const std::vector<SentencePair>& pairs) {
    TranslationRecipe r = translation_recipe(pairs);
    EXPECT_EQ(r.reasons.size(), 3u);
    return nlohmann::json::parse(r.config_json);
  };
  auto latin = [](int64_t n) {
    std::vector<SentencePair> p;
    for (int64_t i = 0; i < n; ++i) p.push_back({"the cat " + std::to_string(i), "le chat " + std::to_string(i)});
    return p;
  };
  // Small: characters and the demo's size, and the config trains.
  const auto small = synth_zh_ja(1000, 1);
  nlohmann::json c = config_of(small);
  EXPECT_EQ(c["tokenizer"], "char");
  EXPECT_EQ(c["d_model"], 128);
  EXPECT_EQ(c["train"]["steps"], 1000) << "at least 1,000 steps";
  EXPECT_EQ(c["train"]["patience"], 5);
  EXPECT_EQ(c["train"]["keep_checkpoints"], 5);
  EXPECT_NO_THROW(TrainOptions::from_json(c.dump(), "auto"));
  EXPECT_NO_THROW(new_translation_model(c.dump(), "auto", small, 1));
  // More pairs of an alphabetic text: subwords; more still: a wider, deeper model.
  c = config_of(latin(30000));
  EXPECT_EQ(c["tokenizer"]["type"], "sentencepiece");
  EXPECT_EQ(c["tokenizer"]["vocab_size"], 8000);
  EXPECT_EQ(c["d_model"], 128);
  c = config_of(latin(60000));
  EXPECT_EQ(c["d_model"], 256);
  EXPECT_EQ(c["num_encoder_layers"], 4);
  EXPECT_NO_THROW(TrainOptions::from_json(c.dump(), "auto"));
  c = config_of(latin(500000));
  EXPECT_EQ(c["d_model"], 512);
  EXPECT_EQ(c["nhead"], 8);
  EXPECT_GT(c["train"]["steps"].get<int64_t>(), 1000);
  // Many distinct characters (Chinese-like) under 200,000 pairs: characters.
  std::vector<SentencePair> hanzi;
  for (int64_t i = 0; i < 30000; ++i) {
    std::string s;
    for (int k = 0; k < 4; ++k) {  // U+4E00 + j, three bytes of UTF-8
      const uint32_t cp = 0x4E00 + (uint32_t)((i * 7 + k * 131) % 3000);
      s += {(char)(0xE0 | (cp >> 12)), (char)(0x80 | ((cp >> 6) & 0x3F)), (char)(0x80 | (cp & 0x3F))};
    }
    hanzi.push_back({s, s});
  }
  EXPECT_EQ(config_of(hanzi)["tokenizer"], "char");
  // The longest sentence always fits a batch.
  std::vector<SentencePair> long_one = small;
  long_one.push_back({std::string(5000, 'a'), "b"});
  EXPECT_GE(config_of(long_one)["train"]["batch_tokens"].get<int64_t>(), 5001);
  EXPECT_THROW(translation_recipe({}), Error);
}

// The caller's stop callback ends a translation run after a validation.
TEST(Trainer, AStopCallbackEndsTrainingAfterItsValidation) {
  auto train = synth_zh_ja(80, 7), valid = synth_zh_ja(8, 8, train);
  TrainOptions o = small_options(60);
  o.eval_every = 2;
  TrainCallbacks cb;
  int64_t validations = 0;
  cb.stop = [&](const EvalReport& r) { return ++validations, r.step == 4; };
  TranslationModel m = new_translation_model(kConfig, "config", train, 3);
  const std::string dir = testing::temp_dir("trainer");
  TrainOutcome out = train_translation(m, train, valid, o, dir, cb);
  EXPECT_EQ(out.last_step, 4);
  EXPECT_EQ(out.stopped_early, "stopped after the validation at step 4");
  EXPECT_EQ(validations, 2);
  EXPECT_EQ(state_of(dir).at("step").to_ints()[0], 4);
}

TEST(Trainer, NonFiniteStepsAreSkippedWithoutTouchingTheModel) {
  auto train = synth_zh_ja(80, 7), valid = synth_zh_ja(8, 8, train);
  const std::string dir = testing::temp_dir("trainer");
  TranslationModel m = new_translation_model(kConfig, "config", train, 2);
  std::vector<float> before_skip;
  auto snapshot = [&] {
    std::vector<float> all;
    for (auto& p : m.model->parameters())
      for (float v : p.to_vector()) all.push_back(v);
    return all;
  };
  TrainCallbacks cb;
  cb.inject_nonfinite = [&](int64_t step) {
    if (step == 3) before_skip = snapshot();  // before steps 3 and 4, both skipped
    if (step == 5) {
      EXPECT_EQ(snapshot(), before_skip) << "a skipped step changed the parameters";
    }
    return step == 3 || step == 4;
  };
  train_translation(m, train, valid, small_options(6), dir, cb);
  auto state = nlohmann::json::parse(read_file(dir + "/trainer_state.json"));
  EXPECT_EQ(state["skipped_steps"].get<int64_t>(), 2);
  EXPECT_EQ(state_of(dir).at("optimizer.steps").to_ints()[0], 4) << "6 steps, 2 skipped";

  // Non-finite from step 8 on: stops after max_skipped_in_a_row, the step-6 checkpoint stays loadable.
  TrainOptions o = small_options(30);
  o.max_skipped_in_a_row = 3;
  TranslationModel n = new_translation_model(kConfig, "config", train, 2);
  TrainCallbacks always;
  always.inject_nonfinite = [](int64_t step) { return step >= 8; };
  try {
    train_translation(n, train, valid, o, dir, always);
    FAIL() << "training went on";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 steps in a row had a non-finite loss"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(load_translation_model(dir));
  EXPECT_EQ(state_of(dir).at("step").to_ints()[0], 6);
}

TEST(Trainer, SentencePieceModelFolderSavesAndLoads) {
  omp_set_num_threads(1);
  auto train = synth_zh_ja(200, 8), valid = synth_zh_ja(10, 9, train);
  std::string config = R"({"d_model": 32, "nhead": 4, "num_encoder_layers": 1, "num_decoder_layers": 1,
      "dim_feedforward": 64, "tokenizer": {"type": "sentencepiece", "model_type": "bpe", "vocab_size": 500}})";
  TranslationModel m = new_translation_model(config, "config", train, 3);
  EXPECT_LE(m.tokenizer->size(), 500);
  const std::string dir = testing::temp_dir("trainer");
  train_translation(m, train, valid, small_options(6), dir, {});
  EXPECT_TRUE(std::filesystem::exists(dir + "/tokenizer.model"));
  nlohmann::json saved = nlohmann::json::parse(read_file(dir + "/config.json"));
  EXPECT_EQ(saved["tokenizer"]["type"], "sentencepiece");
  EXPECT_EQ(saved["tokenizer"]["model_type"], "bpe");
  EXPECT_EQ(saved["vocab_size"], m.tokenizer->size());

  m.model->eval();
  TranslationModel back = load_translation_model(dir);
  std::vector<std::string> sources = {valid[0].first, valid[1].first, "我是中国人"};
  EXPECT_EQ(translate_texts(back, sources, 20), translate_texts(m, sources, 20));
  EXPECT_EQ(back.tokenizer->encode(valid[2].second), m.tokenizer->encode(valid[2].second));

  saved["tokenizer"] = {{"type", "sentencepiece"}, {"model_type", "bpe"}};
  write_file_atomic(dir + "/config.json", saved.dump());
  std::filesystem::remove(dir + "/tokenizer.model");
  EXPECT_THROW(load_translation_model(dir), Error);  // the tokenizer file is missing
}

}  // namespace
}  // namespace qkv

namespace qkv {
namespace {

// The translation folder of tests/fixtures/folders, written at 0d3f9a4 after 2
// steps on the first 190 of synth_zh_ja(200, 1) (the last 10 held out), in a
// fresh temporary copy.
struct LegacyRun {
  std::string dir = testing::temp_dir("legacy_resume");
  std::vector<SentencePair> train, valid;
  TrainOptions o;
  LegacyRun() {
    std::filesystem::remove_all(dir);
    std::filesystem::copy(std::string(QKV_FIXTURES_DIR) + "/folders/transformer", dir);
    std::vector<SentencePair> pairs = synth_zh_ja(200, 1);
    train.assign(pairs.begin(), pairs.end() - 10);
    valid.assign(pairs.end() - 10, pairs.end());
    o.steps = 3, o.batch_tokens = 128, o.eval_every = 2, o.eval_sentences = 2, o.resume = true;
  }
  void resume() {
    TranslationModel m = load_translation_model(dir);
    train_translation(m, train, valid, o, dir, {});
  }
  // Rewrites trainer_state.safetensors with `edit` applied to its tensors and metadata.
  void corrupt(const std::function<void(std::vector<std::pair<std::string, Tensor>>&, Metadata&)>& edit) {
    SafetensorsFile f = load_safetensors(dir + "/trainer_state.safetensors");
    edit(f.tensors, f.metadata);
    save_safetensors(dir + "/trainer_state.safetensors", f.tensors, f.metadata);
  }
};

void set_tensor(std::vector<std::pair<std::string, Tensor>>& t, const std::string& name, const Tensor& value) {
  for (auto& [n, v] : t)
    if (n == name) v = value;
}

TEST(TrainerState, AFolderOfTheOldLayoutResumes) {
  LegacyRun run;
  run.resume();
  EXPECT_NE(read_file(run.dir + "/trainer_state.json").find("\"step\": 3"), std::string::npos);
}

// issue 21, item 3: every field of the state is checked before use. The first
// seven cases are the issue's reproducers (a heap overflow, a use after free,
// null references, a 16-byte read from an 8-byte tensor under ASan); the rest
// are values the old reader took as they were. Each is now one error naming the file.
TEST(TrainerState, EveryFieldIsCheckedBeforeUse) {
  using Edit = std::function<void(std::vector<std::pair<std::string, Tensor>>&, Metadata&)>;
  const std::vector<std::pair<std::string, Edit>> cases = {
      {"next_batch past the end", [](auto& t, auto&) { set_tensor(t, "data.next_batch", Tensor::from_ints({1000}, {1})); }},
      {"negative next_batch", [](auto& t, auto&) { set_tensor(t, "data.next_batch", Tensor::from_ints({-5}, {1})); }},
      {"offsets past the indices", [](auto& t, auto&) { set_tensor(t, "data.offsets", Tensor::from_ints({0, 5, 100000}, {3})); }},
      {"negative offsets", [](auto& t, auto&) { set_tensor(t, "data.offsets", Tensor::from_ints({-100, 5}, {2})); }},
      {"empty step", [](auto& t, auto&) { set_tensor(t, "step", Tensor::zeros({0}, DType::I64)); }},
      {"empty optimizer.steps", [](auto& t, auto&) { set_tensor(t, "optimizer.steps", Tensor::zeros({0}, DType::I64)); }},
      {"short rng.data", [](auto& t, auto&) { set_tensor(t, "rng.data", Tensor::from_ints({7}, {1})); }},
      {"float step", [](auto& t, auto&) { set_tensor(t, "step", Tensor::from_vector({1.0f}, {1})); }},
      {"negative step", [](auto& t, auto&) { set_tensor(t, "step", Tensor::from_ints({-1000000}, {1})); }},
      {"more skipped than steps", [](auto& t, auto&) { set_tensor(t, "skipped", Tensor::from_ints({9}, {1})); }},
      {"best_chrf not a number", [](auto&, auto& m) { m["best_chrf"] = "abc"; }},
      {"history not JSON", [](auto&, auto& m) { m["history"] = "[{"; }},
      {"another format", [](auto&, auto& m) { m["format"] = "qkv-vit-trainer-state"; }},
  };
  for (auto& [name, edit] : cases) {
    LegacyRun run;
    run.corrupt(edit);
    try {
      run.resume();
      ADD_FAILURE() << name << ": resumed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("trainer_state.safetensors"), std::string::npos) << name << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace qkv
