// qkv/lm_trainer.h — training decoder-only language models.
//
// It writes a model folder (qkv/checkpoint.h): the best weights by validation
// loss, trainer_state.json (step, perplexity history) and
// trainer_state.safetensors (the latest weights, AdamW moments, step, RNG
// streams: what --resume needs). Sampling is in qkv/infer.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qkv/infer.h"
#include "qkv/optim.h"
#include "qkv/process_group.h"
#include "qkv/tokenizer.h"

namespace qkv {


struct LmTrainOptions {
  int64_t steps = 1000;
  int64_t batch_size = 16;  // blocks of `context` tokens per step
  float lr = 1e-3f;
  int64_t warmup_steps = 100;
  float weight_decay = 0.1f;
  float adam_eps = 1e-8f;  // AdamW's eps (as torch.optim.AdamW's)
  float clip_norm = 1.0f;
  uint64_t seed = 1;
  int64_t eval_every = 200;
  int64_t max_skipped_in_a_row = 20;
  int64_t patience = 0;  // early stopping: end after this many validations without a lower loss (0: never)
  float plateau_factor = 0;      // lr x this after plateau_patience validations without a better one (0: off)
  int64_t plateau_patience = 2;
  int64_t keep_checkpoints = 0;  // keep the model folders of the last N validations in checkpoints/step-N
  Precision precision = Precision::F32;  // "bf16": mixed precision (bfloat16 products, float32 weights and state)
  bool resume = false;
  // The "train" object of a config file; unknown keys are an error.
  static LmTrainOptions from_json(const std::string& text, const std::string& source);
};

struct LmProgress {
  int64_t step, total_steps;
  float loss, lr;
  double tokens_per_second, eta_seconds;
  int64_t skipped_steps;
};

struct LmEvalReport {
  int64_t step;
  double valid_loss, perplexity;  // per token, natural log
  bool best;
};

struct LmCallbacks {
  std::function<void(const LmProgress&)> progress;
  std::function<void(const LmEvalReport&)> evaluated;
};


// A fresh model from a config's text ("tokenizer": "bytes" by default, or a
// SentencePiece config learnt from `train_text`).
LanguageModel new_language_model(const std::string& config_text, const std::string& source,
                                 const std::string& train_text, uint64_t seed);

// Trains on random windows of context + 1 tokens of `train`; every
// eval_every steps the validation loss over consecutive windows of `valid`;
// keeps the best model in out_dir.
TrainOutcome train_language_model(LanguageModel& m, const std::vector<int64_t>& train, const std::vector<int64_t>& valid,
                          const LmTrainOptions& options, const std::string& out_dir, const LmCallbacks& callbacks,
                          ProcessGroup* group = nullptr);




}  // namespace qkv
