// qkv/encoder.h — the text encoder: BERT's kind of Transformer, and the
// sentence embeddings computed from it (qkv embed, docs/pretrained.md).
//
//   x      = LayerNorm(E[ids] + P[positions] + T[token type 0])
//   blocks   L bidirectional self-attention + MLP layers (Post-Norm, GELU)
//   h      = x                                     [B, T, D], one vector per token
//   e      = mean of h over the real tokens, or h at the first ([CLS])
//            (then divided by its length with `normalize`)   [B, D]
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qkv/blocks.h"
#include "qkv/tokenizer.h"

namespace qkv {

enum class SentencePooling { Mean, Cls };

// The block keys (BlockConfig) with BERT's defaults, plus the encoder's own.
struct EncoderConfig : BlockConfig {
  int64_t vocab_size = 0;
  int64_t num_layers = 2;
  int64_t context = 512;          // learned positions: the longest input, in tokens
  int64_t type_vocab_size = 2;    // token type (segment) embeddings; one text is type 0
  int64_t max_tokens = 0;         // the longest input read, special tokens included (0: context);
                                  // sentence-transformers' max_seq_length
  SentencePooling pooling = SentencePooling::Mean;
  bool normalize = false;         // unit-length embeddings
  EncoderConfig() {
    dim_feedforward = 512, dropout = 0.1f, activation = Activation::Gelu, norm_first = false, norm_eps = 1e-12f;
    positions = PositionKind::Learned, qkv_layout = QkvLayout::Separate;
  }
  static EncoderConfig from_json(const std::string& text, const std::string& source);
  std::string to_json() const;
};

// Parameters: embed.weight [V, D], positions.weight [context, D],
// token_types.weight [types, D], embed_norm.{weight,bias}, layers.i.*
// (TransformerEncoderLayer, Post-Norm).
class TextEncoder : public Module {
public:
  TextEncoder(const EncoderConfig& config, Rng& rng);
  // ids [B, T], row b's first lengths[b] tokens real (the rest padding) ->
  // hidden states [B, T, D].
  Tensor forward(const Tensor& ids, const std::vector<int64_t>& lengths);
  // The sentence embeddings [B, D] of the same: pooled as the config says,
  // and unit length when `normalize`.
  Tensor embed(const Tensor& ids, const std::vector<int64_t>& lengths, bool normalize);
  const EncoderConfig& config() const { return config_; }
  std::string summary() const;

  std::shared_ptr<Embedding> embed_tokens, token_types;
  std::shared_ptr<LearnedPositionalEmbedding> positions;
  std::shared_ptr<LayerNorm> embed_norm;
  std::vector<std::shared_ptr<TransformerEncoderLayer>> layers;
  std::shared_ptr<Dropout> dropout;

private:
  EncoderConfig config_;
};

struct EmbeddingModel {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<TextEncoder> model;
};

// A model folder of the encoder family (a qkv folder, or a Hugging Face
// BertModel folder with sentence-transformers' pooling files); anything else
// is the registry's error naming `command`.
// `dtype` as LoadOptions::dtype (qkv/checkpoint.h).
EmbeddingModel load_embedding_model(const std::string& dir, const std::string& command, const std::string& dtype = "");

// What an input longer than the model's context gets.
struct EmbedLimit {
  bool truncate = false;  // cut to the context (keeping [SEP]) instead of an error
};

// One embedding per text, [N, D] as rows, computed in batches of similar
// lengths (up to 32 texts, padding within a quarter of a batch's tokens); `normalize` or the model's own setting makes
// them unit length. `where(i)` names text i in errors (a line of a file); `tokens`, when given, receives how many
// tokens the model read of each text, special ones included. `progress`,
// when given, hears after each batch how many texts are done of how many.
std::vector<std::vector<float>> embed_texts(EmbeddingModel& m, const std::vector<std::string>& texts, bool normalize,
                                            EmbedLimit limit = {}, const std::function<std::string(size_t)>& where = {},
                                            std::vector<int64_t>* tokens = nullptr,
                                            const std::function<void(size_t, size_t)>& progress = {});

}  // namespace qkv
