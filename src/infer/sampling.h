// Sampling one token from logits, and cutting text at whole UTF-8
// characters: shared by generate() and the continuous-batching generator.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "qkv/infer.h"
#include "qkv/rng.h"
#include "qkv/tokenizer.h"

namespace qkv::detail {

// The length of the longest prefix of s that ends on a whole UTF-8 character
// (a multi-byte character still arriving is held back).
size_t complete_utf8_prefix(const std::string& s);

// An error unless o's numbers are in range (max_new_tokens, top_k and
// temperature not negative, top_p and typical_p in (0, 1], min_p in [0, 1],
// the cutoffs in [0, 1)): generate() and the batch generator both ask.
void check_options(const GenerateOptions& o);

// A token from logits [V]: the most likely at temperature 0, else drawn from
// softmax(logits / temperature) restricted by top_k and top_p. The
// tokenizer's never_sampled ids are never drawn, nor its eos with ignore_eos.
int64_t sample_token(const float* logits, int64_t V, const GenerateOptions& o, const Tokenizer::Specials& specials,
                     Rng& rng);

// o's presence and frequency penalties, for the ids in `outputs`, then its
// logit_bias, on scores[0, V) (an id of logit_bias past V is an error).
void apply_penalties(const GenerateOptions& o, std::span<const int64_t> outputs, float* scores, int64_t V);

// The token after `prefix` (the prompt's ids) and `outputs`: sample_token on
// the logits after `rules`, then o's penalties (on a copy; the logits are not changed).
int64_t next_token(const float* logits, int64_t V, const GenerateOptions& o, const Tokenizer::Specials& specials,
                   Rng& rng, const TokenRules& rules, std::span<const int64_t> prefix,
                   std::span<const int64_t> outputs);

}  // namespace qkv::detail
