// qkv data synth-zh-ja, qkv train, qkv translate, qkv eval: translation from the command line.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <cstdio>
#include <limits>
#include <iostream>
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "qkv/process_group.h"
#include "qkv/registry.h"
#include "qkv/train_run.h"
#include "qkv/trainer.h"
#include "qkv/utf8.h"
#include "src/config/fields.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {
namespace {

struct DataArgs {
  int64_t pairs = 0;
  uint64_t seed = 1;
  ZhJaTier tier = ZhJaTier::Easy;
  std::string out;
  std::string exclude;  // a TSV whose sentences must not appear (a held-out split)
  bool repeats = false;  // pairs as drawn (sample_zh_ja), not distinct ones
};

int run_synth(const DataArgs& a) {
  QKV_CHECK(a.pairs > 0, "data synth-zh-ja: --pairs must be positive, got ", a.pairs);
  std::vector<SentencePair> exclude;
  if (!a.exclude.empty()) exclude = read_parallel_tsv(a.exclude);
  std::vector<std::string> categories;
  const std::vector<SentencePair> pairs = a.repeats ? sample_zh_ja(a.pairs, a.seed, exclude, a.tier, &categories)
                                                    : synth_zh_ja(a.pairs, a.seed, exclude, a.tier, &categories);
  // The hard tier says what each pair tests, for qkv eval's scores per category.
  const std::string text =
      a.tier == ZhJaTier::Hard ? format_parallel_tsv(pairs, categories) : format_parallel_tsv(pairs);
  if (a.out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    write_file_atomic(a.out, text);
    std::printf("wrote %lld pairs to %s\n", (long long)a.pairs, a.out.c_str());
  }
  return 0;
}

void show_translation_progress(const TrainProgress& p) {
  char stats[128];
  std::snprintf(stats, sizeof stats, "loss %.3f  %.0f tok/s  lr %.2e", p.loss, p.tokens_per_second, p.lr);
  print_progress(p.step, p.total_steps, "step " + std::to_string(p.step) + "/" + std::to_string(p.total_steps), stats,
                 p.eta_seconds, p.skipped_steps);
}

// --config auto: the recipe for the training data, said and saved beside the model.
std::string auto_config(const TrainArgs& a) {
  QKV_CHECK(!a.resume, "train: --config auto cannot --resume; pass the recipe it saved, --config ", a.out,
            "/recipe.json");
  TranslationRecipe r = translation_recipe(read_parallel_tsv(a.train, {.replace_invalid_utf8 = a.replace_invalid}));
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (process_group() && process_group()->rank() != 0) return r.config_json;  // rank 0 saves and says it
  write_file_atomic(a.out + "/recipe.json", r.config_json);
  std::printf("qkv train --config auto: a recipe for %s\n", a.train.c_str());
  for (const std::string& why : r.reasons) std::printf("  %s\n", why.c_str());
  std::printf("  (saved as %s/recipe.json: edit it and pass it as --config to change anything)\n", a.out.c_str());
  return r.config_json;
}

int run_train(const TrainArgs& a) {
  set_threads(a.threads);
  QKV_CHECK(!a.config.empty() || !a.init.empty(),
            "train: --config is required (or --init DIR to fine-tune a model folder)");
  QKV_CHECK(a.init.empty() || a.config != "auto", "train: --config auto makes a new model; --init takes its model "
            "from ", a.init, " (pass a config with only a \"train\" section, or none)");
  TrainRun run{.config_text = a.config.empty() ? "{}" : a.config == "auto" ? auto_config(a) : read_file(a.config),
               .config_source = a.config.empty() ? "(the default train section)" : a.config, .train = a.train,
               .valid = a.valid, .out = a.out, .resume = a.resume, .init = a.init,
               .replace_invalid_utf8 = a.replace_invalid, .group = process_group()};
  // A flag not given is 0 (-1 for the seed): the config's value stays.
  if (a.steps > 0) run.steps = a.steps;
  if (a.epochs > 0) run.epochs = a.epochs;
  if (a.batch_tokens > 0) run.batch_tokens = a.batch_tokens;
  if (a.lr > 0) run.lr = a.lr;
  if (a.seed >= 0) run.seed = a.seed;
  if (!a.precision.empty()) run.precision = a.precision == "bf16" ? Precision::Bf16 : Precision::F32;
  TrainHooks hooks;
  hooks.starting = [](const std::string& what) { std::printf("qkv train: %s\n", what.c_str()); };
  hooks.translation.progress = show_translation_progress;
  hooks.translation.evaluated = [](const EvalReport& r) {
    std::printf("%sstep %lld: valid loss %.4f  chrF %.2f  BLEU %.2f%s\n", isatty(STDOUT_FILENO) ? "\n" : "",
                (long long)r.step, r.valid_loss, r.chrf, r.bleu, r.best ? "  (best, saved)" : "");
    std::fflush(stdout);
  };
  hooks.language = lm_train_printers();
  hooks.vision = vit_train_printers();
  const TrainOutcome outcome = train_from_config(run, hooks);
  if (!run.group || run.group->rank() == 0) print_train_end(outcome, a.out);
  return 0;
}

// --beam and --max-len: 0 when not given (translation_decoding: the
// folder's generation_config.json, else greedy and 128 tokens).
struct TranslateArgs {
  std::string model;
  int64_t max_len = 0;
  int64_t beam = 0;
  SourceLimit source_limit;
  bool replace_invalid = false;
  std::string attention_map;  // SVG of the first sentence's cross-attention
  std::string dtype;
};

int run_translate(const TranslateArgs& a) {
  TranslationModel m = load_translation_model(a.model, "translate", a.dtype);
  const TranslationDecoding d = translation_decoding(m, a.beam, a.max_len);
  std::string line;
  int64_t number = 0;
  std::vector<std::vector<int64_t>> batch;
  auto flush = [&] {
    for (auto& t : translate_ids(m, batch, d.max_len, d.beam)) std::cout << t << "\n";
    std::cout.flush();
    batch.clear();
  };
  bool first = true;
  while (std::getline(std::cin, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (size_t bad = invalid_utf8_offset(line); bad != std::string::npos) {
      QKV_CHECK(a.replace_invalid, "translate: stdin line ", number, ": invalid UTF-8 at byte ", bad + 1,
                " (use --replace-invalid-utf8 to replace it with U+FFFD)");
      line = replace_invalid_utf8(line);
    }
    const std::string where = "translate: stdin line " + std::to_string(number);
    bool cut = false;
    batch.push_back(encode_source(m, line, a.source_limit, where, &cut));
    if (cut)
      std::fprintf(stderr, "qkv: %s: source cut to %lld tokens (--truncate-source)\n", where.c_str(),
                   (long long)batch.back().size());
    if (first && !a.attention_map.empty()) write_attention_map(m, line, batch.back(), a.attention_map, d.max_len);
    first = false;
    if (batch.size() == 64) flush();
  }
  flush();
  return 0;
}

struct EvalArgs {
  std::string model, test;
  int64_t max_len = 0;  // 0: as TranslateArgs
  int64_t beam = 0;
  SourceLimit source_limit;
  bool json = false;
  int64_t bootstrap = 1000;  // resamples for the 95% intervals (0: none)
  std::string dtype;
};

int run_eval(const EvalArgs& a) {
  const Family& family = family_for_task(a.model, Task::Eval, "eval");
  if (family.domain == Domain::Vision) return run_vit_eval(a.model, a.test, a.json, a.dtype);
  if (family.domain == Domain::Language) return run_lm_eval(a.model, a.test, a.json, a.dtype);
  TranslationModel m = load_translation_model(a.model, "eval", a.dtype);
  const TranslationDecoding d = translation_decoding(m, a.beam, a.max_len);
  std::vector<int64_t> lines;
  std::vector<std::string> categories;
  const std::vector<SentencePair> pairs =
      read_parallel_tsv(a.test, {.line_numbers = &lines, .categories = &categories});
  std::vector<std::vector<int64_t>> sources;
  std::vector<std::string> refs;
  int64_t cut_count = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    bool cut = false;
    sources.push_back(encode_source(m, pairs[i].first, a.source_limit, "eval: " + a.test + ":" + std::to_string(lines[i]), &cut));
    refs.push_back(pairs[i].second);
    cut_count += cut;
  }
  if (cut_count > 0)
    std::fprintf(stderr, "qkv: eval: %lld sources cut to %lld tokens (--truncate-source)\n", (long long)cut_count,
                 (long long)source_token_limit(m, a.source_limit));
  TranslationScores s = score_translation(m, sources, refs, d.max_len, d.beam, a.bootstrap);
  const CorpusConfidence& c = s.confidence;
  nlohmann::ordered_json r = {{"bleu", s.bleu},           {"chrf", s.chrf}, {"exact_match", s.exact_match},
                              {"sentences", s.sentences}, {"beam", d.beam}, {"bleu_tokenize", "char"}};
  if (c.resamples > 0) {
    r["bleu_ci95"] = {c.bleu.low, c.bleu.high};
    r["chrf_ci95"] = {c.chrf.low, c.chrf.high};
    r["bootstrap_resamples"] = c.resamples;
  }
  const std::vector<CategoryScores> by_category = scores_by_category(s.hypotheses, refs, categories, a.bootstrap);
  for (const CategoryScores& k : by_category) {
    r["categories"][k.name] = {{"chrf", k.chrf}, {"bleu", k.bleu}, {"exact_match", k.exact_match},
                               {"sentences", k.sentences}};
    if (c.resamples > 0) r["categories"][k.name]["chrf_ci95"] = {k.chrf_interval.low, k.chrf_interval.high};
  }
  if (a.json) {
    std::cout << r.dump() << "\n";
    return 0;
  }
  std::printf("%s on %s (%lld sentences, beam %lld)\n", a.model.c_str(), a.test.c_str(), (long long)s.sentences,
              (long long)d.beam);
  auto line = [&](const char* name, double score, const BootstrapInterval& ci) {
    std::printf("  %-11s %6.2f", name, score);
    if (c.resamples > 0) std::printf("   95%% interval %.2f - %.2f", ci.low, ci.high);
    std::printf("\n");
  };
  line("BLEU (char)", s.bleu, c.bleu);
  line("chrF", s.chrf, c.chrf);
  std::printf("  exact match %6.2f%%\n", s.exact_match);
  if (!by_category.empty()) {
    std::printf("  by category        chrF%s   exact match  sentences\n", c.resamples > 0 ? "   95% interval" : "");
    for (const CategoryScores& k : by_category) {
      std::printf("    %-14s %6.2f", k.name.c_str(), k.chrf);
      if (c.resamples > 0) std::printf("   %6.2f - %6.2f", k.chrf_interval.low, k.chrf_interval.high);
      std::printf("   %8.2f%%  %9lld\n", k.exact_match, (long long)k.sentences);
    }
  }
  if (c.resamples > 0)
    std::printf("  (intervals: %lld bootstrap resamples of the sentences scored, as sacreBLEU --confidence)\n",
                (long long)c.resamples);
  return 0;
}

}  // namespace

void write_attention_map(TranslationModel& m, const std::string& source, const std::vector<int64_t>& src,
                         const std::string& path, int64_t max_len) {
  AlignedTranslation a = translate_with_attention(*m.model, src, max_len, m.generation.rules);
  std::vector<std::string> rows = m.tokenizer->target().pieces(a.tokens), cols = m.tokenizer->pieces(src);
  if (cols.empty()) cols.push_back("");
  std::string title = source + "  ->  " + m.tokenizer->target().decode(a.tokens) + "\n" + m.model->attention_name();
  write_file_atomic(path, attention_svg(rows, cols, a.weights, title));
  std::fprintf(stderr, "attention map of \"%s\" written to %s\n", source.c_str(), path.c_str());
}

Run add_data(CLI::App& app) {
  auto args = std::make_shared<DataArgs>();
  CLI::App* data = app.add_subcommand("data", "Make data sets");
  data->require_subcommand(1);
  CLI::App* sub = data->add_subcommand("synth-zh-ja", "Seeded synthetic Chinese -> Japanese pairs (source<TAB>target)");
  sub->add_option("--pairs", args->pairs, "Number of pairs (distinct ones unless --repeats)")->required();
  sub->add_option("--seed", args->seed, "Seed")->capture_default_str();
  sub->add_option("--out", args->out, "Output file (default: stdout)");
  sub->add_option("--exclude", args->exclude, "A TSV file whose sentences must not appear (for a held-out split)");
  sub->add_flag("--repeats", args->repeats,
                "Keep repeated sentences: each comes as often as the grammar draws it (the demo's training data)");
  sub->add_option("--tier", args->tier,
                  "easy: the demo's grammar; hard: relative clauses, time and place in both orders, counters to 99, "
                  "comparatives, aspect, minimal pairs, names and figures to copy (a third column names each "
                  "pair's category)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, ZhJaTier>{{"easy", ZhJaTier::Easy},
                                                                          {"hard", ZhJaTier::Hard}}))
      ->capture_default_str();
  return [args] { return run_synth(*args); };
}

Run add_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand(
      "train", "Train a model from a config: translation on tab-separated parallel text, a vit on IDX images, "
               "a decoder language model on plain text");
  sub->add_option("--config", args->config,
                  "Model and training config (JSON), e.g. configs/transformer-zh-ja.json, configs/vit-fashion-mnist.json; "
                  "'auto' chooses a translation recipe from the training data (docs/training.md); with --init, only "
                  "a \"train\" section (optional: the defaults and the flags below)");
  sub->add_option("--init", args->init,
                  "Fine-tune: start from this model folder (qkv or Hugging Face): its architecture, weights and "
                  "tokenizer, Linear weights in float32; the result is a qkv model folder");
  sub->add_option("--train", args->train,
                  "Training pairs, source<TAB>target per line; for vit a folder of IDX files (train-images-idx3-ubyte[.gz], "
                  "train-labels-idx1-ubyte[.gz]); for decoder a UTF-8 text file (documents separated by blank lines)")
      ->required();
  sub->add_option("--valid", args->valid,
                  "Validation pairs (default: the last 5% of --train); for vit the folder of the t10k test files "
                  "(default: --train); for decoder a text file (default: the last 5% of --train's tokens)");
  sub->add_option("--out", args->out, "Model folder to write")->required();
  // A value given is checked here; one not given (0, or -1 for the seed) keeps the config's.
  const CLI::Validator positive_finite(
      [](std::string& text) -> std::string {
        double v = 0;
        if (CLI::detail::lexical_cast(text, v) && std::isfinite(v) && v > 0) return "";
        return "expected a positive finite number, found " + text;
      },
      "POSITIVE");
  const int64_t most = std::numeric_limits<int64_t>::max();
  sub->add_option("--steps", args->steps, "Training steps (overrides the config)")->check(CLI::Range(int64_t{1}, most));
  sub->add_option("--epochs", args->epochs, "vit: epochs (overrides the config)")->check(CLI::Range(int64_t{1}, most));
  sub->add_option("--batch-tokens", args->batch_tokens, "Tokens per batch (overrides the config)")
      ->check(CLI::Range(int64_t{1}, config::limits::kBatch));
  sub->add_option("--lr", args->lr, "Peak learning rate (overrides the config)")->check(positive_finite);
  sub->add_option("--seed", args->seed, "Seed (overrides the config)")->check(CLI::Range(int64_t{0}, most));
  sub->add_option("--precision", args->precision,
                  "f32, or bf16: mixed precision, linear layers on bfloat16 operands with float32 sums, weights "
                  "and optimizer state (overrides the config; docs/low-precision.md)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_option("--threads", args->threads,
                  "Threads (0: all cores; under mpirun, each process takes its share of this machine's)");
  sub->add_flag("--replace-invalid-utf8", args->replace_invalid, "Replace invalid UTF-8 by U+FFFD instead of failing");
  sub->add_flag("--resume", args->resume,
                "Continue the run saved in --out exactly (weights, optimizer, step, RNG streams, data order)");
  return [args] { return run_train(*args); };
}

// translate's and eval's --max-len, --beam (0 when not given:
// translation_decoding), --max-source-len and --truncate-source.
void add_decoding_options(CLI::App* sub, int64_t& max_len, int64_t& beam, SourceLimit& source_limit) {
  sub->add_option("--max-len", max_len,
                  "Longest output in tokens (default: the folder's generation_config.json, else 128)")
      ->check(CLI::Range(int64_t{1}, kMaxDecodeLength));
  sub->add_option("--beam", beam,
                  "Beam size, 1: greedy (default: the folder's generation_config.json num_beams, else 1; its "
                  "length_penalty and early_stopping rank and stop the search)")
      ->check(CLI::Range(1, 64));
  sub->add_option("--max-source-len", source_limit.max_tokens,
                  "Longest source in tokens (default: the model's learned positions, else 1024); a longer one is an "
                  "error naming its line");
  sub->add_flag("--truncate-source", source_limit.truncate, "Cut a longer source to --max-source-len instead");
}

Run add_translate(CLI::App& app) {
  auto args = std::make_shared<TranslateArgs>();
  CLI::App* sub =
      app.add_subcommand("translate", "Translate stdin lines to stdout lines (greedy, or beam search with --beam)");
  sub->add_option("--model", args->model, "Model folder")->required();
  add_decoding_options(sub, args->max_len, args->beam, args->source_limit);
  sub->add_flag("--replace-invalid-utf8", args->replace_invalid, "Replace invalid UTF-8 by U+FFFD instead of failing");
  sub->add_option("--attention-map", args->attention_map,
                  "Write the first sentence's cross-attention (last decoder layer, mean over heads) as SVG");
  add_dtype_option(sub, args->dtype);
  return [args] { return run_translate(*args); };
}

Run add_eval(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand(
      "eval", "Score a model on a test set: BLEU (char), chrF, exact match; for vit accuracy and a confusion matrix; "
              "for a decoder the loss and perplexity of a text file");
  sub->add_option("--model", args->model, "Model folder")->required();
  sub->add_option("--test", args->test,
                  "Test pairs, source<TAB>target per line; for vit a folder with t10k-images-idx3-ubyte[.gz] and "
                  "t10k-labels-idx1-ubyte[.gz]; for a decoder a text file (documents separated by blank lines)")
      ->required();
  add_decoding_options(sub, args->max_len, args->beam, args->source_limit);
  sub->add_flag("--json", args->json,
                "Print one JSON object (scores on a 0-100 scale; vit: accuracy in 0..1; decoder: loss, perplexity)");
  sub->add_option("--bootstrap", args->bootstrap,
                  "Translation: resamples for the 95% intervals of BLEU and chrF (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  add_dtype_option(sub, args->dtype);
  return [args] { return run_eval(*args); };
}

}  // namespace qkv::cli
