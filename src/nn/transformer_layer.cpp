// Feed-forward variants, the norm choice, and the encoder and decoder layers.
//   Post-Norm (Vaswani et al. 2017):  x = norm(x + f(x))
//   Pre-Norm  (Xiong et al. 2020):    x = x + f(norm(x))
#include "qkv/blocks.h"

namespace qkv {

LearnedPositionalEmbedding::LearnedPositionalEmbedding(int64_t max_len, int64_t dim, Rng& rng) {
  weight = register_parameter("weight", Tensor::randn({max_len, dim}, rng, 0.02f));
}

Tensor LearnedPositionalEmbedding::forward(int64_t length, int64_t offset) const {
  QKV_CHECK(offset >= 0 && length >= 0 && offset + length <= weight.size(0), "LearnedPositionalEmbedding: positions [",
            offset, ", ", offset + length, ") exceed the table of ", weight.size(0), " positions");
  return weight.slice(0, offset, offset + length);
}

DenseFeedForward::DenseFeedForward(MLPOptions o, Rng& rng) {
  mlp = register_module("mlp", std::make_shared<MLP>(o, rng));
}

SwiGLU::SwiGLU(int64_t d_model, int64_t hidden, Rng& rng) {
  w1 = register_module("w1", std::make_shared<Linear>(LinearOptions{d_model, hidden, false}, rng));
  w2 = register_module("w2", std::make_shared<Linear>(LinearOptions{d_model, hidden, false}, rng));
  w3 = register_module("w3", std::make_shared<Linear>(LinearOptions{hidden, d_model, false}, rng));
}

Tensor SwiGLU::forward(const Tensor& x) { return w3->forward(mul(silu(w1->forward(x)), w2->forward(x))); }

Tensor SwiGLU::forward_add(const Tensor& x, const Tensor& residual) {
  return w3->forward_add(mul(silu(w1->forward(x)), w2->forward(x)), residual);
}

Norm::Norm(NormKind kind, int64_t dim, float eps) : kind(kind), eps(eps) {
  weight = register_parameter("weight", Tensor::ones({dim}));
  if (kind == NormKind::LayerNorm) bias = register_parameter("bias", Tensor::zeros({dim}));
}

Tensor Norm::forward(const Tensor& x) const {
  return kind == NormKind::LayerNorm ? layer_norm(x, weight, bias, eps) : rms_norm(x, weight, eps);
}

std::shared_ptr<FeedForward> make_feed_forward(const TransformerLayerOptions& o, Rng& rng) {
  if (o.mlp == MLPKind::SwiGLU) return std::make_shared<SwiGLU>(o.d_model, o.dim_feedforward, rng);
  if (o.mlp == MLPKind::MoE) return std::make_shared<MixtureOfExperts>(o.d_model, o.dim_feedforward, o.moe, rng);
  return std::make_shared<DenseFeedForward>(MLPOptions{o.d_model, o.dim_feedforward, o.d_model, o.activation}, rng);
}

// x + dropout(f(h, none)) for the sublayer f of input h, where f(h, residual)
// is residual + the sublayer's output (the output alone for an undefined
// residual): while the dropout passes its input through (evaluation, or p
// 0), the sublayer's last product adds x as it stores its output, else the
// dropout comes between and x is added after it.
template <class Sublayer>
static Tensor skip(const Tensor& x, Dropout& dropout, const Tensor& h, const Sublayer& f) {
  if (dropout.passes_through()) return f(h, x);
  return add(x, dropout.forward(f(h, Tensor())));
}

// The feed-forward sublayer as skip() takes it.
static auto feed_forward(FeedForward& mlp) {
  return [&mlp](const Tensor& h, const Tensor& residual) {
    return residual.defined() ? mlp.forward_add(h, residual) : mlp.forward(h);
  };
}

static MultiheadAttentionOptions attention_options(const TransformerLayerOptions& o, bool cross) {
  MultiheadAttentionOptions a = o.attention;
  a.d_model = o.d_model, a.dropout = o.dropout;
  a.cross_attention = cross;
  a.rotary = a.rotary && !cross;  // positions of the source and the target are not comparable
  return a;
}

TransformerEncoderLayer::TransformerEncoderLayer(TransformerLayerOptions o, Rng& rng) : options_(o) {
  QKV_CHECK(o.dim_feedforward > 0, "TransformerEncoderLayer: dim_feedforward must be positive");
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(attention_options(o, false), rng));
  mlp = register_module("mlp", make_feed_forward(o, rng));
  norm1 = register_module("norm1", std::make_shared<Norm>(o.norm, o.d_model, o.norm_eps));
  norm2 = register_module("norm2", std::make_shared<Norm>(o.norm, o.d_model, o.norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(o.dropout, rng.next_bits()));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(o.dropout, rng.next_bits()));
}

// The call with its residual.
static AttentionCall adding(const AttentionCall& call, const Tensor& residual) {
  AttentionCall c = call;
  c.residual = residual;
  return c;
}

Tensor TransformerEncoderLayer::forward(const Tensor& x, const AttentionCall& call) {
  return run(x, [&](const Tensor& h, const Tensor& residual) {
    AttentionOutput a = self_attn->forward(h, adding(call, residual));
    last_self_weights = a.weights;
    return a.out;
  });
}

Tensor TransformerEncoderLayer::forward_cached(const Tensor& x, KVCache& cache) {
  return run(x, [&](const Tensor& h, const Tensor& residual) {
    return self_attn->forward_cached(h, cache, adding({}, residual)).out;
  });
}

Tensor TransformerEncoderLayer::forward_cached_rows(const Tensor& x, const std::vector<KVCache*>& caches) {
  return run(x, [&](const Tensor& h, const Tensor& residual) {
    return self_attn->forward_cached_rows(h, caches, residual).out;
  });
}

Tensor TransformerEncoderLayer::forward_cached_packed(const Tensor& x, const std::vector<int64_t>& lengths,
                                                      const std::vector<KVCache*>& caches) {
  return run(x, [&](const Tensor& h, const Tensor& residual) {
    return self_attn->forward_cached_packed(h, lengths, caches, residual).out;
  });
}

Tensor TransformerEncoderLayer::run(const Tensor& x_in,
                                    const std::function<Tensor(const Tensor&, const Tensor&)>& attend) {
  Tensor x = x_in;
  if (options_.norm_first) {
    x = skip(x, *dropout1, norm1->forward(x), attend);
    return skip(x, *dropout2, norm2->forward(x), feed_forward(*mlp));
  }
  x = norm1->forward(skip(x, *dropout1, x, attend));
  return norm2->forward(skip(x, *dropout2, x, feed_forward(*mlp)));
}

TransformerDecoderLayer::TransformerDecoderLayer(TransformerLayerOptions o, Rng& rng) : options_(o) {
  QKV_CHECK(o.dim_feedforward > 0, "TransformerDecoderLayer: dim_feedforward must be positive");
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(attention_options(o, false), rng));
  cross_attn = register_module("cross_attn", std::make_shared<MultiheadAttention>(attention_options(o, true), rng));
  mlp = register_module("mlp", make_feed_forward(o, rng));
  norm1 = register_module("norm1", std::make_shared<Norm>(o.norm, o.d_model, o.norm_eps));
  norm2 = register_module("norm2", std::make_shared<Norm>(o.norm, o.d_model, o.norm_eps));
  norm3 = register_module("norm3", std::make_shared<Norm>(o.norm, o.d_model, o.norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(o.dropout, rng.next_bits()));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(o.dropout, rng.next_bits()));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(o.dropout, rng.next_bits()));
}

Tensor TransformerDecoderLayer::run(const Tensor& x_in, const Sublayer& self, const Sublayer& cross) {
  Tensor x = x_in;
  if (options_.norm_first) {
    x = skip(x, *dropout1, norm1->forward(x), self);
    x = skip(x, *dropout2, norm2->forward(x), cross);
    return skip(x, *dropout3, norm3->forward(x), feed_forward(*mlp));
  }
  x = norm1->forward(skip(x, *dropout1, x, self));
  x = norm2->forward(skip(x, *dropout2, x, cross));
  return norm3->forward(skip(x, *dropout3, x, feed_forward(*mlp)));
}

Tensor TransformerDecoderLayer::forward(const Tensor& x, const Tensor& memory, const AttentionCall& self_call,
                                        const AttentionCall& cross_call) {
  return run(
      x,
      [&](const Tensor& h, const Tensor& residual) {
        AttentionOutput o = self_attn->forward(h, adding(self_call, residual));
        last_self_weights = o.weights;
        return o.out;
      },
      [&](const Tensor& h, const Tensor& residual) {
        AttentionOutput o = cross_attn->forward(h, memory, adding(cross_call, residual));
        last_cross_weights = o.weights;
        return o.out;
      });
}

Tensor TransformerDecoderLayer::forward_cached(const Tensor& x, KVCache& self_cache, const Tensor& cross_k,
                                               const Tensor& cross_v, const AttentionCall& cross_call) {
  return run(
      x,
      [&](const Tensor& h, const Tensor& residual) {
        return self_attn->forward_cached(h, self_cache, adding({}, residual)).out;
      },
      [&](const Tensor& h, const Tensor& residual) {
        AttentionOutput o = cross_attn->attend(cross_attn->project_q(h, self_cache.length - h.size(1)), cross_k,
                                               cross_v, adding(cross_call, residual));
        last_cross_weights = o.weights;
        return o.out;
      });
}

}  // namespace qkv
