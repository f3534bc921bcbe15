// qkv/tokenizer.h — text <-> token ids. Three kinds behind one interface: a
// character vocabulary, SentencePiece (unigram or BPE) trained on the
// training text, and bytes (for language models: any text, no training). Every kind numbers the specials the same way, so models and
// decoders never ask which one they have.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace qkv {

class Tokenizer {
public:
  static constexpr int64_t kPad = 0, kBos = 1, kEos = 2, kUnk = 3;
  virtual ~Tokenizer() = default;

  virtual std::vector<int64_t> encode(const std::string& text) const = 0;  // no <bos>/<eos>
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;  // stops at <eos>, skips specials
  // One label per id, for pictures: the piece's text.
  virtual std::vector<std::string> pieces(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t size() const = 0;
  // The "tokenizer" object of config.json (type and options) ...
  virtual std::string config_json() const = 0;
  // ... and the file in the model folder that holds the vocabulary ("" when none is needed).
  virtual std::string file_name() const = 0;
  virtual std::string serialize() const = 0;
  // Other files the tokenizer needs beside file_name() (name, bytes): Marian's SentencePiece models.
  virtual std::vector<std::pair<std::string, std::string>> extra_files() const { return {}; }
  // The tokenizer of a translation's output side: this one, except for a
  // Marian folder with separate vocabularies, whose target has its own
  // pieces and ids (the model's vocab_size; this one numbers the source).
  virtual const Tokenizer& target() const { return *this; }

  // The ids put around a text (a prompt or a document), those that end
  // generation, and those never sampled. qkv's own tokenizers: <bos> text
  // <eos>; <eos>; <pad>, <bos>, <unk>. A Hugging Face tokenizer's prefix and
  // suffix are its post-processor's template, its eos the folder's
  // eos_token_id, and it never refuses a token.
  struct Specials {
    std::vector<int64_t> prefix{kBos}, suffix{kEos}, eos{kEos}, never_sampled{kPad, kBos, kUnk};
  };
  virtual const Specials& specials() const;
  // prefix + encode(text): a prompt as the model reads it.
  std::vector<int64_t> encode_prompt(const std::string& text) const;
  bool is_eos(int64_t id) const;
};

// The "tokenizer" field of a model config:
//   "char" or {"type": "char"}
//   "bytes" or {"type": "bytes"}: ids 4..259 are the bytes 0..255; decode
//     returns the bytes as they are (a multi-byte character may be cut)
//   {"type": "sentencepiece", "model_type": "unigram" | "bpe", "vocab_size": 4000,
//    "character_coverage": 1.0}
//   {"type": "huggingface", "eos": [ids]}: the folder's tokenizer.json, as a
//     Hugging Face folder has it (written by qkv convert); eos ends generation
//   {"type": "marian"}: the folder's vocab.json, source.spm and target.spm
//     (and target_vocab.json with separate vocabularies; load_marian_tokenizer)
//   {"type": "huggingface_sentencepiece", "eos": [ids]}: the folder's
//     tokenizer.model (load_sentencepiece_folder_tokenizer)
// Unknown keys and values are errors naming `source`.
enum class TokenizerKind { Char, Bytes, SentencePiece, HuggingFace, Marian, HuggingFaceSentencePiece };
enum class SentencePieceModel { Unigram, Bpe };

struct TokenizerConfig {
  TokenizerKind type = TokenizerKind::Char;
  SentencePieceModel model_type = SentencePieceModel::Unigram;
  int64_t vocab_size = 4000;  // an upper bound: a small corpus may give fewer pieces
  double character_coverage = 1.0;
  std::vector<int64_t> eos;  // huggingface: the ids that end generation
  static TokenizerConfig from_json(const std::string& text, const std::string& source);
};

// A tokenizer learnt from `texts` (one sentence each), deterministic.
std::unique_ptr<Tokenizer> train_tokenizer(const TokenizerConfig& config, const std::vector<std::string>& texts);
// The tokenizer of a model folder, from its config's "tokenizer" field.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& config_json, const std::string& dir);

// A Hugging Face tokenizer.json (src/data/hf_tokenizer.cpp): byte-level BPE
// (GPT-2, Llama 3, Qwen2) with its added tokens, normalizer, split pattern,
// post-processor and decoder. `eos` ends generation (the folder's
// eos_token_id). What it does not read is an error naming the field. Invalid
// UTF-8 in a text is replaced by U+FFFD as Python does when it reads bytes;
// decode returns bytes, a character maybe cut (replace_invalid_utf8 gives the
// text `tokenizers` decodes).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, std::vector<int64_t> eos);

// Marian's tokenizer (src/data/marian_tokenizer.cpp), as transformers'
// MarianTokenizer runs a folder's source.spm, target.spm and vocab.json (and
// tokenizer_config.json's eos, unk and pad tokens): source.spm's pieces
// numbered by vocab.json, a leading ">>xx<<" language code its own token.
// The model appends </s> to a source (TransformerConfig::ids.source_eos).
// With tokenizer_config.json's separate_vocabs, target() is target.spm's
// pieces numbered by target_vocab.json (its </s> at vocab.json's id).
bool is_marian_tokenizer_folder(const std::string& dir);
std::unique_ptr<Tokenizer> load_marian_tokenizer(const std::string& dir);

// A folder's tokenizer.model without tokenizer.json (Llama 2 and the other
// SentencePiece folders; src/data/sentencepiece_folder.cpp), as the slow
// LlamaTokenizer and llama.cpp run it: SentencePiece's library encodes and
// decodes, its ids are the model's; <s> first unless tokenizer_config.json's
// add_bos_token is false, </s> last if its add_eos_token is true; the eos,
// bos, unk and pad tokens written in a text are those tokens. `eos` ends
// generation (the folder's eos_token_id; empty: the model's </s>).
bool is_sentencepiece_tokenizer_folder(const std::string& dir);
std::unique_ptr<Tokenizer> load_sentencepiece_folder_tokenizer(const std::string& dir, std::vector<int64_t> eos);

// A character vocabulary: the specials, then every character of the
// training text, most frequent first (ties by code point order).
class CharTokenizer final : public Tokenizer {
public:
  CharTokenizer() = default;
  static CharTokenizer build(const std::vector<std::string>& texts);
  static CharTokenizer from_json(const std::string& json, const std::string& source);
  std::string to_json() const;

  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::vector<std::string> pieces(const std::vector<int64_t>& ids) const override;
  int64_t size() const override { return (int64_t)itos_.size(); }
  std::string config_json() const override { return R"({"type": "char"})"; }
  std::string file_name() const override { return "tokenizer.json"; }
  std::string serialize() const override { return to_json(); }

private:
  std::vector<std::string> itos_;
  std::map<std::string, int64_t> stoi_;
};

}  // namespace qkv
