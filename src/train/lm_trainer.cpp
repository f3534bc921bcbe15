// Training decoder-only language models, their folder, and sampling text.
#include "qkv/lm_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>

#include "qkv/checkpoint.h"
#include "qkv/io.h"
#include "qkv/optim.h"
#include "qkv/utf8.h"
#include "src/config/fields.h"
#include "src/train/train_state.h"

namespace qkv {

LmTrainOptions LmTrainOptions::from_json(const std::string& text, const std::string& source) {
  using O = LmTrainOptions;
  static const config::Fields<O> fields = config::Fields<O>("train.")
                                              .add("steps", &O::steps).at_least(1)
                                              .add("batch_size", &O::batch_size).at_least(1)
                                              .add("lr", &O::lr).positive()
                                              .add("warmup_steps", &O::warmup_steps).at_least(0)
                                              .add("weight_decay", &O::weight_decay).at_least(0)
                                              .add("clip_norm", &O::clip_norm).at_least(0)
                                              .add("seed", &O::seed)
                                              .add("eval_every", &O::eval_every).at_least(1);
  return config::read_train_section(fields, text, source);
}


LanguageModel new_language_model(const std::string& config_text, const std::string& source,
                                 const std::string& train_text, uint64_t seed) {
  nlohmann::json j = parse_json(config_text, source);
  QKV_CHECK(j.is_object(), source, ": expected a JSON object");
  TokenizerConfig tc;
  tc.type = TokenizerKind::Bytes;
  if (j.contains("tokenizer")) tc = TokenizerConfig::from_json(j["tokenizer"].dump(), source);
  std::vector<std::string> lines;
  std::istringstream in(train_text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  QKV_CHECK(!lines.empty(), source, ": the training text is empty");
  LanguageModel m;
  m.tokenizer = train_tokenizer(tc, lines);
  j["vocab_size"] = m.tokenizer->size();
  Rng rng(seed);
  m.model = std::make_shared<DecoderLM>(DecoderConfig::from_json(j.dump(), source), rng);
  return m;
}




static void save_language_model(const LanguageModel& m, const std::string& dir, const std::string& state) {
  save_model_folder(dir, find_family("decoder", dir), *m.model, m.tokenizer.get(), state);
}

void train_language_model(LanguageModel& m, const std::vector<int64_t>& train, const std::vector<int64_t>& valid,
                          const LmTrainOptions& o, const std::string& out_dir, const LmCallbacks& cb) {
  DecoderLM& model = *m.model;
  const int64_t C = model.config().context, N = (int64_t)train.size();
  QKV_CHECK(N >= C + 1, "train: the training text has ", N, " tokens, fewer than one window of context + 1 = ",
            C + 1, " (a shorter context, or more text)");
  QKV_CHECK(valid.size() >= 2, "train: the validation text has fewer than 2 tokens");
  model.train();
  AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  WarmupCosine schedule{.peak_lr = o.lr, .min_lr = o.lr * 0.1f, .warmup_steps = o.warmup_steps, .total_steps = o.steps};
  const std::string state_path = out_dir + "/trainer_state.safetensors";
  int64_t step = 0, skipped = 0;
  double best = INFINITY;
  nlohmann::json history = nlohmann::json::array();
  if (o.resume) {
    SafetensorsFile f = load_safetensors(state_path);
    QKV_CHECK(f.metadata.count("format") && f.metadata.at("format") == "qkv-lm-trainer-state", state_path,
              ": not a qkv language-model trainer state");
    restore_training_state(f, state_path, model, opt);
    step = checkpoint_tensor(f, state_path, "step").to_ints()[0];
    skipped = checkpoint_tensor(f, state_path, "skipped").to_ints()[0];
    best = std::stod(f.metadata.count("best_loss") ? f.metadata.at("best_loss") : "inf");
    if (f.metadata.count("history")) history = nlohmann::json::parse(f.metadata.at("history"));
    QKV_CHECK(step < o.steps, "train --resume: the checkpoint is at step ", step, ", nothing to do for ", o.steps,
              " steps");
  }
  auto start = std::chrono::steady_clock::now();
  const int64_t first_step = step + 1;
  SkipCounter skips{.total = skipped, .max_in_a_row = o.max_skipped_in_a_row};
  int64_t tokens_seen = 0;
  for (step = first_step; step <= o.steps; ++step) {
    // The windows of step s depend only on (seed, s): a resumed run draws the same ones.
    Rng windows(o.seed * 0x9e3779b97f4a7c15ull + (uint64_t)step);
    std::vector<int64_t> in, target;
    for (int64_t b = 0; b < o.batch_size; ++b) {
      const int64_t s = (int64_t)windows.next_below((uint64_t)(N - C));
      in.insert(in.end(), train.begin() + s, train.begin() + s + C);
      target.insert(target.end(), train.begin() + s + 1, train.begin() + s + C + 1);
    }
    const float lr = schedule.lr_at(step);
    opt.set_lr(lr);
    opt.zero_grad();
    Tensor logits = model.forward(Tensor::from_ints(in, {o.batch_size, C})).reshape({o.batch_size * C, -1});
    Tensor loss = cross_entropy(logits, Tensor::from_ints(target, {o.batch_size * C}));
    const float value = loss.item();
    if (Tensor aux = model.aux_loss(); aux.defined()) loss = add(loss, aux);
    if (step_if_finite(loss, value, model, opt, o.clip_norm, skips, step, out_dir)) {
      tokens_seen += o.batch_size * C;
      if (cb.progress) {
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        double done = (double)(step - first_step + 1);
        cb.progress({step, o.steps, value, lr, tokens_seen / std::max(secs, 1e-9), secs / done * (o.steps - step),
                     skips.total});
      }
    }
    if (step % o.eval_every == 0 || step == o.steps) {
      LmEvalReport r{step, language_model_loss(model, valid), 0, false};
      r.perplexity = std::exp(r.valid_loss);
      r.best = r.valid_loss < best;
      history.push_back({{"step", step}, {"train_loss", value}, {"valid_loss", r.valid_loss},
                         {"perplexity", r.perplexity}});
      nlohmann::ordered_json state = {{"step", step},
                                      {"steps", o.steps},
                                      {"best_valid_loss", std::min(best, r.valid_loss)},
                                      {"skipped_steps", skips.total},
                                      {"history", history}};
      if (r.best) {
        best = r.valid_loss;
        save_language_model(m, out_dir, state.dump(2) + "\n");
      } else {
        write_file_atomic(out_dir + "/trainer_state.json", state.dump(2) + "\n");
      }
      save_trainer_state(state_path, model, opt, step, skips.total, {},
                         {{"format", "qkv-lm-trainer-state"}, {"best_loss", exact_text(best)},
                          {"history", history.dump()}});
      if (cb.evaluated) cb.evaluated(r);
    }
  }
}

}  // namespace qkv
