// qkv/models.h — whole models built from a config.
//
// Every translation architecture implements Seq2Seq, so training, greedy and
// beam decoding, and attention pictures work the same for all of them.
//
// TranslationTransformer (arch "transformer"): the encoder-decoder of
// Vaswani et al. 2017 for sequence-to-sequence translation.
//   memory = Encoder(embed(src) * sqrt(D) + PE)          [B, S, D]
//   logits = Decoder(embed(<bos> y) * sqrt(D) + PE, memory) W_out (+ b_out)   [B, T, V]
// The decoder's self-attention is causal; its cross-attention sees the
// source up to each sentence's length.
#pragma once

#include <string>
#include <vector>

#include "qkv/blocks.h"
#include "qkv/tokenizer.h"

namespace qkv {

// The ids a translation model's decoding starts from and ends with. qkv's own
// models: target = <bos> y <eos>, never <pad> or <bos> as an output, the
// source as the tokenizer gives it. A Marian model (Hugging Face): its
// decoder_start_token_id (its <pad>) first, its eos_token_id last, and the
// source ends with that eos as well.
struct DecodingIds {
  int64_t start = Tokenizer::kBos;
  int64_t eos = Tokenizer::kEos;
  int64_t pad = Tokenizer::kPad;
  bool source_eos = false;
  // The last output a length limit allows is eos, whatever the model says,
  // with log-probability 0 (transformers' forced_eos_token_id).
  bool forced_eos = false;
  bool never_output(int64_t id) const { return id == pad || id == start; }
  // The most likely next token of a row of logits (the first of equals), never_output ids left out.
  int64_t best_output(const float* logits, int64_t vocab) const;
  // Greedy decoding's next token: best_output, or eos at the last step with forced_eos.
  int64_t next_output(const float* logits, int64_t vocab, bool last_step) const {
    return forced_eos && last_step ? eos : best_output(logits, vocab);
  }
  // The source as the encoder reads it: the ids, then eos if source_eos.
  std::vector<int64_t> source(std::vector<int64_t> ids) const;
};

// What a model keeps between decoding steps; each architecture has its own.
struct DecodeState {
  virtual ~DecodeState() = default;
  int64_t position = 0;  // target tokens consumed so far
};

// Every attention weight of one teacher-forced pass, per layer, for the
// pictures (Seq2Seq::attention_weights).
struct AttentionWeights {
  std::vector<Tensor> encoder;  // per encoder layer: self-attention [B, H, S, S]
  std::vector<Tensor> decoder;  // per decoder layer: masked self-attention [B, H, T, T]
  std::vector<Tensor> cross;    // per decoder layer: cross-attention [B, H, T, S]
};

class Seq2Seq : public Module {
public:
  // Teacher-forced logits [B, T, V] for src [B, S] and tgt_in [B, T] (<bos> first).
  virtual Tensor forward(const Tensor& src, const Tensor& src_lengths, const Tensor& tgt_in) = 0;
  // Runs the encoder once; the state decodes up to `capacity` target tokens.
  virtual std::unique_ptr<DecodeState> start_decoding(const Tensor& src, const Tensor& src_lengths,
                                                      int64_t capacity) = 0;
  // ids [B, T] (usually T = 1) -> logits [B, T, V], equal to forward() on the whole prefix.
  // With need_weights, cross_weights() then holds the step's attention over the source.
  virtual Tensor decode_step(const Tensor& ids, DecodeState& state, bool need_weights = false) = 0;
  // [B, S] attention of the last decode_step's last token (need_weights); mean over heads where there are several.
  virtual Tensor cross_weights() const = 0;
  virtual std::string attention_name() const = 0;  // what cross_weights() shows, for pictures
  // [layers, heads, S]: every cross-attention head of the last decode_step's
  // last token (batch row 0, need_weights), for models with layers of heads;
  // undefined for the others.
  virtual Tensor cross_weights_by_head() const { return Tensor(); }
  // forward()'s attention weights (the naive attention path), for models
  // made of attention layers; empty for the others.
  virtual AttentionWeights attention_weights(const Tensor& src, const Tensor& src_lengths, const Tensor& tgt_in) {
    (void)src, (void)src_lengths, (void)tgt_in;
    return {};
  }
  // Keeps rows `rows` of the state, in this order, repeats allowed: beams
  // follow their hypotheses, finished sentences leave the batch. After
  // expand_beams(k), rows i*k .. i*k+k-1 must all come from one sentence.
  virtual void select_rows(DecodeState& state, const std::vector<int64_t>& rows) = 0;
  // Makes each of the state's `sentences` rows k rows (its beams), sentence s at rows
  // s*k .. s*k+k-1. The default copies every row; a model that can keep
  // per-sentence state once (the Transformer's cross-attention K/V) overrides it.
  virtual void expand_beams(DecodeState& state, int64_t sentences, int64_t k);
  virtual Tensor aux_loss() const { return Tensor(); }
  // The most source tokens the model's positions cover (learned positions);
  // 0 when they set no limit.
  virtual int64_t max_source_len() const { return 0; }
  virtual DecodingIds decoding_ids() const { return {}; }
  virtual std::string config_json() const = 0;  // the config.json of this model, with "arch"
  virtual std::string summary() const = 0;      // one line for people
};

// Builds the model a config names ("arch": "transformer" | "rnn_attention" | "conv"),
// with the given vocabulary size. Unknown keys and bad values are errors naming `source`.
std::shared_ptr<Seq2Seq> make_seq2seq(const std::string& config_json, const std::string& source, int64_t vocab_size,
                                      Rng& rng);

// Rows `rows` of t along its first dimension (a copy; differentiable for F32).
Tensor select_rows(const Tensor& t, const std::vector<int64_t>& rows);
// 0, 0, .., 1, 1, ..: each of `sentences` rows repeated k times (its beams).
std::vector<int64_t> beam_rows(int64_t sentences, int64_t k);

// The block keys (BlockConfig) with the translation defaults, plus its own.
struct TransformerConfig : BlockConfig {
  int64_t vocab_size = 0;  // one joint vocabulary for source and target (shared embedding)
  // A vocabulary of the source's own (Marian's separate vocabularies): the
  // encoder's embedding has this many rows, and vocab_size is the target's.
  // 0: the one joint vocabulary.
  int64_t source_vocab_size = 0;
  int64_t num_encoder_layers = 2;
  int64_t num_decoder_layers = 2;
  int64_t max_len = 256;   // the learned positions' table size
  bool scale_embedding = true;  // embed(ids) * sqrt(d_model); Marian's scale_embedding
  bool output_bias = false;     // a bias added to the logits (Marian's final_logits_bias)
  // The decoding ids (DecodingIds): pad_id, decoder_start_id, eos_id, source_eos;
  // written only when they are not qkv's own.
  DecodingIds ids;
  bool nondefault_ids() const {
    const DecodingIds d;
    return ids.pad != d.pad || ids.start != d.start || ids.eos != d.eos || ids.source_eos != d.source_eos ||
           ids.forced_eos != d.forced_eos;
  }

  // From config.json (unknown keys are an error, each value checked).
  static TransformerConfig from_json(const std::string& text, const std::string& source);
  std::string to_json() const;
};

// Everything the decoder keeps between steps: a self-attention KV cache per
// layer and each layer's cross-attention K and V of the source, computed once.
struct TransformerDecodeState : DecodeState {
  std::vector<KVCache> self;
  std::vector<std::pair<Tensor, Tensor>> cross;  // one row per sentence, shared by its beams
  Tensor src_lengths;                             // [sentences]
  int64_t beams = 1;                              // rows of `self` per sentence
};

class TranslationTransformer : public Seq2Seq {
public:
  TranslationTransformer(const TransformerConfig& config, Rng& rng);
  // src [B, S] ids, src_lengths I64 [B] -> memory [B, S, D]
  Tensor encode(const Tensor& src, const Tensor& src_lengths);
  // tgt_in [B, T] ids starting with <bos> -> logits [B, T, V]
  Tensor decode(const Tensor& tgt_in, const Tensor& memory, const Tensor& src_lengths);
  // Seq2Seq: caches sized for `capacity` target tokens; cross-attention K/V
  // computed once per sentence; cross_weights() is the last decoder layer's, mean over heads.
  Tensor forward(const Tensor& src, const Tensor& src_lengths, const Tensor& tgt_in) override;
  std::unique_ptr<DecodeState> start_decoding(const Tensor& src, const Tensor& src_lengths, int64_t capacity) override;
  Tensor decode_step(const Tensor& ids, DecodeState& state, bool need_weights = false) override;
  Tensor cross_weights() const override;
  std::string attention_name() const override;
  Tensor cross_weights_by_head() const override;
  AttentionWeights attention_weights(const Tensor& src, const Tensor& src_lengths, const Tensor& tgt_in) override;
  void select_rows(DecodeState& state, const std::vector<int64_t>& rows) override;
  void expand_beams(DecodeState& state, int64_t sentences, int64_t k) override;
  // The sum of the MoE layers' load-balancing losses of the last forward (undefined without MoE).
  Tensor aux_loss() const override;
  int64_t max_source_len() const override { return config_.positions == PositionKind::Learned ? config_.max_len : 0; }
  DecodingIds decoding_ids() const override { return config_.ids; }
  std::string config_json() const override { return config_.to_json(); }
  std::string summary() const override;
  const TransformerConfig& config() const { return config_; }

  std::shared_ptr<Embedding> embed;         // the target's (and the source's, with one vocabulary)
  std::shared_ptr<Embedding> source_embed;  // with source_vocab_size only
  std::shared_ptr<LearnedPositionalEmbedding> positions;
  std::vector<std::shared_ptr<TransformerEncoderLayer>> encoder_layers;
  std::vector<std::shared_ptr<TransformerDecoderLayer>> decoder_layers;
  std::shared_ptr<Norm> encoder_norm, decoder_norm;  // Pre-Norm only
  std::shared_ptr<Linear> output_proj;               // untied only
  Tensor output_bias;                                 // [V], with config output_bias
  std::shared_ptr<Dropout> dropout;

protected:
  void linear_weights_converted(DType dtype) override;

private:
  // ids through `table` (embed or source_embed), scaled, plus positions from offset.
  Tensor embed_tokens(const Tensor& ids, int64_t offset, Embedding& table);
  Tensor embed_source(const Tensor& src) { return embed_tokens(src, 0, source_embed ? *source_embed : *embed); }
  Tensor head(const Tensor& x);  // the logits of the last decoder layer's output
  TransformerConfig config_;
  TiedHead tied_head_;  // without output_proj
};

// RnnAttention (arch "rnn_attention"): the RNN encoder-decoder with additive
// attention of Bahdanau, Cho and Bengio (2015).
//   encoder: h_i = [GRU_fwd(x_1..x_i); GRU_bwd(x_i..x_S)]                 [B, S, 2H]
//   s_0 = tanh(W_init mean_i h_i)
//   step t: e_ti = v^T tanh(W s_{t-1} + U h_i),  a_t = softmax(e_t) (padding masked)
//           c_t = sum_i a_ti h_i,  s_t = GRU([E y_{t-1}; c_t], s_{t-1})
//           p(y_t) = softmax(tanh(W_o [s_t; c_t; E y_{t-1}]) E^T)        (output tied to the embedding)
// U h_i is computed once per sentence: the RNN's counterpart of cached keys.
struct RnnAttentionConfig {
  int64_t vocab_size = 0;
  int64_t embed_dim = 128;
  int64_t hidden = 128;         // per encoder direction, and the decoder's state
  int64_t attention_dim = 128;
  float dropout = 0.1f;
  static RnnAttentionConfig from_json(const std::string& text, const std::string& source);
  std::string to_json() const;
};

struct RnnDecodeState : DecodeState {
  Tensor annotations;  // h [B, S, 2H]
  Tensor keys;         // U h [B, S, A]
  Tensor padding;      // U8 [B, S], 1 at padding
  Tensor state;        // s [B, H]
};

class RnnAttention : public Seq2Seq {
public:
  RnnAttention(const RnnAttentionConfig& config, Rng& rng);
  Tensor forward(const Tensor& src, const Tensor& src_lengths, const Tensor& tgt_in) override;
  std::unique_ptr<DecodeState> start_decoding(const Tensor& src, const Tensor& src_lengths, int64_t capacity) override;
  Tensor decode_step(const Tensor& ids, DecodeState& state, bool need_weights = false) override;
  Tensor cross_weights() const override { return last_weights_; }
  std::string attention_name() const override { return "additive (Bahdanau) attention of the GRU decoder"; }
  void select_rows(DecodeState& state, const std::vector<int64_t>& rows) override;
  std::string config_json() const override { return config_.to_json(); }
  std::string summary() const override;
  const RnnAttentionConfig& config() const { return config_; }

  std::shared_ptr<Embedding> embed;
  std::shared_ptr<GRUCell> encoder_fwd, encoder_bwd, decoder_cell;
  std::shared_ptr<Linear> init, attn_query, attn_key, attn_score, output;
  std::shared_ptr<Dropout> dropout;

private:
  RnnDecodeState encode(const Tensor& src, const Tensor& src_lengths);
  Tensor step(const Tensor& ids, RnnDecodeState& st, bool need_weights);  // ids [B] -> logits [B, V]
  RnnAttentionConfig config_;
  Tensor last_weights_;
};

}  // namespace qkv
