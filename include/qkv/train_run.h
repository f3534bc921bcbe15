// qkv/train_run.h — training from a config file, for every domain: what
// `qkv train` and Python's qkv.train both run. The family of the config picks
// the trainer (qkv/trainer.h, qkv/lm_trainer.h, qkv/vit_trainer.h), the data
// it reads, and how long it trains (steps, or epochs for a vit).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "qkv/lm_trainer.h"
#include "qkv/process_group.h"
#include "qkv/trainer.h"
#include "qkv/vit_trainer.h"

namespace qkv {

struct TrainRun {
  std::string config_text, config_source;  // the config and its name in errors
  // The data: a TSV of pairs (translation), a text file (decoder) or an IDX
  // folder (vit). Without `valid`, the last 5% of `train` is held out (a vit
  // tests on train's t10k files).
  std::string train, valid;
  std::string out;      // the model folder
  bool resume = false;  // continue the run in `out` (its config must be of the same arch)
  // A model folder (qkv or Hugging Face) to start from: its architecture,
  // weights and tokenizer, with every Linear weight in float32 for training;
  // the config then holds only its "train" section. Fine-tuning.
  std::string init;
  bool replace_invalid_utf8 = false;  // in the TSV of pairs
  // Values that replace the config's "train" section; each is checked to
  // belong to the family (steps and batch_tokens not for a vit, epochs only).
  std::optional<int64_t> steps, epochs, batch_tokens, seed;
  std::optional<double> lr;
  std::optional<Precision> precision;  // the config's "precision" ("f32" or "bf16": mixed precision)
  // How the caller spells its options in errors: "--batch-tokens" for the
  // program (true), "batch_tokens" for Python's keywords (false).
  bool flag_names = true;
  // The processes training this model together (qkv/process_group.h), each
  // running this same call: the config's batch is the global one, rank 0
  // alone prints (the hooks) and writes. None: this process alone.
  ProcessGroup* group = nullptr;
};

struct TrainHooks {
  // Before the first step: the model's summary and the data, in two lines.
  std::function<void(const std::string& what)> starting;
  TrainCallbacks translation;  // the hooks of the family's trainer
  LmCallbacks language;
  VitCallbacks vision;
};

TrainOutcome train_from_config(const TrainRun& run, const TrainHooks& hooks);

}  // namespace qkv
