// The recipe for someone's own parallel text (qkv train --config auto): the
// tokenizer, the model's size and the length of training chosen from the
// data, each choice with its reason. docs/training.md explains the rules.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "qkv/trainer.h"
#include "qkv/utf8.h"

namespace qkv {

TranslationRecipe translation_recipe(const std::vector<SentencePair>& train) {
  QKV_CHECK(!train.empty(), "recipe: no training pairs");
  std::set<std::string> distinct;
  int64_t chars = 0, longest = 0;
  for (const auto& [src, tgt] : train) {
    int64_t pair_longest = 0;
    for (const std::string* side : {&src, &tgt}) {
      const std::vector<std::string> cs = utf8_chars(*side);
      distinct.insert(cs.begin(), cs.end());
      chars += (int64_t)cs.size();
      pair_longest = std::max<int64_t>(pair_longest, (int64_t)cs.size());
    }
    longest = std::max(longest, pair_longest);
  }
  const int64_t n = (int64_t)train.size(), alphabet = (int64_t)distinct.size();
  TranslationRecipe r;
  char line[256];

  // Tokenizer: characters while the text is small or its characters carry
  // meaning themselves; subwords once there is enough text to learn them.
  nlohmann::ordered_json tokenizer = "char";
  double chars_per_token = 1;
  if (n < 20000) {
    std::snprintf(line, sizeof line, "tokenizer: characters (%lld pairs: too few to learn subwords from)", (long long)n);
  } else if (alphabet > 1000 && n < 200000) {
    std::snprintf(line, sizeof line,
                  "tokenizer: characters (%lld distinct characters, as in Chinese or Japanese, where one often is a "
                  "word, and under 200,000 pairs)", (long long)alphabet);
  } else {
    const int64_t vocab = n < 1000000 ? 8000 : 16000;
    tokenizer = {{"type", "sentencepiece"}, {"model_type", "unigram"}, {"vocab_size", vocab}};
    chars_per_token = 3;  // about what a unigram vocabulary of this size gives
    std::snprintf(line, sizeof line, "tokenizer: SentencePiece unigram, at most %lld pieces (%lld pairs, %lld distinct "
                  "characters: subwords shorten the sequences)", (long long)vocab, (long long)n, (long long)alphabet);
  }
  r.reasons.push_back(line);

  // Size: the demo's model for small data, then wider and deeper ones.
  struct Size {
    int64_t d_model, layers, ffn, heads, batch_tokens, warmup;
    float lr;
    const char* name;
  };
  const Size size = n < 50000    ? Size{128, 2, 512, 4, 2048, 150, 2e-3f, "small (the demo's)"}
                    : n < 500000 ? Size{256, 4, 1024, 4, 4096, 1000, 1e-3f, "medium"}
                                 : Size{512, 6, 2048, 8, 8192, 4000, 7e-4f, "base (Vaswani et al. 2017)"};
  std::snprintf(line, sizeof line, "model: %s Transformer, d_model %lld, %lld + %lld layers (%lld pairs)", size.name,
                (long long)size.d_model, (long long)size.layers, (long long)size.layers, (long long)n);
  r.reasons.push_back(line);

  // Length: about 30 passes over the data, at least 1,000 steps; validation
  // 20 times a run, early stopping after 5 without progress, the last 5
  // saves kept for averaging.
  const int64_t longest_tokens = (int64_t)std::ceil((double)longest / chars_per_token) + 2;
  const int64_t batch_tokens = std::max(size.batch_tokens, longest_tokens);
  const double tokens_per_epoch = (double)chars / 2 / chars_per_token;  // the target side, about half
  const int64_t steps = std::clamp<int64_t>((int64_t)std::ceil(30 * tokens_per_epoch / (double)batch_tokens), 1000, 200000);
  const int64_t eval_every = std::max<int64_t>(100, steps / 20 / 100 * 100);
  std::snprintf(line, sizeof line, "training: %lld steps of %lld tokens (about 30 passes), validation every %lld steps, "
                "early stopping after 5 without a better chrF, the last 5 saves kept",
                (long long)steps, (long long)batch_tokens, (long long)eval_every);
  r.reasons.push_back(line);

  nlohmann::ordered_json c = {
      {"arch", "transformer"},    {"d_model", size.d_model}, {"nhead", size.heads},
      {"num_encoder_layers", size.layers}, {"num_decoder_layers", size.layers}, {"dim_feedforward", size.ffn},
      {"dropout", 0.1},           {"activation", "relu"},    {"norm_first", true},
      {"norm", "layernorm"},      {"positions", "sinusoidal"}, {"tie_output", true},
      {"tokenizer", tokenizer},
      {"train", {{"steps", steps}, {"batch_tokens", batch_tokens}, {"lr", size.lr}, {"warmup_steps", size.warmup},
                 {"schedule", "inverse_sqrt"}, {"label_smoothing", 0.1}, {"eval_every", eval_every},
                 {"eval_sentences", 300}, {"patience", 5}, {"keep_checkpoints", 5}}}};
  r.config_json = c.dump(2) + "\n";
  return r;
}

}  // namespace qkv
