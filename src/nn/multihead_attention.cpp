// Multi-head attention (Vaswani et al. 2017), with grouped-query heads
// (Ainslie et al. 2023), QK-Norm and RoPE as options:
//   head_i = Attention(X Wq_i, M Wk_g(i), M Wv_g(i));  out = concat(head_1..head_H) Wo
// The H heads run as one batched product inside scaled_dot_product_attention.
#include <cmath>

#include "qkv/blocks.h"
#include "qkv/position.h"

namespace qkv {

MultiheadAttention::MultiheadAttention(MultiheadAttentionOptions o, Rng& rng)
    : options_(o), dropout_rng_(rng.next_bits()) {
  register_rng("dropout_rng", &dropout_rng_);
  QKV_CHECK(o.d_model > 0 && o.nhead > 0 && o.head_dim >= 0, "MultiheadAttention: d_model ", o.d_model, " and nhead ",
            o.nhead, " must be positive");
  QKV_CHECK(o.head_dim > 0 || o.d_model % o.nhead == 0, "MultiheadAttention: d_model ", o.d_model,
            " is not divisible by nhead ", o.nhead, " (and no head_dim is given)");
  kv_heads_ = o.num_kv_heads > 0 ? o.num_kv_heads : o.nhead;
  QKV_CHECK(o.nhead % kv_heads_ == 0, "MultiheadAttention: nhead ", o.nhead, " is not a multiple of num_kv_heads ",
            kv_heads_);
  head_dim_ = o.head_dim > 0 ? o.head_dim : o.d_model / o.nhead;
  QKV_CHECK(!o.rotary || head_dim_ % 2 == 0, "MultiheadAttention: RoPE needs an even head dimension, got ", head_dim_);
  const bool fused = o.qkv_layout == QkvLayout::Fused;
  QKV_CHECK(!fused || o.bias.k == o.bias.v, "MultiheadAttention: a fused projection needs the same bias choice for k and v");
  QKV_CHECK(!fused || o.cross_attention || o.bias.q == o.bias.k,
            "MultiheadAttention: a fused projection needs the same bias choice for q, k and v");
  const int64_t q_rows = o.nhead * head_dim_, kv_rows = kv_heads_ * head_dim_;
  auto projection = [&](const char* name, int64_t out, bool bias) {
    auto l = register_module(name, std::make_shared<Linear>(LinearOptions{o.d_model, out, bias}, rng));
    xavier_uniform_(l->weight, rng);  // as torch.nn.MultiheadAttention's in_proj_weight
    if (l->bias.defined()) l->bias.detach().fill_(0.0f);
    return l;
  };
  if (!fused) {
    q_proj = projection("q_proj", q_rows, o.bias.q);
    k_proj = projection("k_proj", kv_rows, o.bias.k);
    v_proj = projection("v_proj", kv_rows, o.bias.v);
  } else if (o.cross_attention) {
    q_proj = projection("q_proj", q_rows, o.bias.q);
    kv_proj = projection("kv_proj", 2 * kv_rows, o.bias.k);
  } else {
    qkv_proj = projection("qkv_proj", q_rows + 2 * kv_rows, o.bias.q);
  }
  out_proj = register_module("out_proj", std::make_shared<Linear>(LinearOptions{q_rows, o.d_model, o.bias.out}, rng));
  if (out_proj->bias.defined()) out_proj->bias.detach().fill_(0.0f);
  if (o.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(head_dim_, o.qk_norm_eps));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(head_dim_, o.qk_norm_eps));
  }
}

std::vector<Tensor> MultiheadAttention::project_self(const Tensor& x) const {
  if (qkv_proj) {
    const int64_t qn = options_.nhead * head_dim_, kvn = kv_heads_ * head_dim_;
    return split(qkv_proj->forward(x), {qn, kvn, kvn}, -1);
  }
  return {q_proj->forward(x), k_proj->forward(x), v_proj->forward(x)};
}

Tensor MultiheadAttention::heads(const Tensor& x, int64_t count) const {
  return x.reshape({x.size(0), x.size(1), count, head_dim_}).permute({0, 2, 1, 3});
}

Tensor MultiheadAttention::prepare(const Tensor& h, const std::shared_ptr<RMSNorm>& norm, int64_t offset) const {
  Tensor out = norm ? norm->forward(h) : h;
  if (options_.rotary) out = rope(out, {.offset = offset, .theta = options_.rope_theta, .scaling = options_.rope_scaling});
  return out;
}

Tensor MultiheadAttention::project_q(const Tensor& x, int64_t position_offset) {
  QKV_CHECK(options_.cross_attention, "MultiheadAttention: project_q is for cross-attention modules");
  return prepare(heads(q_proj->forward(x), options_.nhead), q_norm, position_offset);
}

std::pair<Tensor, Tensor> MultiheadAttention::project_kv(const Tensor& memory, int64_t position_offset) {
  QKV_CHECK(options_.cross_attention, "MultiheadAttention: project_kv is for cross-attention modules");
  std::vector<Tensor> kv = kv_proj ? split(kv_proj->forward(memory), {kv_heads_ * head_dim_, kv_heads_ * head_dim_}, -1)
                                   : std::vector<Tensor>{k_proj->forward(memory), v_proj->forward(memory)};
  return {prepare(heads(kv[0], kv_heads_), k_norm, position_offset), heads(kv[1], kv_heads_)};
}

AttentionOptions MultiheadAttention::attention_options(const AttentionCall& call) {
  AttentionOptions o;
  o.causal = call.causal;
  o.key_padding_lengths = call.key_padding_lengths;
  o.attn_mask = call.attn_mask;
  if (is_training() && options_.dropout > 0.0f) {
    o.dropout = options_.dropout;
    o.rng = &dropout_rng_;
  }
  return o;
}

AttentionOutput MultiheadAttention::attend(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const AttentionCall& call) {
  const AttentionOptions o = attention_options(call);
  // Beams sharing a source: q has G rows per row of k and v (the G
  // hypotheses of one sentence). Without a mask their queries are
  // independent, so they become one block of G*T queries against the
  // sentence's keys, which are then stored and read once per sentence.
  const int64_t rows = k.size(0), G = q.size(0) / std::max<int64_t>(rows, 1);
  QKV_CHECK(rows > 0 && q.size(0) == rows * G, "MultiheadAttention: ", q.size(0), " query rows for ", rows,
            " key rows; expected a multiple");
  QKV_CHECK(G == 1 || (!call.causal && !call.attn_mask.defined()), "MultiheadAttention: queries sharing keys (",
            G, " per key row) cannot take a causal or explicit mask");
  const int64_t H = q.size(1), T = q.size(2), Dh = q.size(3);
  Tensor qb = G == 1 ? q : q.reshape({rows, G, H, T, Dh}).permute({0, 2, 1, 3, 4}).reshape({rows, H, G * T, Dh});
  auto unfold = [&](const Tensor& t) {  // [rows, H, G*T, X] -> [rows*G, H, T, X]
    if (G == 1) return t;
    const int64_t X = t.size(3);
    return t.reshape({rows, H, G, T, X}).permute({0, 2, 1, 3, 4}).reshape({rows * G, H, T, X});
  };
  AttentionOutput result;
  Tensor ctx;  // [B, H, T, Dh]
  if (call.need_weights) {
    AttentionWithWeights w = attention_with_weights(qb, k, v, o);
    ctx = unfold(w.out);
    result.weights = unfold(w.weights);
  } else {
    ctx = unfold(scaled_dot_product_attention(qb, k, v, o));
  }
  Tensor merged = ctx.permute({0, 2, 1, 3}).reshape({ctx.size(0), ctx.size(2), options_.nhead * head_dim_});
  result.out = project_out(merged, call.residual);
  return result;
}

Tensor MultiheadAttention::project_out(const Tensor& merged, const Tensor& residual) const {
  return residual.defined() ? out_proj->forward_add(merged, residual) : out_proj->forward(merged);
}

AttentionOutput MultiheadAttention::forward(const Tensor& x, const AttentionCall& call) {
  QKV_CHECK(!options_.cross_attention, "MultiheadAttention: a cross-attention module needs a memory");
  QKV_CHECK(x.dim() == 3 && x.size(-1) == options_.d_model, "MultiheadAttention: x must be [B, T, ",
            options_.d_model, "], got ", shape_str(x.shape()));
  if (qkv_proj && !q_norm && !options_.rotary && !call.need_weights) {  // nothing to do per head in between
    Tensor packed = qkv_proj->forward(x);
    return {
        project_out(packed_self_attention(packed, options_.nhead, kv_heads_, attention_options(call)), call.residual),
        {}};
  }
  std::vector<Tensor> qkv = project_self(x);
  Tensor q = prepare(heads(qkv[0], options_.nhead), q_norm, call.position_offset);
  Tensor k = prepare(heads(qkv[1], kv_heads_), k_norm, call.position_offset);
  return attend(q, k, heads(qkv[2], kv_heads_), call);
}

void MultiheadAttention::append(KVCache& cache, const Tensor& k, const Tensor& v) const {
  const int64_t start = cache.length, n = k.size(2);
  NoGradGuard no_grad;  // the cache holds values, not history
  cache.k.slice(2, start, start + n).copy_(prepare(k, k_norm, start));
  cache.v.slice(2, start, start + n).copy_(v);
  cache.length = start + n;
}

KVCache MultiheadAttention::make_cache(int64_t batch, int64_t capacity) const {
  QKV_CHECK(!options_.cross_attention, "MultiheadAttention: a KV cache is for self-attention");
  // Uninitialized: a position is written before it is read (nothing reads
  // past `length`), so a cache takes memory pages as it fills rather than
  // all of its capacity at once (qkv serve: 75 MB a stream for lm-100m's
  // 1,024 positions). The decoding tests fill caches with NaN to hold to it.
  return {Tensor::empty({batch, kv_heads_, capacity, head_dim_}), Tensor::empty({batch, kv_heads_, capacity, head_dim_}),
          0};
}

AttentionOutput MultiheadAttention::forward_cached(const Tensor& x, KVCache& cache, const AttentionCall& call) {
  QKV_CHECK(!options_.cross_attention, "MultiheadAttention: forward_cached is for self-attention");
  QKV_CHECK(x.dim() == 3 && x.size(-1) == options_.d_model && cache.k.defined() && x.size(0) == cache.k.size(0),
            "MultiheadAttention: x must be [B, T, ", options_.d_model, "] for a cache of batch ",
            cache.k.defined() ? cache.k.size(0) : 0);
  const int64_t t_new = x.size(1), start = cache.length;
  QKV_CHECK(start + t_new <= cache.capacity(), "KV cache full: ", start, " + ", t_new, " positions exceed its capacity ",
            cache.capacity());
  std::vector<Tensor> qkv = project_self(x);
  Tensor q = prepare(heads(qkv[0], options_.nhead), q_norm, start);
  append(cache, heads(qkv[1], kv_heads_), heads(qkv[2], kv_heads_));
  AttentionCall c = call;
  c.causal = true;  // bottom-right aligned: new query i sees cached keys up to start + i
  return attend(q, cache.k.slice(2, 0, cache.length), cache.v.slice(2, 0, cache.length), c);
}

AttentionOutput MultiheadAttention::forward_cached_rows(const Tensor& x, const std::vector<KVCache*>& caches,
                                                        const Tensor& residual) {
  QKV_CHECK(!options_.cross_attention, "MultiheadAttention: forward_cached_rows is for self-attention");
  const int64_t B = x.dim() == 3 ? x.size(0) : 0;
  QKV_CHECK(x.dim() == 3 && x.size(1) == 1 && x.size(-1) == options_.d_model && (size_t)B == caches.size(),
            "MultiheadAttention: x must be [B, 1, ", options_.d_model, "] with one cache per row, got ",
            shape_str(x.shape()), " and ", caches.size(), " caches");
  std::vector<Tensor> qkv = project_self(x);
  Tensor q = heads(qkv[0], options_.nhead), k = heads(qkv[1], kv_heads_), v = heads(qkv[2], kv_heads_);
  std::vector<Tensor> qs, keys, values;  // per row: its query [1, H, 1, Dh], its cache's valid rows
  for (int64_t b = 0; b < B; ++b) {
    KVCache& cache = *caches[(size_t)b];
    const int64_t start = cache.length;
    QKV_CHECK(cache.k.defined() && cache.k.size(0) == 1, "MultiheadAttention: row ", b, " needs a cache of batch 1");
    QKV_CHECK(start < cache.capacity(), "KV cache full: row ", b, " is at its capacity ", cache.capacity());
    append(cache, k.slice(0, b, b + 1), v.slice(0, b, b + 1));
    qs.push_back(prepare(q.slice(0, b, b + 1), q_norm, start));
    keys.push_back(cache.k.slice(2, 0, cache.length));
    values.push_back(cache.v.slice(2, 0, cache.length));
  }
  Tensor ctx = cached_rows_attention(concat(qs, 0), keys, values);  // [B, H, 1, Dh]
  Tensor merged = ctx.permute({0, 2, 1, 3}).reshape({B, 1, options_.nhead * head_dim_});
  return {project_out(merged, residual), {}};
}

AttentionOutput MultiheadAttention::forward_cached_packed(const Tensor& x, const std::vector<int64_t>& lengths,
                                                          const std::vector<KVCache*>& caches, const Tensor& residual) {
  QKV_CHECK(!options_.cross_attention, "MultiheadAttention: forward_cached_packed is for self-attention");
  int64_t N = 0;
  for (int64_t n : lengths) {
    QKV_CHECK(n >= 1, "MultiheadAttention: a packed sequence needs at least one position, got ", n);
    N += n;
  }
  QKV_CHECK(x.dim() == 3 && x.size(0) == 1 && x.size(1) == N && x.size(-1) == options_.d_model &&
                lengths.size() == caches.size(),
            "MultiheadAttention: x must be [1, N, ", options_.d_model, "] with N the sum of the lengths and one cache ",
            "per sequence, got ", shape_str(x.shape()), ", ", lengths.size(), " lengths summing to ", N, " and ",
            caches.size(), " caches");
  std::vector<Tensor> qkv = project_self(x);
  Tensor q = heads(qkv[0], options_.nhead), k = heads(qkv[1], kv_heads_), v = heads(qkv[2], kv_heads_);
  std::vector<Tensor> contexts;  // per sequence [1, H, n, Dh]
  int64_t at = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    KVCache& cache = *caches[b];
    const int64_t n = lengths[b], start = cache.length;
    QKV_CHECK(cache.k.defined() && cache.k.size(0) == 1, "MultiheadAttention: sequence ", b,
              " needs a cache of batch 1");
    QKV_CHECK(start + n <= cache.capacity(), "KV cache full: sequence ", b, "'s ", start, " + ", n,
              " positions exceed its capacity ", cache.capacity());
    append(cache, k.slice(2, at, at + n), v.slice(2, at, at + n));
    AttentionCall causal;
    causal.causal = true;  // bottom-right aligned, as in forward_cached
    contexts.push_back(scaled_dot_product_attention(prepare(q.slice(2, at, at + n), q_norm, start),
                                                    cache.k.slice(2, 0, cache.length),
                                                    cache.v.slice(2, 0, cache.length), attention_options(causal)));
    at += n;
  }
  Tensor ctx = contexts.size() == 1 ? contexts[0] : concat(contexts, 2);  // [1, H, N, Dh]
  Tensor merged = ctx.permute({0, 2, 1, 3}).reshape({1, N, options_.nhead * head_dim_});
  return {project_out(merged, residual), {}};
}

AttentionOutput MultiheadAttention::forward(const Tensor& x, const Tensor& memory, const AttentionCall& call) {
  QKV_CHECK(options_.cross_attention, "MultiheadAttention: a self-attention module takes no memory");
  QKV_CHECK(x.dim() == 3 && x.size(-1) == options_.d_model && memory.dim() == 3 &&
                memory.size(-1) == options_.d_model && memory.size(0) == x.size(0),
            "MultiheadAttention: x [B, T, D] and memory [B, S, D] with D = ", options_.d_model, ", got ",
            shape_str(x.shape()), " and ", shape_str(memory.shape()));
  auto [k, v] = project_kv(memory, 0);
  return attend(project_q(x, call.position_offset), k, v, call);
}

}  // namespace qkv
