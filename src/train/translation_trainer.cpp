// The translation training loop: AdamW, warmup + inverse square root or
// cosine schedule, gradient clipping, label smoothing, skipped non-finite
// steps, periodic validation (loss, chrF, BLEU), best checkpoint kept.
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "qkv/checkpoint.h"
#include "qkv/io.h"
#include "qkv/optim.h"
#include "qkv/trainer.h"
#include "src/config/fields.h"
#include "src/train/train_state.h"

namespace qkv {

}  // namespace qkv

template <>
struct qkv::config::EnumNames<qkv::LrSchedule> {
  static constexpr std::pair<LrSchedule, const char*> values[] = {{LrSchedule::InverseSqrt, "inverse_sqrt"},
                                                                  {LrSchedule::Cosine, "cosine"}};
};

namespace qkv {

TrainOptions TrainOptions::from_json(const std::string& text, const std::string& source) {
  using O = TrainOptions;
  static const config::Fields<O> fields = config::Fields<O>("train.")
                                              .add("steps", &O::steps).at_least(1)
                                              .add("batch_tokens", &O::batch_tokens).at_least(1)
                                              .add("lr", &O::lr).positive()
                                              .add("warmup_steps", &O::warmup_steps).at_least(0)
                                              .add("schedule", &O::schedule)
                                              .add("weight_decay", &O::weight_decay).at_least(0)
                                              .add("clip_norm", &O::clip_norm).at_least(0)
                                              .add("label_smoothing", &O::label_smoothing).fraction()
                                              .add("seed", &O::seed)
                                              .add("eval_every", &O::eval_every).at_least(1)
                                              .add("eval_sentences", &O::eval_sentences).at_least(0);
  return config::read_train_section(fields, text, source);
}

static std::vector<EncodedPair> encode_all(const Tokenizer& tok, const std::vector<SentencePair>& pairs) {
  std::vector<EncodedPair> out;
  for (auto& [s, t] : pairs) out.push_back({tok.encode(s), tok.encode(t)});
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
    Batch b = collate(valid, idx);
    loss_sum += translation_loss(*m.model, b, 0.0f).item() * b.target_tokens;
    tokens += b.target_tokens;
  }
  r.valid_loss = tokens ? loss_sum / tokens : 0;
  const size_t n = std::min<size_t>(valid_text.size(), (size_t)std::max<int64_t>(o.eval_sentences, 0));
  TranslationScores scores = score_translation(m, {valid_text.begin(), valid_text.begin() + n}, 128);
  r.chrf = scores.chrf;
  r.bleu = scores.bleu;
  m.model->train();
  return r;
}

namespace {

// What the loop carries from step to step besides the model and the optimizer.
struct LoopState {
  int64_t step = 0;
  std::vector<std::vector<int64_t>> batches;  // this epoch's order
  int64_t next_batch = 0;
  double best_chrf = -1;
  int64_t skipped = 0;
  nlohmann::json history = nlohmann::json::array();
};

const std::string kStateFile = "/trainer_state.safetensors";

void save_loop_state(const std::string& dir, TranslationModel& m, const AdamW& opt, const Rng& data_rng,
                     const LoopState& s) {
  std::vector<std::pair<std::string, Tensor>> t;
  append_training_state(t, *m.model, opt);
  t.emplace_back("step", Tensor::from_ints({s.step}, {1}));
  t.emplace_back("skipped", Tensor::from_ints({s.skipped}, {1}));
  t.emplace_back("rng.data", rng_tensor(data_rng));
  std::vector<int64_t> indices, offsets{0};
  for (auto& b : s.batches) {
    indices.insert(indices.end(), b.begin(), b.end());
    offsets.push_back((int64_t)indices.size());
  }
  t.emplace_back("data.indices", Tensor::from_ints(indices, {(int64_t)indices.size()}));
  t.emplace_back("data.offsets", Tensor::from_ints(offsets, {(int64_t)offsets.size()}));
  t.emplace_back("data.next_batch", Tensor::from_ints({s.next_batch}, {1}));
  char best[64];
  std::snprintf(best, sizeof best, "%.17g", s.best_chrf);
  save_safetensors(dir + kStateFile, t, {{"format", "qkv-trainer-state"}, {"best_chrf", best}, {"history", s.history.dump()}});
}

LoopState load_loop_state(const std::string& dir, TranslationModel& m, AdamW& opt, Rng& data_rng) {
  const std::string path = dir + kStateFile;
  SafetensorsFile f = load_safetensors(path);
  auto need = [&](const std::string& name) -> const Tensor& { return checkpoint_tensor(f, path, name); };
  QKV_CHECK(f.metadata.count("format") && f.metadata.at("format") == "qkv-trainer-state", path,
            ": not a qkv trainer state");
  restore_training_state(f, path, *m.model, opt);
  LoopState s;
  s.step = need("step").to_ints()[0];
  s.skipped = need("skipped").to_ints()[0];
  restore_rng(data_rng, need("rng.data"));
  std::vector<int64_t> indices = need("data.indices").to_ints(), offsets = need("data.offsets").to_ints();
  for (size_t b = 0; b + 1 < offsets.size(); ++b)
    s.batches.emplace_back(indices.begin() + offsets[b], indices.begin() + offsets[b + 1]);
  s.next_batch = need("data.next_batch").to_ints()[0];
  s.best_chrf = std::stod(f.metadata.count("best_chrf") ? f.metadata.at("best_chrf") : "-1");
  if (f.metadata.count("history")) s.history = nlohmann::json::parse(f.metadata.at("history"));
  return s;
}

}  // namespace

static void save_translation_model(const TranslationModel& m, const std::string& dir, const std::string& state) {
  save_model_folder(dir, family_of_config(m.model->config_json(), dir), *m.model, m.tokenizer.get(), state);
}

void train_translation(TranslationModel& m, const std::vector<SentencePair>& train,
                       const std::vector<SentencePair>& valid, const TrainOptions& o, const std::string& out_dir,
                       const TrainCallbacks& cb) {
  QKV_CHECK(o.steps > 0, "train: steps must be positive, got ", o.steps);
  QKV_CHECK(o.batch_tokens > 0, "train: batch_tokens must be positive");
  std::vector<EncodedPair> train_ids = encode_all(*m.tokenizer, train), valid_ids = encode_all(*m.tokenizer, valid);
  for (auto& p : train_ids)
    QKV_CHECK((int64_t)std::max(p.src.size(), p.tgt.size() + 1) <= o.batch_tokens, "train: a sentence of ",
              std::max(p.src.size(), p.tgt.size() + 1), " tokens does not fit batch_tokens ", o.batch_tokens);
  Rng data_rng(o.seed ^ 0xda7a);
  Seq2Seq& model = *m.model;
  model.train();
  AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  WarmupInverseSqrt inv{.peak_lr = o.lr, .warmup_steps = o.warmup_steps};
  WarmupCosine cosine{.peak_lr = o.lr, .min_lr = o.lr * 0.01f, .warmup_steps = o.warmup_steps, .total_steps = o.steps};
  LoopState s;
  if (o.resume) {
    s = load_loop_state(out_dir, m, opt, data_rng);
    QKV_CHECK(s.step < o.steps, "train --resume: the checkpoint is at step ", s.step, ", nothing to do for ", o.steps,
              " steps");
    for (auto& b : s.batches)
      for (int64_t i : b)
        QKV_CHECK(i >= 0 && i < (int64_t)train_ids.size(), out_dir, kStateFile,
                  ": the saved data order does not fit this training set; resume with the same --train");
  }
  SkipCounter skips{.max_in_a_row = o.max_skipped_in_a_row};
  int64_t tokens_seen = 0;
  const int64_t first_step = s.step + 1;
  auto start = std::chrono::steady_clock::now();
  for (int64_t step = first_step; step <= o.steps; ++step) {
    s.step = step;
    if (s.next_batch == (int64_t)s.batches.size()) {
      s.batches = make_batches(train_ids, o.batch_tokens, data_rng);
      s.next_batch = 0;
    }
    Batch b = collate(train_ids, s.batches[s.next_batch++]);
    const float lr = o.schedule == LrSchedule::Cosine ? cosine.lr_at(step) : inv.lr_at(step);
    opt.set_lr(lr);
    opt.zero_grad();
    Tensor loss = translation_loss(model, b, o.label_smoothing);
    float loss_value = loss.item();
    if (cb.inject_nonfinite && cb.inject_nonfinite(step)) loss_value = NAN;
    skips.total = s.skipped;
    const bool stepped = step_if_finite(loss, loss_value, model, opt, o.clip_norm, skips, step, out_dir);
    s.skipped = skips.total;
    if (stepped) {
      tokens_seen += b.target_tokens;
      if (cb.progress) {
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        double done = (double)(step - first_step + 1);
        cb.progress({step, o.steps, loss_value, lr, tokens_seen / std::max(secs, 1e-9),
                     secs / done * (o.steps - step), s.skipped});
      }
    }
    if (step % o.eval_every == 0 || step == o.steps) {
      EvalReport r = evaluate(m, valid_ids, valid, o);
      r.step = step;
      r.best = r.chrf > s.best_chrf;
      s.history.push_back({{"step", step}, {"train_loss", loss_value}, {"valid_loss", r.valid_loss},
                           {"chrf", r.chrf}, {"bleu", r.bleu}});
      nlohmann::ordered_json state = {{"step", step}, {"steps", o.steps}, {"best_chrf", std::max(r.chrf, s.best_chrf)},
                                      {"skipped_steps", s.skipped}, {"history", s.history}};
      if (r.best) {
        s.best_chrf = r.chrf;
        save_translation_model(m, out_dir, state.dump(2) + "\n");
      } else {
        write_file_atomic(out_dir + "/trainer_state.json", state.dump(2) + "\n");
      }
      save_loop_state(out_dir, m, opt, data_rng, s);
      if (cb.evaluated) cb.evaluated(r);
    }
  }
}

TranslationModel new_translation_model(const std::string& config_text, const std::string& source,
                                       const std::vector<SentencePair>& train, uint64_t seed) {
  nlohmann::json j = parse_json(config_text, source);
  TokenizerConfig tokenizer;
  if (j.is_object()) {
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
