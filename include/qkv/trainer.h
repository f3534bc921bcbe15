// qkv/trainer.h — the training loop for translation models and the model folder.
//
// A model folder holds config.json (the model config and its "tokenizer"),
// model.safetensors (the best weights by validation chrF), the tokenizer's
// file (tokenizer.json for characters, tokenizer.model for SentencePiece),
// trainer_state.json (step, metrics history) and trainer_state.safetensors
// (the latest weights, AdamW moments, step, every RNG stream and the data
// order: all that --resume needs, in one file). Every file is written
// atomically, so a crash never leaves a half-written model; a resume reads
// the one state file, so it never mixes two checkpoints.
#pragma once

#include <functional>
#include <string>

#include "qkv/translation.h"

namespace qkv {

enum class LrSchedule { InverseSqrt, Cosine };  // after the warmup

struct TrainOptions {
  int64_t steps = 1000;
  int64_t batch_tokens = 4096;
  float lr = 1e-3f;  // peak
  int64_t warmup_steps = 200;
  LrSchedule schedule = LrSchedule::InverseSqrt;
  float weight_decay = 0.01f;
  float clip_norm = 1.0f;
  float label_smoothing = 0.1f;
  uint64_t seed = 1;
  int64_t eval_every = 250;       // validation loss, chrF and BLEU every this many steps
  int64_t eval_sentences = 300;   // decoded for chrF/BLEU
  int64_t max_skipped_in_a_row = 20;  // non-finite losses/gradients before giving up
  bool resume = false;  // continue from out_dir/trainer_state.safetensors

  // The "train" object of a config file; unknown keys are an error.
  static TrainOptions from_json(const std::string& text, const std::string& source);
};

struct TrainProgress {
  int64_t step, total_steps;
  float loss, lr;
  double tokens_per_second, eta_seconds;
  int64_t skipped_steps;
};

struct EvalReport {
  int64_t step;
  double valid_loss, chrf, bleu;
  bool best;
};

struct TrainCallbacks {
  std::function<void(const TrainProgress&)> progress;  // every step
  std::function<void(const EvalReport&)> evaluated;    // after each validation
  // For tests of the non-finite handling: called before each step; when it
  // returns true, that step's loss is taken to be NaN.
  std::function<bool(int64_t step)> inject_nonfinite;
};

struct TranslationModel {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<Seq2Seq> model;  // any arch
};

// A fresh model from a config file's text (its "train" object is read by
// TrainOptions::from_json), with its tokenizer (the config's "tokenizer",
// characters by default) learnt from both sides of `train`.
TranslationModel new_translation_model(const std::string& config_text, const std::string& source,
                                       const std::vector<SentencePair>& train, uint64_t seed);

// Trains `m` on `train`, validates on `valid` every eval_every steps, and
// saves the best checkpoint (by validation chrF) to `out_dir`.
void train_translation(TranslationModel& m, const std::vector<SentencePair>& train,
                       const std::vector<SentencePair>& valid, const TrainOptions& options, const std::string& out_dir,
                       const TrainCallbacks& callbacks);

void save_translation_model(const TranslationModel& m, const std::string& dir, const std::string& trainer_state_json);
TranslationModel load_translation_model(const std::string& dir);

// Corpus scores (0-100) of translating `pairs`' sources against their targets.
struct TranslationScores {
  double bleu = 0, chrf = 0, exact_match = 0;  // BLEU with tokenize "char"
  int64_t sentences = 0;
};
TranslationScores score_translation(TranslationModel& m, const std::vector<SentencePair>& pairs, int64_t max_len,
                                    int64_t beam = 1);

// Translations of `sources` (text in, text out): greedy when beam is 1, else beam search.
std::vector<std::string> translate_texts(TranslationModel& m, const std::vector<std::string>& sources,
                                         int64_t max_len, int64_t beam = 1);

}  // namespace qkv
