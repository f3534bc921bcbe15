// Internal: what the tokenizers of Hugging Face folders that carry
// SentencePiece models (Marian's source.spm, a Llama 2 tokenizer.model) share.
#pragma once

#include <sentencepiece_processor.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace qkv {

// Reads a SentencePiece model's protobuf into `sp`; an error names `path`.
void load_sentencepiece_model(sentencepiece::SentencePieceProcessor& sp, const std::string& proto,
                              const std::string& path);

// The special tokens written in a text are tokens of their own, as
// transformers splits them out before the model runs: text(chunk) for the
// text between them, special(id) for each (leftmost first, the longest of
// those starting there).
void split_at_specials(const std::string& text, const std::vector<std::pair<std::string, int64_t>>& specials,
                       const std::function<void(const std::string&)>& on_text,
                       const std::function<void(int64_t)>& on_special);

// A SentencePiece piece (or text) with its word boundaries, U+2581, as spaces.
std::string boundaries_as_spaces(const std::string& piece);

// SentencePiece's text of `ids` (ids of the model); an error if it cannot.
std::string sentencepiece_decode(const sentencepiece::SentencePieceProcessor& sp, const std::vector<int>& ids);
// Each id's piece, boundaries as spaces ("<unk>" for an id outside the model): labels for pictures.
std::vector<std::string> sentencepiece_pieces(const sentencepiece::SentencePieceProcessor& sp,
                                              const std::vector<int64_t>& ids);

// dir/tokenizer_config.json as an object, its text in *text; an empty object
// and "" when the folder has none. Not an object: an error naming the file.
nlohmann::json read_tokenizer_config(const std::string& dir, std::string* text);

// A string field of tokenizer_config.json (transformers writes a special
// token as a string or as {"content": ...}); `fallback` when absent.
std::string config_token(const nlohmann::json& config, const char* key, const std::string& fallback,
                         const std::string& source);

}  // namespace qkv
