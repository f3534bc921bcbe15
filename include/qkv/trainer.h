// qkv/trainer.h — the training loop for translation models.
//
// It writes a model folder (qkv/checkpoint.h): the best weights by validation
// chrF, and trainer_state.safetensors (the latest weights, AdamW moments,
// step, every RNG stream and the data order: all that --resume needs, in one
// file, so a resume never mixes two checkpoints). Running the trained model
// needs only qkv/infer.h.
#pragma once

#include <functional>
#include <string>

#include "qkv/infer.h"
#include "qkv/optim.h"
#include "qkv/process_group.h"

namespace qkv {

enum class LrSchedule { InverseSqrt, Cosine };  // after the warmup

struct TrainOptions {
  int64_t steps = 1000;
  int64_t batch_tokens = 4096;
  float lr = 1e-3f;  // peak
  int64_t warmup_steps = 200;
  LrSchedule schedule = LrSchedule::InverseSqrt;
  float weight_decay = 0.01f;
  float adam_eps = 1e-8f;  // AdamW's eps (as torch.optim.AdamW's)
  float clip_norm = 1.0f;
  float label_smoothing = 0.1f;
  uint64_t seed = 1;
  int64_t eval_every = 250;       // validation loss, chrF and BLEU every this many steps
  int64_t eval_sentences = 300;   // decoded for chrF/BLEU
  int64_t max_skipped_in_a_row = 20;  // non-finite losses/gradients before giving up
  int64_t patience = 0;  // early stopping: end after this many validations without a better chrF (0: never)
  float plateau_factor = 0;      // lr x this after plateau_patience validations without a better one (0: off)
  int64_t plateau_patience = 2;
  int64_t keep_checkpoints = 0;  // keep the model folders of the last N validations in checkpoints/step-N
  Precision precision = Precision::F32;  // "bf16": mixed precision (bfloat16 products, float32 weights and state)
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
  // After each validation (and its saves): true ends training there, for a
  // caller that has what it wanted (the demo, once its checks pass).
  std::function<bool(const EvalReport&)> stop;
  // For tests of the non-finite handling: called before each step; when it
  // returns true, that step's loss is taken to be NaN.
  std::function<bool(int64_t step)> inject_nonfinite;
};


// A config for someone's own parallel text (qkv train --config auto): the
// tokenizer (characters or SentencePiece), the Transformer's size and the
// length of training chosen from the number of pairs, the distinct characters
// and the longest sentence, with early stopping and saves for averaging on.
// `reasons` says each choice in a line; docs/training.md gives the rules.
struct TranslationRecipe {
  std::string config_json;
  std::vector<std::string> reasons;
};
TranslationRecipe translation_recipe(const std::vector<SentencePair>& train);

// A fresh model from a config file's text (its "train" object is read by
// TrainOptions::from_json), with its tokenizer (the config's "tokenizer",
// characters by default) learnt from both sides of `train`.
TranslationModel new_translation_model(const std::string& config_text, const std::string& source,
                                       const std::vector<SentencePair>& train, uint64_t seed);

// Trains `m` on `train`, validates on `valid` every eval_every steps, and
// saves the best checkpoint (by validation chrF, ties broken by the lower
// validation loss) to `out_dir`.
TrainOutcome train_translation(TranslationModel& m, const std::vector<SentencePair>& train,
                       const std::vector<SentencePair>& valid, const TrainOptions& options, const std::string& out_dir,
                       const TrainCallbacks& callbacks, ProcessGroup* group = nullptr);



}  // namespace qkv
