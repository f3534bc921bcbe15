// Scaled dot-product attention: the naive path (composed of differentiable
// ops; the reference) and the flash path (fused kernels, forward and backward).
#include "qkv/attention.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "src/ops/dispatch.h"

namespace qkv {
namespace {

struct Dims {
  int64_t batch, heads, kv_heads, t, s, dh, dv;
};

Dims check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  require_f32(q, "attention", "q");
  require_f32(k, "attention", "k");
  require_f32(v, "attention", "v");
  QKV_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: q, k, v must be [B, H, T, Dh], got ",
            shape_str(q.shape()), ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
  Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  QKV_CHECK(k.size(0) == d.batch && v.size(0) == d.batch && v.size(1) == d.kv_heads && v.size(2) == d.s &&
                k.size(3) == d.dh,
            "attention: shapes do not agree: q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ",
            shape_str(v.shape()), " (expected q [B,H,T,Dh], k [B,Hkv,S,Dh], v [B,Hkv,S,Dv])");
  QKV_CHECK(d.kv_heads > 0 && d.heads % d.kv_heads == 0, "attention: ", d.heads,
            " query heads are not a multiple of ", d.kv_heads, " key/value heads");
  if (o.key_padding_lengths.defined()) {
    const Tensor& len = o.key_padding_lengths;
    QKV_CHECK((len.dtype() == DType::I64 || len.dtype() == DType::I32) && len.shape() == Shape{d.batch},
              "attention: key_padding_lengths must be I64 [", d.batch, "], got ", dtype_name(len.dtype()), " ",
              shape_str(len.shape()));
    for (int64_t n : len.to_ints())
      QKV_CHECK(n >= 0 && n <= d.s, "attention: key padding length ", n, " outside [0, ", d.s, "]");
  }
  if (o.attn_mask.defined()) {
    QKV_CHECK(o.attn_mask.dtype() == DType::U8 || o.attn_mask.dtype() == DType::F32,
              "attention: attn_mask must be U8 (nonzero = masked) or F32 (additive)");
    Shape full{d.batch, d.heads, d.t, d.s};
    QKV_CHECK(broadcast_shapes(full, o.attn_mask.shape()) == full, "attention: attn_mask of shape ",
              shape_str(o.attn_mask.shape()), " does not broadcast to [B,H,T,S] = ", shape_str(full));
  }
  return d;
}

float scale_of(const AttentionOptions& o, const Dims& d) {
  return o.scale > 0 ? o.scale : 1.0f / std::sqrt((float)d.dh);
}

// U8 [B or 1, 1, T, S]: 1 where the causal or padding mask hides a key; undefined if neither applies.
Tensor structural_mask(const Dims& d, const AttentionOptions& o) {
  if (!o.causal && !o.key_padding_lengths.defined()) return Tensor();
  const int64_t mb = o.key_padding_lengths.defined() ? d.batch : 1;
  Tensor mask = Tensor::zeros({mb, 1, d.t, d.s}, DType::U8);
  uint8_t* p = mask.data<uint8_t>();
  std::vector<int64_t> lengths = o.key_padding_lengths.defined() ? o.key_padding_lengths.to_ints()
                                                                 : std::vector<int64_t>{d.s};
  for (int64_t b = 0; b < mb; ++b)
    for (int64_t i = 0; i < d.t; ++i)
      for (int64_t j = 0; j < d.s; ++j)
        p[(b * d.t + i) * d.s + j] = j >= lengths[b] || (o.causal && j > i + d.s - d.t);
  return mask;
}

// The layout to read k or v [B, Hkv, S, D] in place, if it has one the kernel
// reads (rows contiguous, any spacing of rows, heads and batches: the valid
// rows of a KV cache qualify).
std::optional<FlashLayout> readable_layout(const Tensor& t) {
  const Shape& st = t.strides();
  if (st[3] != 1 || st[2] < t.size(3) || st[1] < 0 || st[0] < 0) return std::nullopt;
  return FlashLayout{st[0], st[1], st[2]};
}

// The kernel's shape for contiguous operands; `lengths` (I64, or undefined) must outlive its use.
FlashShape flash_shape(const Dims& d, const AttentionOptions& o, const Tensor& lengths) {
  FlashShape f{d.batch, d.heads, d.kv_heads, d.t, d.s, d.dh, d.dv};
  f.scale = scale_of(o, d), f.causal = o.causal;
  f.key_lengths = lengths.defined() ? lengths.data<int64_t>() : nullptr;
  // Recorded with the op: its backward multiplies the same way.
  f.bf16 = bf16_autocast() && d.t >= kBf16AttentionLength && d.s >= kBf16AttentionLength;
  return f;
}

Tensor key_lengths_i64(const AttentionOptions& o) {
  return o.key_padding_lengths.defined() ? o.key_padding_lengths.to(DType::I64).contiguous() : Tensor();
}

Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const Dims& d) {
  // Without a gradient to compute, a strided k/v (the valid rows of a KV cache) is read where it lies.
  const bool inference = !any_requires_grad({q, k, v});
  const auto k_layout = inference ? readable_layout(k) : std::nullopt;
  const auto v_layout = inference ? readable_layout(v) : std::nullopt;
  Tensor qc = contiguous_values(q);
  Tensor kc = k_layout ? k.detach() : contiguous_values(k), vc = v_layout ? v.detach() : contiguous_values(v);
  Tensor lengths = key_lengths_i64(o);
  FlashShape f = flash_shape(d, o, lengths);
  if (k_layout) f.k = *k_layout;
  if (v_layout) f.v = *v_layout;
  Tensor out = Tensor::empty({d.batch, d.heads, d.t, d.dv});
  Tensor lse = inference ? Tensor() : Tensor::empty({d.batch, d.heads, d.t});  // for the backward only
  QKV_KERNEL(flash_attention_forward)(f, qc.data<float>(), kc.data<float>(), vc.data<float>(),
                                         out.data<float>(), inference ? nullptr : lse.data<float>());
  record_op(out, "flash_attention", {q, k, v}, [qc, kc, vc, lse, lengths, f](const BackwardArgs& a) -> std::vector<Tensor> {
    Tensor dout = a.grad_out.contiguous();
    Tensor dq = Tensor::empty(qc.shape()), dk = Tensor::empty(kc.shape()), dv = Tensor::empty(vc.shape());
    FlashShape fb = f;
    fb.key_lengths = lengths.defined() ? lengths.data<int64_t>() : nullptr;
    QKV_KERNEL(flash_attention_backward)(fb, qc.data<float>(), kc.data<float>(), vc.data<float>(),
                                            a.out.data<float>(), dout.data<float>(), lse.data<float>(),
                                            dq.data<float>(), dk.data<float>(), dv.data<float>());
    return {dq, dk, dv};
  });
  return out;
}

// Flash unless asked for the naive path or given what only it supports.
bool use_flash(const AttentionOptions& o) {
  const bool flash = o.impl == AttentionImpl::Flash ||
                     (o.impl == AttentionImpl::Auto && !o.attn_mask.defined() && o.dropout == 0.0f);
  QKV_CHECK(!(flash && (o.attn_mask.defined() || o.dropout > 0.0f)),
            "attention: the flash path supports causal and key padding masks, not attn_mask or dropout; "
            "use AttentionImpl::Naive or Auto");
  return flash;
}

AttentionWithWeights naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                     const Dims& d) {
  const int64_t G = d.heads / d.kv_heads;
  // Group the G query heads of each key/value head into one product.
  Tensor qg = q.reshape({d.batch, d.kv_heads, G * d.t, d.dh});
  Tensor scores = scale(matmul(qg, k.transpose(-1, -2)), scale_of(o, d)).reshape({d.batch, d.heads, d.t, d.s});
  if (o.attn_mask.defined()) {
    scores = o.attn_mask.dtype() == DType::F32 ? add(scores, o.attn_mask) : masked_fill(scores, o.attn_mask, -INFINITY);
  }
  if (Tensor m = structural_mask(d, o); m.defined()) scores = masked_fill(scores, m, -INFINITY);
  Tensor weights = softmax(scores);
  Tensor mixed = weights;
  if (o.dropout > 0.0f) {
    QKV_CHECK(o.rng != nullptr, "attention: dropout needs an rng");
    mixed = dropout(weights, *o.rng, {.p = o.dropout, .training = true});
  }
  Tensor out = matmul(mixed.reshape({d.batch, d.kv_heads, G * d.t, d.s}), v).reshape({d.batch, d.heads, d.t, d.dv});
  return {out, weights};
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  Dims d = check_attention(q, k, v, o);
  if (use_flash(o)) return flash_attention(q, k, v, o, d);
  return naive_attention(q, k, v, o, d).out;
}

Tensor cached_rows_attention(const Tensor& q, const std::vector<Tensor>& keys, const std::vector<Tensor>& values,
                             float scale) {
  require_f32(q, "attention", "q");
  const int64_t B = q.dim() == 4 ? q.size(0) : 0;
  QKV_CHECK(q.dim() == 4 && q.size(2) == 1 && B > 0 && keys.size() == (size_t)B && values.size() == (size_t)B,
            "cached_rows_attention: q must be [B, H, 1, Dh] with one cache's keys and values per row, got q ",
            shape_str(q.shape()), ", ", keys.size(), " keys, ", values.size(), " values");
  const AttentionOptions o{.scale = scale};
  std::vector<int64_t> lengths(B);
  for (int64_t b = 0; b < B; ++b) {
    Dims d = check_attention(q.slice(0, b, b + 1), keys[b], values[b], o);
    QKV_CHECK(keys[b].size(0) == 1 && d.kv_heads == keys[0].size(1) && d.dv == values[0].size(3),
              "cached_rows_attention: row ", b, "'s keys ", shape_str(keys[b].shape()), " and values ",
              shape_str(values[b].shape()), " differ from row 0's ", shape_str(keys[0].shape()), " and ",
              shape_str(values[0].shape()), " in more than their length");
    lengths[b] = d.s;
  }
  // One kernel call: each row's keys and values read where they lie, all with one layout.
  std::vector<Tensor> inputs = keys;
  inputs.insert(inputs.end(), values.begin(), values.end());
  inputs.push_back(q);
  std::optional<FlashLayout> k_layout = readable_layout(keys[0]), v_layout = readable_layout(values[0]);
  for (int64_t b = 1; b < B && k_layout && v_layout; ++b) {
    const auto kb = readable_layout(keys[b]), vb = readable_layout(values[b]);
    if (!kb || !vb || kb->head != k_layout->head || kb->row != k_layout->row || vb->head != v_layout->head ||
        vb->row != v_layout->row)
      k_layout.reset();
  }
  if (!k_layout || !v_layout || any_requires_grad(inputs) || bf16_autocast()) {
    std::vector<Tensor> out;
    for (int64_t b = 0; b < B; ++b)
      out.push_back(scaled_dot_product_attention(q.slice(0, b, b + 1), keys[b], values[b], o));
    return concat(out, 0);
  }
  const Dims d{B,         q.size(1),        keys[0].size(1), 1, *std::max_element(lengths.begin(), lengths.end()),
               q.size(3), values[0].size(3)};
  Tensor qc = q.contiguous();
  std::vector<const float*> k_batches(B), v_batches(B);
  for (int64_t b = 0; b < B; ++b) k_batches[b] = keys[b].data<float>(), v_batches[b] = values[b].data<float>();
  FlashShape f{d.batch, d.heads, d.kv_heads, d.t, d.s, d.dh, d.dv};
  f.scale = scale_of(o, d), f.key_lengths = lengths.data();
  f.k = *k_layout, f.v = *v_layout, f.k_batches = k_batches.data(), f.v_batches = v_batches.data();
  Tensor out = Tensor::empty({d.batch, d.heads, 1, d.dv});
  QKV_KERNEL(flash_attention_forward)(f, qc.data<float>(), nullptr, nullptr, out.data<float>(), nullptr);
  return out;
}

Tensor packed_self_attention(const Tensor& qkv, int64_t heads, int64_t kv_heads, const AttentionOptions& o) {
  require_f32(qkv, "attention", "qkv");
  QKV_CHECK(qkv.dim() == 3 && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 &&
                qkv.size(2) % (heads + 2 * kv_heads) == 0,
            "attention: packed qkv must be [B, T, (H + 2 Hkv) Dh] with H a multiple of Hkv; got ",
            shape_str(qkv.shape()), " for H = ", heads, ", Hkv = ", kv_heads);
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2), Dh = C / (heads + 2 * kv_heads);
  QKV_CHECK(Dh > 0, "attention: packed qkv has no head dimension: ", shape_str(qkv.shape()));
  // Heads [from, from + count) of x4 ([B, T, H + 2 Hkv, Dh]: the packed rows
  // split into their heads, a view of a contiguous x; slicing the rows first
  // and then splitting made reshape copy every slice) as [B, count, T, Dh].
  auto heads_of = [&](const Tensor& x) { return x.reshape({B, T, heads + 2 * kv_heads, Dh}); };
  auto split_heads = [&](const Tensor& x4, int64_t from, int64_t count) {
    return x4.slice(2, from, from + count).permute({0, 2, 1, 3});
  };
  if (!use_flash(o)) {  // the composed path: the same ops a caller would write
    const Tensor x4 = heads_of(qkv);
    Tensor out = scaled_dot_product_attention(split_heads(x4, 0, heads), split_heads(x4, heads, kv_heads),
                                              split_heads(x4, heads + kv_heads, kv_heads), o);
    return out.permute({0, 2, 1, 3}).reshape({B, T, heads * Dh});
  }
  // Shapes and masks checked as for the unpacked call (views of detached values: nothing recorded).
  const Tensor values = heads_of(qkv.detach());
  const Dims d = check_attention(split_heads(values, 0, heads), split_heads(values, heads, kv_heads),
                                 split_heads(values, heads + kv_heads, kv_heads), o);
  Tensor packed = contiguous_values(qkv);
  Tensor lengths = key_lengths_i64(o);
  FlashShape f = flash_shape(d, o, lengths);
  f.q = {T * C, Dh, C};  // heads side by side on each packed row
  f.k = f.v = f.q;
  f.o = {T * heads * Dh, Dh, heads * Dh};
  Tensor out = Tensor::empty({B, T, heads * Dh});
  const bool inference = !any_requires_grad({qkv});
  Tensor lse = inference ? Tensor() : Tensor::empty({B, heads, T});  // for the backward only
  const float* base = packed.data<float>();
  QKV_KERNEL(flash_attention_forward)(f, base, base + heads * Dh, base + (heads + kv_heads) * Dh,
                                         out.data<float>(), inference ? nullptr : lse.data<float>());
  record_op(out, "packed_self_attention", {qkv}, [packed, lse, lengths, f, heads, kv_heads, Dh](const BackwardArgs& a) {
    Tensor dout = a.grad_out.contiguous();
    Tensor dqkv = Tensor::empty(packed.shape());  // the kernel writes all of q, k and v
    FlashShape fb = f;
    fb.key_lengths = lengths.defined() ? lengths.data<int64_t>() : nullptr;
    const float* p = packed.data<float>();
    float* dp = dqkv.data<float>();
    const int64_t k_at = heads * Dh, v_at = (heads + kv_heads) * Dh;
    QKV_KERNEL(flash_attention_backward)(fb, p, p + k_at, p + v_at, a.out.data<float>(), dout.data<float>(),
                                            lse.data<float>(), dp, dp + k_at, dp + v_at);
    return std::vector<Tensor>{dqkv};
  });
  return out;
}

AttentionWithWeights attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const AttentionOptions& o) {
  return naive_attention(q, k, v, o, check_attention(q, k, v, o));
}

}  // namespace qkv
