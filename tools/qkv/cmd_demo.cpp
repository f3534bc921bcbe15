// qkv demo: qkv's main job from start to end. Generates the synthetic
// Chinese -> Japanese corpus with a held-out split, trains the small
// Transformer of configs/transformer-zh-ja.json, scores it on the held-out
// sentences, and translates a few examples, among them 我是中国人.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

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
  int64_t steps = 0;  // 0: the config's
  int64_t train_pairs = 20000;
  int64_t test_pairs = 500;
  int threads = 0;
};

int run_demo(const DemoArgs& a) {
  QKV_CHECK(a.steps >= 0, "demo: --steps must be positive, got ", a.steps);
  QKV_CHECK(a.train_pairs > 0 && a.test_pairs > 0, "demo: --train-pairs and --test-pairs must be positive");
  set_threads(a.threads);
  auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  QKV_CHECK(std::filesystem::is_directory(a.out), "demo: cannot create the output folder ", a.out,
            ec ? ": " + ec.message() : "");
  const std::string train_path = a.out + "/zh-ja.train.tsv", test_path = a.out + "/zh-ja.test.tsv";
  const std::string model_dir = a.out + "/model";

  std::printf("qkv demo: Chinese -> Japanese translation with an encoder-decoder Transformer\n\n");
  std::printf("1. corpus: %lld training pairs and %lld held-out pairs from qkv's grammar (no sentence shared)\n",
              (long long)a.train_pairs, (long long)a.test_pairs);
  std::vector<SentencePair> train = synth_zh_ja(a.train_pairs, 1);
  std::vector<SentencePair> test = synth_zh_ja(a.test_pairs, 2, train);
  write_file_atomic(train_path, format_parallel_tsv(train));
  write_file_atomic(test_path, format_parallel_tsv(test));
  for (int i = 0; i < 3; ++i) std::printf("     %s\t%s\n", train[i].first.c_str(), train[i].second.c_str());

  std::string config_text = read_file(a.config);
  TrainOptions o = TrainOptions::from_json(config_text, a.config);
  if (a.steps > 0) {
    o.steps = a.steps;
    o.eval_every = std::min(o.eval_every, a.steps);
  }
  TranslationModel m = new_translation_model(config_text, a.config, train, o.seed);
  std::printf("\n2. training (%s), %lld steps, %d threads\n     %s\n", a.config.c_str(), (long long)o.steps,
              thread_count(), m.model->summary().c_str());
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
  cb.evaluated = [&](const EvalReport& r) {
    std::printf("%s     step %4lld: held-out loss %.4f  chrF %.2f  BLEU %.2f%s\n", tty ? "\n" : "", (long long)r.step,
                r.valid_loss, r.chrf, r.bleu, r.best ? "  (best so far, saved)" : "");
    std::fflush(stdout);
  };
  train_translation(m, train, test, o, model_dir, cb);

  std::printf("\n3. held-out evaluation of the saved model\n");
  TranslationModel best = load_translation_model(model_dir);
  TranslationScores s = score_translation(best, test, 128);
  std::printf("     chrF %.2f   BLEU (char) %.2f   exact match %.1f%% of %lld sentences\n", s.chrf, s.bleu,
              s.exact_match, (long long)s.sentences);

  std::printf("\n4. translations\n");
  std::vector<std::string> examples = {"我是中国人", "她的妈妈是医生吗", "我们明天在图书馆学习日语",
                                       "这本书很有意思", "他有三辆车"};
  std::vector<std::string> out = translate_texts(best, examples, 128);
  for (size_t i = 0; i < examples.size(); ++i) std::printf("     %s  ->  %s\n", examples[i].c_str(), out[i].c_str());
  const std::string picture = a.out + "/attention.svg";
  std::fflush(stdout);
  write_attention_map(best, examples[2], best.tokenizer->encode(examples[2]), picture, 128);

  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\ndone in %.0f s. Files:\n     %s, %s\n     %s/ (config.json, model.safetensors, tokenizer.json, "
              "trainer_state.json)\n     %s (cross-attention of \"%s\"; open it in a browser)\n",
              secs, train_path.c_str(), test_path.c_str(), model_dir.c_str(), picture.c_str(), examples[2].c_str());
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
  sub->add_option("--steps", args->steps, "Training steps (default: the recipe's)");
  sub->add_option("--train-pairs", args->train_pairs, "Training pairs to generate")->capture_default_str();
  sub->add_option("--test-pairs", args->test_pairs, "Held-out pairs to generate")->capture_default_str();
  sub->add_option("--threads", args->threads, "Threads (0: all cores)")->capture_default_str();
  return [args] { return run_demo(*args); };
}

}  // namespace qkv::cli
