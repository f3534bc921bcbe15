// Language-model training: the "train" options, a new model with its tokenizer, and
// language modelling as a task of the one training loop (src/train/loop.h).
#include "qkv/lm_trainer.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "qkv/checkpoint.h"
#include "qkv/optim.h"
#include "qkv/registry.h"
#include "qkv/utf8.h"
#include "src/config/fields.h"
#include "src/train/loop.h"

namespace qkv {

LmTrainOptions LmTrainOptions::from_json(const std::string& text, const std::string& source) {
  using O = LmTrainOptions;
  static const config::Fields<O> fields =
      add_loop_fields(config::Fields<O>("train.")
          .add("steps", &O::steps).at_least(1)
          .add("batch_size", &O::batch_size).at_least(1).at_most(config::limits::kBatch)
          .add("lr", &O::lr).positive()
          .add("warmup_steps", &O::warmup_steps).at_least(0)
          .add("weight_decay", &O::weight_decay).at_least(0)
          .add("clip_norm", &O::clip_norm).at_least(0)
          .add("seed", &O::seed)
          .add("eval_every", &O::eval_every).at_least(1));
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
  j.erase("tokenizer");
  j.erase("train");
  Rng rng(seed);
  m.model = std::dynamic_pointer_cast<DecoderLM>(find_family("decoder", source).build(j.dump(), source, rng));
  return m;
}

namespace {

// Language modelling as a task of the one loop: random windows of context + 1
// tokens (those of a step depend only on the seed and the step, so a resume
// draws the same), next-token loss plus MoE balancing, warmup then cosine,
// best model by validation loss.
class LanguageTask final : public TrainTask {
public:
  LanguageTask(LanguageModel& m, const std::vector<int64_t>& train, const std::vector<int64_t>& valid,
               const LmTrainOptions& o, const LmCallbacks& cb)
      : m_(m), train_(train), valid_(valid), o_(o), cb_(cb), context_(m.model->config().context),
        schedule_{.peak_lr = o.lr, .min_lr = o.lr * 0.1f, .warmup_steps = o.warmup_steps, .total_steps = o.steps} {
    QKV_CHECK((int64_t)train.size() >= context_ + 1, "train: the training text has ", train.size(),
              " tokens, fewer than one window of context + 1 = ", context_ + 1, " (a shorter context, or more text)");
    QKV_CHECK(valid.size() >= 2, "train: the validation text has fewer than 2 tokens");
  }

  Module& model() override { return *m_.model; }
  int64_t total_steps() const override { return o_.steps; }
  float lr_at(int64_t step) override { return schedule_.lr_at(step); }
  StepLoss step_loss(int64_t step, Shard shard) override {
    const int64_t C = context_, N = (int64_t)train_.size();
    const auto [first, last] = shard.range(o_.batch_size);  // this process's windows of the batch
    const int64_t B = last - first;
    if (B == 0) return {};
    Rng windows(o_.seed * 0x9e3779b97f4a7c15ull + (uint64_t)step);
    std::vector<int64_t> in, target;
    for (int64_t b = 0; b < last; ++b) {
      const int64_t s = (int64_t)windows.next_below((uint64_t)(N - C));
      if (b < first) continue;  // another process's window: drawn all the same
      in.insert(in.end(), train_.begin() + s, train_.begin() + s + C);
      target.insert(target.end(), train_.begin() + s + 1, train_.begin() + s + C + 1);
    }
    Tensor logits = m_.model->forward(Tensor::from_ints(in, {B, C})).reshape({B * C, -1});
    StepLoss l{cross_entropy(logits, Tensor::from_ints(target, {B * C})), 0, B * C};
    l.value = l.loss.item();
    if (Tensor aux = m_.model->aux_loss(); aux.defined()) l.loss = add(l.loss, aux);
    return l;
  }
  void progress(int64_t step, float loss, float lr, double rate, double eta, int64_t skipped) override {
    if (cb_.progress) cb_.progress({step, o_.steps, loss, lr, rate, eta, skipped});
  }
  bool validate_after(int64_t step) const override { return step % o_.eval_every == 0 || step == o_.steps; }
  Validation validate(int64_t step, float last_loss) override {
    report_ = {step, language_model_loss(*m_.model, valid_), 0, false};
    report_.perplexity = std::exp(report_.valid_loss);
    return {report_.valid_loss, {{"step", step}, {"train_loss", last_loss}, {"valid_loss", report_.valid_loss},
                                 {"perplexity", report_.perplexity}}};
  }
  nlohmann::ordered_json summary(int64_t step, double best, int64_t skipped,
                                 const nlohmann::json& history) const override {
    return {{"step", step}, {"steps", o_.steps}, {"best_valid_loss", best}, {"skipped_steps", skipped},
            {"history", history}};
  }
  bool validated(const Validation&, bool best) override {
    report_.best = best;
    if (cb_.evaluated) cb_.evaluated(report_);
    return false;
  }
  void save_best(const std::string& dir, const std::string& state) override {
    save_model_folder(dir, find_family("decoder", dir), *m_.model, m_.tokenizer.get(), state);
  }

  const char* state_format() const override { return "qkv-lm-trainer-state"; }
  const char* best_key() const override { return "best_loss"; }
  double worst_score() const override { return INFINITY; }
  bool better(double score, double best) const override { return score < best; }

private:
  LanguageModel& m_;
  const std::vector<int64_t>& train_;
  const std::vector<int64_t>& valid_;
  const LmTrainOptions& o_;
  const LmCallbacks& cb_;
  int64_t context_;
  WarmupCosine schedule_;
  LmEvalReport report_{};
};

}  // namespace

TrainOutcome train_language_model(LanguageModel& m, const std::vector<int64_t>& train, const std::vector<int64_t>& valid,
                          const LmTrainOptions& o, const std::string& out_dir, const LmCallbacks& cb,
                          ProcessGroup* group) {
  LanguageTask task(m, train, valid, o, cb);
  return run_training(task, loop_options(o, group), out_dir);
}

}  // namespace qkv
