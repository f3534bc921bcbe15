// qkv/blocks.h — the Transformer's building blocks as modules: multi-head
// attention (self and cross, grouped-query, QK-Norm, RoPE), the MLP variants
// (dense, SwiGLU), normalization choice, and the encoder and decoder layers
// with Pre-Norm or Post-Norm.
//
// Shapes: x [B, T, D] (target / queries), memory [B, S, D] (source); D =
// d_model = H * Dh.
#pragma once

#include <functional>
#include <memory>

#include "qkv/attention.h"
#include "qkv/nn.h"
#include "qkv/position.h"

namespace qkv {

// Learned absolute positions: a trainable table weight [max_len, D]; forward
// returns rows offset .. offset+T-1 ([T, D]) to add to the token embeddings.
class LearnedPositionalEmbedding : public Module {
public:
  LearnedPositionalEmbedding(int64_t max_len, int64_t dim, Rng& rng);
  Tensor forward(int64_t length, int64_t offset = 0) const;
  Tensor weight;
};

// How q, k and v are projected: one fused matrix (qkv_proj for self-attention,
// q_proj + kv_proj for cross-attention; one GEMM) or three (q_proj, k_proj,
// v_proj, as most pretrained checkpoints store them).
enum class QkvLayout { Fused, Separate };

// Which projections add a bias (Llama: none; Qwen2: q, k, v but not out;
// Whisper: all but k).
struct ProjectionBias {
  bool q = true, k = true, v = true, out = true;
};

struct MultiheadAttentionOptions {
  int64_t d_model = 0;
  int64_t nhead = 1;
  int64_t num_kv_heads = 0;  // 0: nhead; fewer heads for k and v = grouped-query attention
  int64_t head_dim = 0;      // 0: d_model / nhead; else any width (Qwen3, Gemma: nhead * head_dim != d_model)
  ProjectionBias bias;
  float dropout = 0.0f;      // on the attention weights, in training mode
  bool qk_norm = false;      // RMSNorm over the head dimension of q and k (QK-Norm)
  bool rotary = false;       // RoPE on q and k
  float rope_theta = 10000.0f;  // RoPE base (Llama 3: 500000)
  RopeScaling rope_scaling;     // Llama 3's long-context frequencies (qkv/position.h)
  bool cross_attention = false;  // q from x, k and v from a memory
  QkvLayout qkv_layout = QkvLayout::Fused;
  float qk_norm_eps = 1e-6f;
};

// Per-call masks and positions.
struct AttentionCall {
  bool causal = false;
  Tensor key_padding_lengths;  // I64 [B]
  Tensor attn_mask;            // U8 or F32, broadcastable to [B, H, T, S]
  int64_t position_offset = 0; // RoPE position of the first query (and key, for self-attention)
  bool need_weights = false;   // use the naive path and return the weights
  // Added to the result by the output projection's GEMM (the block's skip
  // connection, Linear::forward_add): out is then residual + attention.
  Tensor residual;
};

// The keys and values of past positions of one self-attention layer, kept
// between decoding steps (the KV cache). k, v [B, Hkv, capacity, Dh] are
// allocated once; positions [0, length) hold the tokens seen so far.
struct KVCache {
  Tensor k, v;
  int64_t length = 0;
  int64_t capacity() const { return k.defined() ? k.size(2) : 0; }
};

struct AttentionOutput {
  Tensor out;      // [B, T, D]
  Tensor weights;  // [B, H, T, S] when need_weights, else undefined
};

// Parameters: fused self-attention  qkv_proj.{weight,bias} [(H + 2 Hkv) Dh, D]  (rows: q, k, v)
//             fused cross-attention q_proj [H Dh, D], kv_proj [2 Hkv Dh, D]     (rows: k, v)
//             separate (either kind) q_proj [H Dh, D], k_proj, v_proj [Hkv Dh, D]
//             out_proj [D, H Dh];  with qk_norm: q_norm.weight, k_norm.weight [Dh]
// Biases as options.bias says; a fused matrix needs the same choice for all its rows.
class MultiheadAttention : public Module {
public:
  MultiheadAttention(MultiheadAttentionOptions options, Rng& rng);
  // Self-attention over x.
  AttentionOutput forward(const Tensor& x, const AttentionCall& call = {});
  // Cross-attention: queries from x, keys and values from memory.
  AttentionOutput forward(const Tensor& x, const Tensor& memory, const AttentionCall& call = {});
  // The projection heads of q [B,H,T,Dh] and of k, v [B,Hkv,S,Dh] (norm and RoPE applied),
  // and the attention of given heads, for callers that keep their own K/V (a KV cache).
  // attend() also takes G query rows per key row (q [G*B, ...], rows b*G .. b*G+G-1
  // reading k[b]): beams that share their sentence's cross-attention K/V.
  Tensor project_q(const Tensor& x, int64_t position_offset);
  std::pair<Tensor, Tensor> project_kv(const Tensor& memory, int64_t position_offset);
  AttentionOutput attend(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionCall& call);
  // Self-attention for incremental decoding: x [B, T, D] are positions
  // cache.length .. cache.length+T-1. Only their q, k, v are computed; k and v
  // are appended to the cache, and q attends to everything cached (causally).
  AttentionOutput forward_cached(const Tensor& x, KVCache& cache, const AttentionCall& call = {});
  // One decoding step of B independent sequences (continuous batching): x
  // [B, 1, D], row b the next position of the sequence whose cache is
  // caches[b] (batch 1, each at its own length). The projections run once for
  // all rows; each row's k, v are appended to its cache, and the rows' queries
  // attend to their caches in one call (cached_rows_attention; no dropout).
  // residual, where defined, is added to out as AttentionCall::residual is.
  AttentionOutput forward_cached_rows(const Tensor& x, const std::vector<KVCache*>& caches,
                                      const Tensor& residual = Tensor());
  // Several sequences' new positions in one pass (continuous batching's
  // prefill): x [1, N, D] holds lengths[0] positions of the sequence whose
  // cache is caches[0] (batch 1), then lengths[1] of caches[1]'s, and so on,
  // packed without padding, each from its own cache's length on. The
  // projections run once for all N positions; each sequence's k, v are
  // appended to its cache and its queries attend to it causally, as
  // forward_cached does. residual as in forward_cached_rows.
  AttentionOutput forward_cached_packed(const Tensor& x, const std::vector<int64_t>& lengths,
                                        const std::vector<KVCache*>& caches, const Tensor& residual = Tensor());
  KVCache make_cache(int64_t batch, int64_t capacity) const;

  const MultiheadAttentionOptions& options() const { return options_; }
  std::shared_ptr<Linear> qkv_proj, q_proj, kv_proj, k_proj, v_proj, out_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;

private:
  Tensor heads(const Tensor& x, int64_t count) const;  // [B,T,count*Dh] -> [B,count,T,Dh]
  // out_proj of the merged heads, plus the residual where it is defined.
  Tensor project_out(const Tensor& merged, const Tensor& residual) const;
  // The projections of self-attention, [B,T,H*Dh] and [B,T,Hkv*Dh] twice, before the heads are split.
  std::vector<Tensor> project_self(const Tensor& x) const;
  Tensor prepare(const Tensor& heads, const std::shared_ptr<RMSNorm>& norm, int64_t offset) const;
  // k (its heads before k_norm and RoPE, which this applies) and v
  // [batch, Hkv, n, Dh] written at cache positions length .. length+n-1;
  // the length moves past them. The caller checks the capacity.
  void append(KVCache& cache, const Tensor& k, const Tensor& v) const;
  AttentionOptions attention_options(const AttentionCall& call);
  MultiheadAttentionOptions options_;
  int64_t head_dim_, kv_heads_;
  Rng dropout_rng_;
};

// The feed-forward slot of a Transformer layer: one interface, several MLPs.
class FeedForward : public Module {
public:
  virtual Tensor forward(const Tensor& x) = 0;
  // residual + forward(x): the dense MLP and SwiGLU add the residual in
  // their last product (Linear::forward_add), the others after.
  virtual Tensor forward_add(const Tensor& x, const Tensor& residual) { return add(residual, forward(x)); }
  // An auxiliary loss of the last forward to add to the training loss
  // (Mixture of Experts' load balancing); undefined for the others.
  virtual Tensor aux_loss() const { return Tensor(); }
};

// fc2(act(fc1(x))) — the lecture's "expand, nonlinearity, contract".
class DenseFeedForward : public FeedForward {
public:
  DenseFeedForward(MLPOptions options, Rng& rng);
  Tensor forward(const Tensor& x) override { return mlp->forward(x); }
  Tensor forward_add(const Tensor& x, const Tensor& residual) override { return mlp->forward_add(x, residual); }
  std::shared_ptr<MLP> mlp;
};

// SwiGLU (Shazeer 2020): (silu(x W1^T) * (x W2^T)) W3^T; w1, w2 [hidden, D], w3 [D, hidden], no biases.
class SwiGLU : public FeedForward {
public:
  SwiGLU(int64_t d_model, int64_t hidden, Rng& rng);
  Tensor forward(const Tensor& x) override;
  Tensor forward_add(const Tensor& x, const Tensor& residual) override;
  std::shared_ptr<Linear> w1, w2, w3;
};

enum class MLPKind { Dense, SwiGLU, MoE };

struct MoEOptions {
  int64_t num_experts = 8;           // E
  int64_t top_k = 2;                 // experts per token, A < E
  float aux_loss_weight = 0.01f;     // scales aux_loss()
  MLPKind expert = MLPKind::SwiGLU;  // Dense or SwiGLU experts
  Activation activation = Activation::Gelu;  // for Dense experts
};

// Mixture of Experts (Shazeer et al. 2017; Switch, Fedus et al. 2021; Mixtral 2024):
//   p = softmax(x Wr^T) [N, E];  S(t) = the top_k experts of token t by p
//   y_t = sum_{e in S(t)} (p_te / sum_{e' in S(t)} p_te') expert_e(x_t)
//   aux = weight * E * sum_e f_e P_e,  f_e = (tokens sent to e) / (N top_k),  P_e = mean_t p_te
// aux is 1 x weight when routing is perfectly balanced. Tokens are grouped by
// expert, so each expert runs one matmul over all of its tokens.
// Parameters: router.weight [E, D], experts.<e>.* (the expert MLPs).
class MixtureOfExperts : public FeedForward {
public:
  MixtureOfExperts(int64_t d_model, int64_t hidden, MoEOptions options, Rng& rng);
  Tensor forward(const Tensor& x) override;  // [..., D] -> [..., D]
  Tensor aux_loss() const override { return aux_loss_; }
  // Tokens each expert received in the last forward.
  const std::vector<int64_t>& expert_counts() const { return counts_; }
  std::shared_ptr<Linear> router;
  std::vector<std::shared_ptr<FeedForward>> experts;

private:
  MoEOptions options_;
  Tensor aux_loss_;
  std::vector<int64_t> counts_;
};

enum class NormKind { LayerNorm, RMSNorm };

// LayerNorm (weight, bias) or RMSNorm (weight) over the last axis.
class Norm : public Module {
public:
  Norm(NormKind kind, int64_t dim, float eps);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  NormKind kind;
  float eps;
};

struct TransformerLayerOptions {
  int64_t d_model = 0;
  int64_t dim_feedforward = 0;
  float dropout = 0.1f;                      // after each sublayer, and on the attention weights
  Activation activation = Activation::Relu;  // for the dense MLP
  bool norm_first = false;                   // Pre-Norm: x + f(norm(x)); else Post-Norm: norm(x + f(x))
  NormKind norm = NormKind::LayerNorm;
  float norm_eps = 1e-5f;
  MLPKind mlp = MLPKind::Dense;
  MoEOptions moe;  // when mlp is MoE
  // Everything about the attention sublayers; its d_model and dropout are the
  // layer's. A decoder layer's cross-attention takes the same options without RoPE.
  MultiheadAttentionOptions attention;
};

std::shared_ptr<FeedForward> make_feed_forward(const TransformerLayerOptions& options, Rng& rng);

// self_attn, mlp, norm1, norm2 (names follow torch.nn.TransformerEncoderLayer
// where they can: its linear1/linear2 are mlp.mlp.fc1/fc2 here).
class TransformerEncoderLayer : public Module {
public:
  TransformerEncoderLayer(TransformerLayerOptions options, Rng& rng);
  // x [B, S, D]; call carries the source padding (and a causal flag for decoder-only use).
  Tensor forward(const Tensor& x, const AttentionCall& call = {});
  // Causal self-attention over a KV cache (decoder-only models): x [B, T, D]
  // are positions cache.length .. cache.length+T-1.
  Tensor forward_cached(const Tensor& x, KVCache& cache);
  // x [B, 1, D]: the next position of B sequences, each with its own cache
  // (MultiheadAttention::forward_cached_rows).
  Tensor forward_cached_rows(const Tensor& x, const std::vector<KVCache*>& caches);
  // x [1, N, D]: several sequences' new positions, packed
  // (MultiheadAttention::forward_cached_packed).
  Tensor forward_cached_packed(const Tensor& x, const std::vector<int64_t>& lengths,
                               const std::vector<KVCache*>& caches);
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<FeedForward> mlp;
  std::shared_ptr<Norm> norm1, norm2;
  Tensor last_self_weights;  // [B, H, S, S] of the last forward with call.need_weights
  std::shared_ptr<Dropout> dropout1, dropout2;

private:
  // The Pre- or Post-Norm wiring; attend(h, residual) is residual + the
  // attention of h, or the attention alone for an undefined residual.
  Tensor run(const Tensor& x, const std::function<Tensor(const Tensor&, const Tensor&)>& attend);
  TransformerLayerOptions options_;
};

// self_attn (causal), cross_attn (torch: multihead_attn), mlp, norm1..3.
class TransformerDecoderLayer : public Module {
public:
  TransformerDecoderLayer(TransformerLayerOptions options, Rng& rng);
  // x [B, T, D] target, memory [B, S, D] encoder output.
  Tensor forward(const Tensor& x, const Tensor& memory, const AttentionCall& self_call = {.causal = true},
                 const AttentionCall& cross_call = {});
  // Incremental decoding: x [B, T, D] new positions; self_cache holds the
  // past K/V; cross_k, cross_v [B, Hkv, S, Dh] are the source's, computed once
  // per sentence (cross_attn->project_kv). With cross_call.need_weights the
  // cross-attention weights [B, H, T, S] are kept in last_cross_weights.
  Tensor forward_cached(const Tensor& x, KVCache& self_cache, const Tensor& cross_k, const Tensor& cross_v,
                        const AttentionCall& cross_call = {});
  std::shared_ptr<MultiheadAttention> self_attn, cross_attn;
  std::shared_ptr<FeedForward> mlp;
  std::shared_ptr<Norm> norm1, norm2, norm3;
  std::shared_ptr<Dropout> dropout1, dropout2, dropout3;
  Tensor last_self_weights;  // [B, H, T, T] of the last forward with self_call.need_weights
  Tensor last_cross_weights;

private:
  using Sublayer = std::function<Tensor(const Tensor& h, const Tensor& residual)>;  // as in the encoder layer's run
  // The Pre-Norm or Post-Norm wiring of the three sublayers, shared by forward and forward_cached.
  Tensor run(const Tensor& x, const Sublayer& self, const Sublayer& cross);
  TransformerLayerOptions options_;
};

// The Transformer-block keys that the translation Transformer's and the
// decoder LM's configs share (DecoderConfig and TransformerConfig derive from
// it; each sets its own defaults). layer_options() is the one place they
// become module options.
struct BlockConfig {
  int64_t d_model = 128;
  int64_t nhead = 4;
  int64_t num_kv_heads = 0;  // grouped-query attention; 0: nhead
  int64_t head_dim = 0;      // 0: d_model / nhead
  int64_t dim_feedforward = 512;
  float dropout = 0.1f;
  Activation activation = Activation::Relu;  // of the dense MLP
  bool norm_first = true;
  NormKind norm = NormKind::LayerNorm;
  float norm_eps = 1e-5f;     // of the layer norms
  MLPKind mlp = MLPKind::Dense;
  bool qk_norm = false;
  float qk_norm_eps = 1e-6f;
  PositionKind positions = PositionKind::Sinusoidal;  // Sinusoidal | SinusoidalHalves | Learned | Rope
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;   // rope_scaling_type, rope_scaling_factor (written when the factor is not 1);
                              // llama3: rope_low_freq_factor, rope_high_freq_factor, rope_original_context
  ProjectionBias bias;        // q_bias, k_bias, v_bias, out_bias
  QkvLayout qkv_layout = QkvLayout::Fused;
  bool tie_output = true;     // output projection = embedding^T
  MoEOptions moe;             // num_experts, top_k, aux_loss_weight (for mlp moe)

  int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : nhead; }
  bool is_moe() const { return mlp == MLPKind::MoE; }
  bool is_rope_scaled() const { return rope_scaling.active(); }
  bool is_llama3_scaled() const { return rope_scaling.active() && rope_scaling.kind == RopeScalingKind::Llama3; }
  bool is_yarn_scaled() const { return rope_scaling.active() && rope_scaling.kind == RopeScalingKind::Yarn; }
  bool has_original_context() const {
    return is_llama3_scaled() || is_yarn_scaled() ||
           (rope_scaling.active() && rope_scaling.kind == RopeScalingKind::Dynamic);
  }
  TransformerLayerOptions layer_options() const;
  // The cross-field rules (d_model and nhead, heads and key/value heads, MoE
  // top_k), as errors naming `source`.
  void check(const std::string& source) const;
};

}  // namespace qkv
