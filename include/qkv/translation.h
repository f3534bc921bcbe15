// qkv/translation.h — translation end to end: batches, training, greedy
// decoding and metrics for the encoder-decoder Transformer.
#pragma once

#include <functional>
#include <string>
#include <span>
#include <vector>

#include "qkv/data.h"
#include "qkv/models.h"

namespace qkv {

struct EncodedPair {
  std::vector<int64_t> src, tgt;  // without <bos>/<eos>
};

// One padded batch: src [B, S] (pad 0), src_lengths [B], tgt_in = <bos> y [B, T],
// tgt_out = y <eos> [B, T] with -100 at padding (ignored by the loss); <bos>
// and <eos> are the model's (ids.start, ids.eos).
struct Batch {
  Tensor src, src_lengths, tgt_in, tgt_out;
  int64_t target_tokens = 0;
};
Batch collate(const std::vector<EncodedPair>& data, const std::vector<int64_t>& indices, const DecodingIds& ids = {});

// Length-bucketed batches: pairs sorted by length, cut so that no batch holds
// more than `batch_tokens` (padded) tokens on either side, then shuffled.
std::vector<std::vector<int64_t>> make_batches(const std::vector<EncodedPair>& data, int64_t batch_tokens, Rng& rng);

// Mean cross-entropy (with label smoothing) of a batch, plus the MoE auxiliary loss.
Tensor translation_loss(Seq2Seq& model, const Batch& batch, float label_smoothing);

// The decoders below take max_len in [1, kMaxDecodeLength]: the KV cache holds
// max_len + 1 positions per row, and a larger one is an error before any
// memory is asked for.
constexpr int64_t kMaxDecodeLength = 4096;
void check_max_len(int64_t max_len);

// The logits processors of transformers' generate() that a
// generation_config.json can ask for and that change which tokens come out,
// in generate()'s order, on one row of scores of a sequence: what
// generate()'s input_ids hold before the outputs (a translation's start
// token, a decoder's prompt), then the outputs. Greedy decoding and sampling
// take them on the logits (before temperature, top-k and top-p), beam search
// on the log-probabilities, as generate() does.
struct TokenRules {
  float repetition_penalty = 1.0f;   // each id in the sequence, once: score / p if positive, else score * p
  int64_t no_repeat_ngram_size = 0;  // an id that would make an n-gram the sequence has: -inf
  // The last id of each, where the sequence ends with the others: -inf (a
  // one-id list always; a list of an eos alone is dropped, as generate() drops it).
  std::vector<std::vector<int64_t>> bad_words;
  int64_t min_length = 0;      // every eos: -inf while the sequence (prefix and outputs) is shorter
  int64_t min_new_tokens = 0;  // every eos: -inf while there are fewer outputs
  bool empty() const {
    return repetition_penalty == 1.0f && no_repeat_ngram_size == 0 && bad_words.empty() && min_length == 0 &&
           min_new_tokens == 0;
  }
  // scores[0, vocab) of the token after the sequence `prefix`, then
  // `outputs` (nothing when empty()). An id of bad_words past the vocabulary is an error.
  void apply(std::span<const int64_t> prefix, std::span<const int64_t> outputs, std::span<const int64_t> eos,
             float* scores, int64_t vocab) const;
};

// Greedy decoding from <bos> until <eos> or max_len tokens (the model's
// decoding_ids()), sentences in batches, each step's logits through `rules`.
// Returns the target ids without <bos>/<eos>.
std::vector<std::vector<int64_t>> greedy_translate(Seq2Seq& model, const std::vector<std::vector<int64_t>>& sources,
                                                   int64_t max_len, int64_t batch_size = 64,
                                                   const TokenRules& rules = {});

// When a sentence's beam search stops, as generate()'s early_stopping says
// (src/models/beam_search.cpp): Heuristic (false, its default) once `beam`
// hypotheses have finished and the best running one, normalized at its
// present length, cannot beat the worst of them; First (true) as soon as
// `beam` have finished; Never ("never") as Heuristic, but normalized at the
// longest length it could reach (max_len) when length_penalty > 0.
enum class EarlyStopping { Heuristic, First, Never };

// Beam search ranked as transformers' generate() ranks it: see src/models/beam_search.cpp.
struct BeamOptions {
  int64_t beam = 4;
  float length_penalty = 1.0f;  // finished hypotheses ranked by score / length^length_penalty
  int64_t batch_size = 16;      // sentences decoded together (each with `beam` rows)
  EarlyStopping early_stopping = EarlyStopping::Heuristic;
  TokenRules rules;  // on each step's log-probabilities
};
struct BeamHypothesis {
  std::vector<int64_t> tokens;  // without <bos>/<eos>
  double log_prob = 0;          // sum of log p of the tokens and of the final <eos> (if it ended; a forced one adds 0)
};
std::vector<BeamHypothesis> beam_translate(Seq2Seq& model, const std::vector<std::vector<int64_t>>& sources,
                                           int64_t max_len, const BeamOptions& options = {});

// Greedy decoding of one sentence that also records, for every output token,
// the cross-attention weights of the last decoder layer averaged over its heads.
struct AlignedTranslation {
  std::vector<int64_t> tokens;  // output ids, ending with <eos> when one was produced
  std::vector<float> weights;   // tokens.size() x source_length, row-major (Seq2Seq::cross_weights)
  int64_t source_length = 0;
  // Every head, where the model has them (Seq2Seq::cross_weights_by_head):
  // layers x heads x tokens.size() x source_length, row-major; else empty.
  std::vector<float> heads;
  int64_t layers = 0, nheads = 0;
  // The self-attention of the same sentence, for models of attention layers
  // (Seq2Seq::attention_weights of the teacher-forced pass over what was
  // decoded), else undefined: the encoder's [layers, heads, S, S] and the
  // decoder's masked self-attention [layers, heads, T, T] over its inputs,
  // the start token and tokens[0 .. T-2] (query t is what predicted tokens[t]).
  Tensor encoder_self, decoder_self;
};
// Greedy, each step's logits through `rules` (a folder's generation_config.json: as translate_ids decodes).
AlignedTranslation translate_with_attention(Seq2Seq& model, const std::vector<int64_t>& source, int64_t max_len,
                                            const TokenRules& rules = {});

// sacreBLEU-compatible corpus scores on a 0-100 scale.
// chrF: character n-grams 1..6, beta 2, whitespace removed (sacreBLEU's chrF defaults).
double chrf(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references);
// BLEU: 4-gram, brevity penalty, sacreBLEU's default "exp" smoothing, with
// tokenize = "char" (every non-space character a token), suited to Japanese.
double bleu_char(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references);

// How much a corpus score could move with another sample of sentences, by
// bootstrap resampling as sacreBLEU's --confidence does it: `resamples` draws
// of n sentences with replacement (seeded, so the same inputs give the same
// interval), each scored as a corpus; the 95% interval runs from the
// (resamples/40)-th smallest draw to the as many-th largest.
struct BootstrapInterval {
  double mean = 0, low = 0, high = 0;
};
struct CorpusConfidence {
  BootstrapInterval bleu, chrf;
  int64_t resamples = 0;
};
CorpusConfidence bootstrap_confidence(const std::vector<std::string>& hypotheses,
                                      const std::vector<std::string>& references, int64_t resamples = 1000,
                                      uint64_t seed = 12345);

}  // namespace qkv
