// qkv/infer.h — running trained models: translation, text generation, image
// classification, and their scores. Every reader takes a model folder
// (qkv/checkpoint.h); a folder of another kind is one error naming `command`
// and what the folder holds. Nothing here needs a trainer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qkv/lm.h"
#include "qkv/tokenizer.h"
#include "qkv/translation.h"
#include "qkv/vision.h"
#include "qkv/vit.h"

namespace qkv {

// --- translation (families of the Translation domain: transformer, rnn_attention, conv) ---

// What a Hugging Face folder's generation_config.json asks of generate().
// Translating reads num_beams, length_penalty, early_stopping (true, false
// or "never"), and max_new_tokens, or else max_length less the decoder's
// start token, as its defaults. Decoders (qkv generate and qkv chat, where
// their flags are not given) read do_sample, temperature, top_k, top_p, min_p,
// typical_p, epsilon_cutoff, eta_cutoff and max_new_tokens. Both read the logits processors. Other fields are not read.
struct GenerationDefaults {
  bool from_file = false;  // the folder has a generation_config.json
  int64_t num_beams = 1;
  float length_penalty = 1.0f;
  EarlyStopping early_stopping = EarlyStopping::Heuristic;
  int64_t max_new_tokens = 0;  // translation's (0: not given)
  // Sampling, as generate() defaults it: do_sample false is greedy, whatever
  // the temperature; top_k is 50 when the file does not give it.
  bool do_sample = false;
  float temperature = 1.0f;
  int64_t top_k = 50;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float typical_p = 1.0f;
  float epsilon_cutoff = 0.0f, eta_cutoff = 0.0f;
  int64_t decoder_max_new_tokens = 0;  // max_new_tokens as given (max_length, counting the prompt, is not read)
  // repetition_penalty, no_repeat_ngram_size, bad_words_ids, min_length and
  // min_new_tokens (generate()'s logits processors), for every decoding:
  // translation, greedy or beam, and a decoder's, greedy or sampled.
  TokenRules rules;
};
// dir/generation_config.json's (defaults where it is absent); a field of the
// wrong type or out of range is an error naming the file and the field.
// With `vocab` (> 0), so is an id of bad_words_ids past it (else that is an
// error when a decoding first applies the rules).
GenerationDefaults read_generation_defaults(const std::string& dir, int64_t vocab = 0);

struct TranslationModel {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<Seq2Seq> model;  // any arch
  GenerationDefaults generation;   // the folder's; beam search ranks and stops by them
};
// `dtype`: the Linear weights' dtype, as LoadOptions::dtype (qkv/checkpoint.h) has it; so for
// the three loaders below.
TranslationModel load_translation_model(const std::string& dir, const std::string& command = "translate",
                                        const std::string& dtype = "");
// A translation folder `dir` already read by load_model_folder (as `qkv
// serve` reads any folder), with the generation defaults of its files.
struct ModelFolder;
TranslationModel translation_model(const ModelFolder& folder, const std::string& dir);

// How long a source may be, in tokens. The encoder's cost grows with the
// square of the length: one line of 100k characters kept a translation busy
// for minutes and one of 10 MB ran out of memory, so a longer source is an
// error naming it (or, with `truncate`, cut to the limit).
inline constexpr int64_t kDefaultMaxSourceTokens = 1024;
struct SourceLimit {
  int64_t max_tokens = 0;  // 0: the model's own limit (learned positions), else kDefaultMaxSourceTokens
  bool truncate = false;
};
// The limit in tokens for `m`; a max_tokens past the model's own limit is an error.
int64_t source_token_limit(const TranslationModel& m, const SourceLimit& limit);
// `text` as source ids within the limit; `where` names it in the error
// ("eval: test.tsv:12"). *cut, if given, tells whether it was truncated.
std::vector<int64_t> encode_source(const TranslationModel& m, const std::string& text, const SourceLimit& limit,
                                   const std::string& where, bool* cut = nullptr);

// Corpus scores (0-100) of translating sources against their references.
struct TranslationScores {
  double bleu = 0, chrf = 0, exact_match = 0;  // BLEU with tokenize "char"
  int64_t sentences = 0;
  CorpusConfidence confidence;  // bootstrap intervals, when resamples were asked for
  std::vector<std::string> hypotheses;  // the translations scored, in order
};
TranslationScores score_translation(TranslationModel& m, const std::vector<SentencePair>& pairs, int64_t max_len,
                                    int64_t beam = 1, const SourceLimit& limit = {});
// The same for sources already encoded (encode_source).
TranslationScores score_translation(TranslationModel& m, const std::vector<std::vector<int64_t>>& sources,
                                    const std::vector<std::string>& references, int64_t max_len, int64_t beam = 1,
                                    int64_t resamples = 0);

// The scores of each category of a test set (the third column of its TSV,
// ReadTextOptions::categories), in the order the categories first appear; a
// pair without one counts as "(none)". Empty when no pair has a category.
struct CategoryScores {
  std::string name;
  double chrf = 0, bleu = 0, exact_match = 0;
  int64_t sentences = 0;
  BootstrapInterval chrf_interval;  // when resamples > 0
};
std::vector<CategoryScores> scores_by_category(const std::vector<std::string>& hypotheses,
                                               const std::vector<std::string>& references,
                                               const std::vector<std::string>& categories, int64_t resamples);

// Each pair's source translated (greedy, in eval mode, without gradients; the
// model's mode is restored) and compared with its reference, exactly: what the
// demo prints as its ✓/✗ list.
struct TranslationCheck {
  std::string source, reference, output;
  bool ok() const { return output == reference; }
};
std::vector<TranslationCheck> check_translations(TranslationModel& m, const std::vector<SentencePair>& pairs,
                                                 int64_t max_len);

// The beam and the longest output a translation runs with: those asked (0:
// not asked), else the folder's generation_config.json ones (its length at
// most kMaxDecodeLength), else greedy and 128 tokens.
struct TranslationDecoding {
  int64_t beam = 1, max_len = 128;
};
TranslationDecoding translation_decoding(const TranslationModel& m, int64_t beam, int64_t max_len);

// Translations (text out) of `sources`: greedy when beam is 1, else beam
// search, with the length penalty and early stopping of m.generation.
std::vector<std::string> translate_texts(TranslationModel& m, const std::vector<std::string>& sources,
                                         int64_t max_len, int64_t beam = 1, const SourceLimit& limit = {});
std::vector<std::string> translate_ids(TranslationModel& m, const std::vector<std::vector<int64_t>>& sources,
                                       int64_t max_len, int64_t beam = 1);

// --- language models (arch decoder) ---

struct LanguageModel {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<DecoderLM> model;
  GenerationDefaults generation;  // the folder's; generate() applies its rules on every step
};
LanguageModel load_language_model(const std::string& dir, const std::string& command = "generate",
                                  const std::string& dtype = "");
// Documents are separated by blank lines. Each is encoded, followed by
// <eos>, and all are concatenated into one token stream.
std::vector<int64_t> pack_documents(const Tokenizer& tok, const std::string& text);
// Mean next-token loss (natural log) over consecutive windows of `tokens`.
double language_model_loss(DecoderLM& model, const std::vector<int64_t>& tokens, int64_t batch_size = 8);

struct GenerateOptions {
  int64_t max_new_tokens = 100;
  float temperature = 1.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: all
  float top_p = 1.0f;        // nucleus: the smallest set of tokens with this much probability
  float min_p = 0.0f;        // only tokens at least this fraction as likely as the most likely one (0: off)
  // Locally typical sampling: the tokens whose surprise is nearest the
  // entropy, as many as make up this much probability (1: off).
  float typical_p = 1.0f;
  // Tokens below this probability (epsilon sampling), or below min(eta,
  // sqrt(eta) * exp(-entropy)) (eta sampling); 0: off. As transformers'
  // epsilon_cutoff and eta_cutoff, after top-k, top-p, min-p and typical-p.
  float epsilon_cutoff = 0.0f, eta_cutoff = 0.0f;
  uint64_t seed = 1;
  // OpenAI's penalties, on the logits after the folder's rules: each id the
  // outputs so far hold (not the prompt, as vLLM) loses frequency_penalty
  // per occurrence and presence_penalty once. -2 to 2; 0: off.
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  // OpenAI's logit_bias: added to these ids' logits (-100 to 100: -100 all
  // but bans one, 100 all but forces it), after the penalties.
  std::vector<std::pair<int64_t, float>> logit_bias;
  bool truncate_prompt = false;  // keep the prompt's last tokens when it does not fit the context
  bool ignore_eos = false;       // never sample <eos>: exactly max_new_tokens (or up to the context)
};

// Prefills the prompt, then samples one token at a time with the KV cache,
// until <eos> or max_new_tokens, each step's logits through the folder's
// rules (m.generation.rules) on the prompt's ids and the outputs. `emit` receives the text as it grows, in
// pieces that never split a UTF-8 character (a character still arriving is
// held back; bytes that can never form one, and a character generation stops
// inside, become U+FFFD), so the pieces add up to replace_invalid_utf8 of the
// decoded ids, as transformers' TextStreamer does. Returns the new token ids.
std::vector<int64_t> generate(LanguageModel& m, const std::string& prompt, const GenerateOptions& options,
                              const std::function<void(const std::string&)>& emit = {});

// An assistant's turn (qkv/chat.h): generate on `prompt` (a chat format's
// text) until <eos>, max_new_tokens or the text `end_of_turn`; returns the
// answer without that marker. `emit` gets the answer as it grows; the end of
// the text that may yet become the marker is held back until it does not.
// An empty end_of_turn is plain generate.
std::string generate_turn(LanguageModel& m, const std::string& prompt, const std::string& end_of_turn,
                          const GenerateOptions& options, const std::function<void(const std::string&)>& emit = {});

// --- images (arch vit) ---

std::shared_ptr<VisionTransformer> load_vit_model(const std::string& dir, const std::string& command = "classify",
                                                  const std::string& dtype = "");
// Softmax probabilities [B, classes] of images [B, C, H, W].
Tensor classify_images(VisionTransformer& model, const Tensor& images);
// The k most likely classes of one row of probabilities [classes], most likely
// first, equal probabilities by class number (qkv classify and qkv serve).
std::vector<int64_t> top_classes(const float* probs, int64_t classes, int64_t k);
struct VitEvaluation {
  int64_t images = 0;
  double accuracy = 0;              // 0..1
  std::vector<int64_t> confusion;   // classes x classes: [true][predicted]
};
VitEvaluation evaluate_vit(VisionTransformer& model, const ImageSet& set, int64_t batch_size = 256);

}  // namespace qkv
