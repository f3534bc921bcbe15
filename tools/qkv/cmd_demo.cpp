// qkv demo: qkv's main job from start to end. Generates the synthetic
// Chinese -> Japanese corpus (training pairs drawn with repeats, as text
// from the world has them) with a held-out split, trains the small
// Transformer of configs/transformer-zh-ja.json, scores it on the held-out
// sentences, and checks itself: a fixed list of minimal pairs (zh_ja_checks,
// among them 我是中国人, never trained on) must all translate exactly.
// The checks are part of the validation set that picks the saved model (by
// chrF); the held-out test set is used for nothing but the final score.
// Training goes on, past the recipe's steps if need be, until the saved model
// gets every check right or the step budget is spent, and the demo says which.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <ranges>
#include <set>

#include "qkv/io.h"
#include "qkv/trainer.h"
#include "tools/qkv/commands.h"

#ifndef QKV_SOURCE_DIR
#define QKV_SOURCE_DIR "."
#endif

namespace qkv::cli {
namespace {

struct DemoArgs {
  std::string out = "out/demo";
  std::string config = QKV_SOURCE_DIR "/configs/transformer-zh-ja.json";
  int64_t steps = 0;       // 0: the config's
  int64_t max_steps = 0;   // the budget for getting every check right (0: 8x the steps)
  int64_t train_pairs = 20000;
  int64_t test_pairs = 500;
  int threads = 0;
  int64_t seed = -1;  // -1: the recipe's
};

constexpr int64_t kValidPairs = 300;  // validation pairs beside the checks

int run_demo(const DemoArgs& a) {
  QKV_CHECK(a.steps >= 0, "demo: --steps must be positive, got ", a.steps);
  QKV_CHECK(a.max_steps >= 0, "demo: --max-steps must be positive, got ", a.max_steps);
  QKV_CHECK(a.train_pairs > 0 && a.test_pairs > 0, "demo: --train-pairs and --test-pairs must be positive");
  set_threads(a.threads);
  auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  QKV_CHECK(std::filesystem::is_directory(a.out), "demo: cannot create the output folder ", a.out,
            ec ? ": " + ec.message() : "");
  const std::string train_path = a.out + "/zh-ja.train.tsv", valid_path = a.out + "/zh-ja.valid.tsv",
                    test_path = a.out + "/zh-ja.test.tsv";
  const std::string model_dir = a.out + "/model";

  std::printf("qkv demo: Chinese -> Japanese translation with an encoder-decoder Transformer\n\n");
  const std::vector<SentencePair>& checks = zh_ja_checks();
  // Training pairs as the grammar draws them, repeats kept (sample_zh_ja):
  // distinct pairs would leave the constructions with few combinations, such
  // as X 很好 -> X はいいです, a handful of examples among 20,000.
  std::vector<SentencePair> train = sample_zh_ja(a.train_pairs, 1, checks);
  const auto sources = std::views::keys(train);
  const size_t distinct = std::set<std::string>(sources.begin(), sources.end()).size();
  std::printf(
      "1. corpus from qkv's grammar, no sentence in two sets: %lld training pairs drawn (%zu distinct); %zu "
      "check sentences and %lld more for validation; %lld held-out test pairs\n",
      (long long)a.train_pairs, distinct, checks.size(), (long long)kValidPairs, (long long)a.test_pairs);
  std::vector<SentencePair> seen = train;
  seen.insert(seen.end(), checks.begin(), checks.end());
  std::vector<SentencePair> test = synth_zh_ja(a.test_pairs, 2, seen);
  seen.insert(seen.end(), test.begin(), test.end());
  std::vector<SentencePair> valid = checks;
  for (SentencePair& p : synth_zh_ja(kValidPairs, 3, seen)) valid.push_back(std::move(p));
  write_file_atomic(train_path, format_parallel_tsv(train));
  write_file_atomic(valid_path, format_parallel_tsv(valid));
  write_file_atomic(test_path, format_parallel_tsv(test));
  for (size_t i = 0; i < std::min<size_t>(3, train.size()); ++i)
    std::printf("     %s\t%s\n", train[i].first.c_str(), train[i].second.c_str());

  std::string config_text = read_file(a.config);
  TrainOptions o = TrainOptions::from_json(config_text, a.config);
  if (a.seed >= 0) o.seed = (uint64_t)a.seed;
  if (a.steps > 0) {
    o.steps = a.steps;
    o.eval_every = std::min(o.eval_every, a.steps);
  }
  o.eval_sentences = std::max<int64_t>(o.eval_sentences, (int64_t)valid.size());  // the checks among them
  const int64_t recipe_steps = o.steps;
  o.steps = a.max_steps > 0 ? std::max(a.max_steps, o.steps) : 8 * o.steps;
  TranslationModel m = new_translation_model(config_text, a.config, train, o.seed);
  std::printf("\n2. training (%s), %d threads\n     %s\n     until the saved model translates all %zu checks "
              "right (checked every %lld steps), at most %lld steps\n",
              a.config.c_str(), thread_count(), m.model->summary().c_str(), checks.size(), (long long)o.eval_every,
              (long long)o.steps);
  std::fflush(stdout);
  const bool tty = isatty(STDOUT_FILENO);
  TrainCallbacks cb;
  cb.progress = [&](const TrainProgress& p) {
    if (!tty && p.step % std::max<int64_t>(1, p.total_steps / 8) != 0 && p.step != 1) return;
    std::printf("%s     step %4lld/%lld  loss %.3f  %5.0f tokens/s  lr %.2e  ETA %3.0f s%s", tty ? "\r" : "",
                (long long)p.step, (long long)p.total_steps, p.loss, p.tokens_per_second, p.lr, p.eta_seconds,
                tty ? "" : "\n");
    std::fflush(stdout);
  };
  // After each validation: the checks on the model as it is now. Training
  // stops once they all pass on a model that was just saved (the best so far),
  // so the folder on disk is the model that passed, and it has had at least
  // the recipe's steps. The validation has decoded the checks already, but in
  // a batch with 300 other sentences; they are decoded again here as the
  // final list decodes them (24 alone), so a near-tie that padding tips one
  // way cannot make the two disagree.
  int64_t saved_step = 0;
  cb.stop = [&](const EvalReport& r) {
    if (r.best) saved_step = r.step;
    int64_t right = 0;
    std::string wrong;  // named while few are left
    for (const TranslationCheck& c : check_translations(m, checks, 128)) {
      right += c.ok();
      if (!c.ok()) wrong += (wrong.empty() ? "" : ", ") + c.source;
    }
    if ((int64_t)checks.size() - right > 3) wrong.clear();
    std::printf("%s     step %4lld: valid loss %.4f  chrF %.2f  BLEU %.2f  checks %lld/%zu right%s%s\n",
                tty ? "\n" : "", (long long)r.step, r.valid_loss, r.chrf, r.bleu, (long long)right, checks.size(),
                wrong.empty() ? "" : (" (wrong: " + wrong + ")").c_str(), r.best ? "  (best so far, saved)" : "");
    std::fflush(stdout);
    return r.best && right == (int64_t)checks.size() && r.step >= recipe_steps;
  };
  const auto train_start = std::chrono::steady_clock::now();
  TrainOutcome outcome = train_translation(m, train, valid, o, model_dir, cb);
  const double train_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();

  std::printf("\n3. held-out evaluation of the saved model\n");
  TranslationModel best = load_translation_model(model_dir);
  TranslationScores s = score_translation(best, test, 128);
  std::printf("     chrF %.2f   BLEU (char) %.2f   exact match %.1f%% of %lld sentences\n", s.chrf, s.bleu,
              s.exact_match, (long long)s.sentences);

  std::printf("\n4. the checks, translated by the saved model (never trained on; they helped choose which model to "
              "save)\n");
  int64_t right = 0;
  for (const TranslationCheck& c : check_translations(best, checks, 128)) {
    right += c.ok();
    if (c.ok()) {
      std::printf("     \u2713 %s  ->  %s\n", c.source.c_str(), c.output.c_str());
    } else {
      std::printf("     \u2717 %s  ->  %s   (expected %s)\n", c.source.c_str(), c.output.c_str(), c.reference.c_str());
    }
  }
  std::printf("     %lld/%zu right with the model saved at step %lld; training ran %lld steps in %.0f s", (long long)right,
              checks.size(), (long long)saved_step, (long long)outcome.last_step, train_secs);
  if (right == (int64_t)checks.size()) {
    std::printf("\n");
  } else {
    std::printf(": the budget of %lld steps ran out first (qkv demo --max-steps N trains longer)\n",
                (long long)o.steps);
  }
  const std::string example = "我们明天在图书馆学习日语";
  const std::string picture = a.out + "/attention.svg";
  std::fflush(stdout);
  write_attention_map(best, example, best.tokenizer->encode(example), picture, 128);

  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\ndone in %.0f s. Files:\n     %s, %s, %s\n     %s/ (config.json, model.safetensors, tokenizer.json, "
              "trainer_state.json)\n     %s (cross-attention of \"%s\"; open it in a browser)\n",
              secs, train_path.c_str(), valid_path.c_str(), test_path.c_str(), model_dir.c_str(), picture.c_str(), example.c_str());
  std::printf("try: echo 我是中国人 | qkv translate --model %s\n     qkv eval --model %s --test %s\n", model_dir.c_str(),
              model_dir.c_str(), test_path.c_str());
  return 0;
}

}  // namespace

Run add_demo(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* sub = app.add_subcommand("demo", "Generate the zh-ja corpus, train a Transformer, evaluate, translate");
  sub->add_option("--out", args->out, "Folder for the corpus and the model")->capture_default_str();
  sub->add_option("--config", args->config, "Model and training recipe")->capture_default_str();
  sub->add_option("--steps", args->steps, "Training steps at least (default: the recipe's)");
  sub->add_option("--max-steps", args->max_steps,
                  "Training steps at most, while a check is still wrong (default: 8x --steps)");
  sub->add_option("--train-pairs", args->train_pairs, "Training pairs to generate")->capture_default_str();
  sub->add_option("--test-pairs", args->test_pairs, "Held-out pairs to generate")->capture_default_str();
  sub->add_option("--threads", args->threads, "Threads (0: all cores)")->capture_default_str();
  sub->add_option("--seed", args->seed, "Seed of the weights, dropout and data order (default: the recipe's)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  return [args] { return run_demo(*args); };
}

}  // namespace qkv::cli
