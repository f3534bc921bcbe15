// Translation training: the "train" options, and translation as a task of the
// one training loop (src/train/loop.h): token-budget batches, label smoothing,
// warmup then inverse square root or cosine, validation loss, chrF and BLEU.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "qkv/checkpoint.h"
#include "qkv/io.h"
#include "qkv/optim.h"
#include "qkv/trainer.h"
#include "src/config/fields.h"
#include "src/train/loop.h"
#include "src/train/train_state.h"

template <>
struct qkv::config::EnumNames<qkv::LrSchedule> {
  static constexpr std::pair<LrSchedule, const char*> values[] = {{LrSchedule::InverseSqrt, "inverse_sqrt"},
                                                                  {LrSchedule::Cosine, "cosine"}};
};

namespace qkv {

TrainOptions TrainOptions::from_json(const std::string& text, const std::string& source) {
  using O = TrainOptions;
  static const config::Fields<O> fields =
      add_loop_fields(config::Fields<O>("train.")
          .add("steps", &O::steps).at_least(1)
          .add("batch_tokens", &O::batch_tokens).at_least(1).at_most(config::limits::kBatch)
          .add("lr", &O::lr).positive()
          .add("warmup_steps", &O::warmup_steps).at_least(0)
          .add("schedule", &O::schedule)
          .add("weight_decay", &O::weight_decay).at_least(0)
          .add("clip_norm", &O::clip_norm).at_least(0)
          .add("label_smoothing", &O::label_smoothing).fraction()
          .add("seed", &O::seed)
          .add("eval_every", &O::eval_every).at_least(1)
          .add("eval_sentences", &O::eval_sentences).at_least(0));
  return config::read_train_section(fields, text, source);
}

static std::vector<EncodedPair> encode_all(const TranslationModel& m, const std::vector<SentencePair>& pairs) {
  const DecodingIds ids = m.model->decoding_ids();
  std::vector<EncodedPair> out;
  for (auto& [s, t] : pairs) out.push_back({ids.source(m.tokenizer->encode(s)), m.tokenizer->target().encode(t)});
  return out;
}

static EvalReport evaluate(TranslationModel& m, const std::vector<EncodedPair>& valid,
                           const std::vector<SentencePair>& valid_text, const TrainOptions& o) {
  NoGradGuard no_grad;
  m.model->eval();
  EvalReport r{};
  double loss_sum = 0;
  int64_t tokens = 0;
  Rng order(0);
  for (auto& idx : make_batches(valid, o.batch_tokens, order)) {
    Batch b = collate(valid, idx, m.model->decoding_ids());
    loss_sum += translation_loss(*m.model, b, 0.0f).item() * b.target_tokens;
    tokens += b.target_tokens;
  }
  r.valid_loss = tokens ? loss_sum / tokens : 0;
  const size_t n = std::min<size_t>(valid_text.size(), (size_t)std::max<int64_t>(o.eval_sentences, 0));
  // Validation translates what training takes: sources up to batch_tokens
  // (and the model's learned positions); a longer one is cut, never an error mid-run.
  const int64_t own = m.model->max_source_len();
  const SourceLimit limit{.max_tokens = own > 0 ? std::min(own, o.batch_tokens) : o.batch_tokens, .truncate = true};
  TranslationScores scores = score_translation(m, {valid_text.begin(), valid_text.begin() + n}, 128, 1, limit);
  r.chrf = scores.chrf;
  r.bleu = scores.bleu;
  m.model->train();
  return r;
}

namespace {

// Translation as a task of the one loop: token-budget batches in an order
// drawn per epoch (saved, so a resume continues it), label-smoothed loss,
// warmup then inverse square root or cosine, best model by validation chrF.
class TranslationTask final : public TrainTask {
public:
  TranslationTask(TranslationModel& m, const std::vector<SentencePair>& train, const std::vector<SentencePair>& valid,
                  const TrainOptions& o, const TrainCallbacks& cb)
      : m_(m), valid_(valid), o_(o), cb_(cb), data_rng_(o.seed ^ 0xda7a),
        inv_{.peak_lr = o.lr, .warmup_steps = o.warmup_steps},
        cosine_{.peak_lr = o.lr, .min_lr = o.lr * 0.01f, .warmup_steps = o.warmup_steps, .total_steps = o.steps} {
    train_ids_ = encode_all(m, train);
    valid_ids_ = encode_all(m, valid);
    for (auto& p : train_ids_)
      QKV_CHECK((int64_t)std::max(p.src.size(), p.tgt.size() + 1) <= o.batch_tokens, "train: a sentence of ",
                std::max(p.src.size(), p.tgt.size() + 1), " tokens does not fit batch_tokens ", o.batch_tokens);
  }

  Module& model() override { return *m_.model; }
  int64_t total_steps() const override { return o_.steps; }
  float lr_at(int64_t step) override {
    return o_.schedule == LrSchedule::Cosine ? cosine_.lr_at(step) : inv_.lr_at(step);
  }
  StepLoss step_loss(int64_t step, Shard shard) override {
    if (next_batch_ == (int64_t)batches_.size()) {
      batches_ = make_batches(train_ids_, o_.batch_tokens, data_rng_);
      next_batch_ = 0;
    }
    const std::vector<int64_t>& batch = batches_[next_batch_++];
    const auto [first, last] = shard.range((int64_t)batch.size());  // this process's sentences of it
    if (first == last) return {};
    Batch b = collate(train_ids_, {batch.begin() + first, batch.begin() + last}, m_.model->decoding_ids());
    StepLoss l{translation_loss(*m_.model, b, o_.label_smoothing), 0, b.target_tokens};
    l.value = l.loss.item();
    if (cb_.inject_nonfinite && cb_.inject_nonfinite(step)) l.value = NAN;
    return l;
  }
  void progress(int64_t step, float loss, float lr, double rate, double eta, int64_t skipped) override {
    if (cb_.progress) cb_.progress({step, o_.steps, loss, lr, rate, eta, skipped});
  }
  bool validate_after(int64_t step) const override { return step % o_.eval_every == 0 || step == o_.steps; }
  Validation validate(int64_t step, float last_loss) override {
    report_ = evaluate(m_, valid_ids_, valid_, o_);
    report_.step = step;
    return {.score = report_.chrf,
            .history = {{"step", step}, {"train_loss", last_loss}, {"valid_loss", report_.valid_loss},
                        {"chrf", report_.chrf}, {"bleu", report_.bleu}},
            .tiebreak = -report_.valid_loss};
  }
  nlohmann::ordered_json summary(int64_t step, double best, int64_t skipped,
                                 const nlohmann::json& history) const override {
    return {{"step", step}, {"steps", o_.steps}, {"best_chrf", best}, {"skipped_steps", skipped}, {"history", history}};
  }
  bool validated(const Validation&, bool best) override {
    report_.best = best;
    if (cb_.evaluated) cb_.evaluated(report_);
    return cb_.stop && cb_.stop(report_);
  }
  void save_best(const std::string& dir, const std::string& state) override {
    save_model_folder(dir, family_of_config(m_.model->config_json(), dir), *m_.model, m_.tokenizer.get(), state);
  }

  const char* state_format() const override { return "qkv-trainer-state"; }
  const char* best_key() const override { return "best_chrf"; }
  double worst_score() const override { return -1; }
  bool better(double score, double best) const override { return score > best; }
  void save_extra(std::vector<std::pair<std::string, Tensor>>& t, std::map<std::string, std::string>&) const override {
    t.emplace_back("rng.data", rng_tensor(data_rng_));
    std::vector<int64_t> indices, offsets{0};
    for (auto& b : batches_) {
      indices.insert(indices.end(), b.begin(), b.end());
      offsets.push_back((int64_t)indices.size());
    }
    t.emplace_back("data.indices", Tensor::from_ints(indices, {(int64_t)indices.size()}));
    t.emplace_back("data.offsets", Tensor::from_ints(offsets, {(int64_t)offsets.size()}));
    t.emplace_back("data.next_batch", Tensor::from_ints({next_batch_}, {1}));
  }
  void restore_extra(const TrainerStateFile& state, int64_t) override {
    state.rng("rng.data", data_rng_);
    const std::vector<int64_t> indices = state.ints("data.indices"), offsets = state.ints("data.offsets");
    const int64_t n = (int64_t)train_ids_.size();
    QKV_CHECK(!offsets.empty() && offsets.front() == 0 && offsets.back() == (int64_t)indices.size() &&
                  std::is_sorted(offsets.begin(), offsets.end()),
              state.path(), ": 'data.offsets' do not split 'data.indices' into batches; cannot resume");
    for (int64_t i : indices)
      QKV_CHECK(i >= 0 && i < n, state.path(),
                ": the saved data order does not fit this training set; resume with the same --train");
    batches_.clear();
    for (size_t b = 0; b + 1 < offsets.size(); ++b)
      batches_.emplace_back(indices.begin() + offsets[b], indices.begin() + offsets[b + 1]);
    next_batch_ = state.integer("data.next_batch", 0, (int64_t)batches_.size());
  }

private:
  TranslationModel& m_;
  const std::vector<SentencePair>& valid_;
  const TrainOptions& o_;
  const TrainCallbacks& cb_;
  std::vector<EncodedPair> train_ids_, valid_ids_;
  Rng data_rng_;
  WarmupInverseSqrt inv_;
  WarmupCosine cosine_;
  std::vector<std::vector<int64_t>> batches_;  // this epoch's order
  int64_t next_batch_ = 0;
  EvalReport report_{};
};

}  // namespace

TrainOutcome train_translation(TranslationModel& m, const std::vector<SentencePair>& train,
                       const std::vector<SentencePair>& valid, const TrainOptions& o, const std::string& out_dir,
                       const TrainCallbacks& cb, ProcessGroup* group) {
  QKV_CHECK(o.steps > 0, "train: steps must be positive, got ", o.steps);
  QKV_CHECK(o.batch_tokens > 0, "train: batch_tokens must be positive");
  TranslationTask task(m, train, valid, o, cb);
  return run_training(task, loop_options(o, group), out_dir);
}

TranslationModel new_translation_model(const std::string& config_text, const std::string& source,
                                       const std::vector<SentencePair>& train, uint64_t seed) {
  nlohmann::json j = parse_json(config_text, source);
  TokenizerConfig tokenizer;
  if (j.is_object()) {
    QKV_CHECK(!j.contains("source_vocab_size"), source,
              ": source_vocab_size is for imported models with a vocabulary "
              "for each side (Marian's); qkv trains one vocabulary for both");
    j.erase("train");
    if (j.contains("tokenizer")) tokenizer = TokenizerConfig::from_json(j["tokenizer"].dump(), source);
    j.erase("tokenizer");
  }
  TranslationModel m;
  std::vector<std::string> texts;  // one vocabulary for both sides
  for (auto& [s, t] : train) texts.push_back(s), texts.push_back(t);
  m.tokenizer = train_tokenizer(tokenizer, texts);
  Rng rng(seed);
  m.model = make_seq2seq(j.dump(), source, m.tokenizer->size(), rng);
  return m;
}



}  // namespace qkv
