// qkv/lm_trainer.h — training and sampling decoder-only language models.
//
// A language-model folder holds config.json (the DecoderConfig with its
// "tokenizer"), model.safetensors (the best weights by validation loss), the
// tokenizer's file, trainer_state.json (step, perplexity history) and
// trainer_state.safetensors (the latest weights, AdamW moments, step, RNG
// streams: what --resume needs). Every file is written atomically.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qkv/lm.h"
#include "qkv/tokenizer.h"

namespace qkv {

struct LanguageModel {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<DecoderLM> model;
};

struct LmTrainOptions {
  int64_t steps = 1000;
  int64_t batch_size = 16;  // blocks of `context` tokens per step
  float lr = 1e-3f;
  int64_t warmup_steps = 100;
  float weight_decay = 0.1f;
  float clip_norm = 1.0f;
  uint64_t seed = 1;
  int64_t eval_every = 200;
  int64_t max_skipped_in_a_row = 20;
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

// Documents are separated by blank lines. Each is encoded, followed by
// <eos>, and all are concatenated into one token stream.
std::vector<int64_t> pack_documents(const Tokenizer& tok, const std::string& text);

// A fresh model from a config's text ("tokenizer": "bytes" by default, or a
// SentencePiece config learnt from `train_text`).
LanguageModel new_language_model(const std::string& config_text, const std::string& source,
                                 const std::string& train_text, uint64_t seed);

// Trains on random windows of context + 1 tokens of `train`; every
// eval_every steps the validation loss over consecutive windows of `valid`;
// keeps the best model in out_dir.
void train_language_model(LanguageModel& m, const std::vector<int64_t>& train, const std::vector<int64_t>& valid,
                          const LmTrainOptions& options, const std::string& out_dir, const LmCallbacks& callbacks);

// Mean next-token loss (natural log) over consecutive windows of `tokens`.
double language_model_loss(DecoderLM& model, const std::vector<int64_t>& tokens, int64_t batch_size = 8);

void save_language_model(const LanguageModel& m, const std::string& dir, const std::string& trainer_state_json);
LanguageModel load_language_model(const std::string& dir);

struct GenerateOptions {
  int64_t max_new_tokens = 100;
  float temperature = 1.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: all
  float top_p = 1.0f;        // nucleus: the smallest set of tokens with this much probability
  uint64_t seed = 1;
  bool truncate_prompt = false;  // keep the prompt's last tokens when it does not fit the context
};

// Prefills the prompt, then samples one token at a time with the KV cache,
// until <eos> or max_new_tokens. `emit` receives the text as it grows, in
// pieces that never split a UTF-8 character (a character still arriving is
// held back, and dropped if generation stops inside it; bytes that can never
// form one become U+FFFD). Returns the new token ids.
std::vector<int64_t> generate(LanguageModel& m, const std::string& prompt, const GenerateOptions& options,
                              const std::function<void(const std::string&)>& emit = {});

}  // namespace qkv
