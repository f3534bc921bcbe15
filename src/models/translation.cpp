// Batching, the training loss, greedy decoding.
#include <algorithm>
#include <limits>
#include <numeric>

#include "qkv/translation.h"

namespace qkv {

std::vector<int64_t> DecodingIds::source(std::vector<int64_t> ids) const {
  if (source_eos) ids.push_back(eos);
  return ids;
}

Batch collate(const std::vector<EncodedPair>& data, const std::vector<int64_t>& indices, const DecodingIds& ids) {
  const int64_t B = (int64_t)indices.size();
  int64_t S = 1, T = 1;
  for (int64_t i : indices) {
    S = std::max<int64_t>(S, (int64_t)data[i].src.size());
    T = std::max<int64_t>(T, (int64_t)data[i].tgt.size() + 1);
  }
  Batch b;
  b.src = Tensor::zeros({B, S}, DType::I64);
  b.src_lengths = Tensor::zeros({B}, DType::I64);
  b.tgt_in = Tensor::zeros({B, T}, DType::I64);
  b.tgt_out = Tensor::from_ints(std::vector<int64_t>(B * T, -100), {B, T});
  for (int64_t r = 0; r < B; ++r) {
    const EncodedPair& p = data[indices[r]];
    std::copy(p.src.begin(), p.src.end(), b.src.data<int64_t>() + r * S);
    b.src_lengths.data<int64_t>()[r] = std::max<int64_t>((int64_t)p.src.size(), 1);
    int64_t* in = b.tgt_in.data<int64_t>() + r * T;
    int64_t* out = b.tgt_out.data<int64_t>() + r * T;
    in[0] = ids.start;
    for (size_t t = 0; t < p.tgt.size(); ++t) {
      in[t + 1] = p.tgt[t];
      out[t] = p.tgt[t];
    }
    out[p.tgt.size()] = ids.eos;
    b.target_tokens += (int64_t)p.tgt.size() + 1;
  }
  return b;
}

std::vector<std::vector<int64_t>> make_batches(const std::vector<EncodedPair>& data, int64_t batch_tokens, Rng& rng) {
  std::vector<int64_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  // Shuffle first so equal lengths land in different batches each epoch, then sort by length.
  for (int64_t i = (int64_t)order.size() - 1; i > 0; --i) std::swap(order[i], order[rng.next_below(i + 1)]);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::max(data[a].src.size(), data[a].tgt.size() + 1) < std::max(data[b].src.size(), data[b].tgt.size() + 1);
  });
  std::vector<std::vector<int64_t>> batches;
  std::vector<int64_t> cur;
  int64_t longest = 0;
  for (int64_t i : order) {
    int64_t len = (int64_t)std::max(data[i].src.size(), data[i].tgt.size() + 1);
    if (!cur.empty() && std::max(longest, len) * (int64_t)(cur.size() + 1) > batch_tokens) {
      batches.push_back(std::move(cur));
      cur.clear();
      longest = 0;
    }
    cur.push_back(i);
    longest = std::max(longest, len);
  }
  if (!cur.empty()) batches.push_back(std::move(cur));
  for (int64_t i = (int64_t)batches.size() - 1; i > 0; --i) std::swap(batches[i], batches[rng.next_below(i + 1)]);
  return batches;
}

Tensor translation_loss(Seq2Seq& model, const Batch& b, float label_smoothing) {
  Tensor logits = model.forward(b.src, b.src_lengths, b.tgt_in);
  const int64_t V = logits.size(-1);
  Tensor loss = cross_entropy(logits.reshape({-1, V}), b.tgt_out.reshape({-1}),
                              {.ignore_index = -100, .label_smoothing = label_smoothing});
  Tensor aux = model.aux_loss();
  return aux.defined() ? add(loss, aux) : loss;
}

int64_t DecodingIds::best_output(const float* logits, int64_t vocab) const {
  int64_t best = -1;
  for (int64_t v = 0; v < vocab; ++v)
    if (!never_output(v) && (best < 0 || logits[v] > logits[best])) best = v;
  return best;
}

void check_max_len(int64_t max_len) {
  QKV_CHECK(max_len >= 1 && max_len <= kMaxDecodeLength, "decoding: max-len ", max_len, ": expected 1 to ",
            kMaxDecodeLength, " output tokens");
}

void TokenRules::apply(std::span<const int64_t> prefix, std::span<const int64_t> outputs, std::span<const int64_t> eos,
                       float* scores, int64_t vocab) const {
  if (empty()) return;
  std::vector<int64_t> sequence(prefix.begin(), prefix.end());
  sequence.insert(sequence.end(), outputs.begin(), outputs.end());
  const int64_t* seq = sequence.data();
  const int64_t n = (int64_t)sequence.size();
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  if (repetition_penalty != 1.0f) {  // each id once, however often it came
    std::vector<int64_t> seen(seq, seq + n);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int64_t id : seen) {
      if (id < 0 || id >= vocab) continue;
      float& s = scores[id];
      s = s < 0 ? s * repetition_penalty : s / repetition_penalty;
    }
  }
  if (const int64_t g = no_repeat_ngram_size; g > 0 && n + 1 >= g) {
    // Every n-gram of the sequence whose first g - 1 ids are its last g - 1
    // bans its last id (g = 1: every id of the sequence).
    const int64_t* tail = seq + n - (g - 1);
    for (int64_t i = 0; i + g <= n; ++i)
      if (std::equal(tail, seq + n, seq + i) && seq[i + g - 1] >= 0 && seq[i + g - 1] < vocab)
        scores[seq[i + g - 1]] = kBanned;
  }
  const auto is_eos = [&](int64_t id) { return std::find(eos.begin(), eos.end(), id) != eos.end(); };
  for (const std::vector<int64_t>& w : bad_words) {
    if (w.size() == 1 && is_eos(w[0])) continue;
    for (int64_t id : w)
      QKV_CHECK(id >= 0 && id < vocab, "generation_config.json: bad_words_ids: id ", id, " is past the vocabulary of ",
                vocab);
    const int64_t prefix = (int64_t)w.size() - 1;
    if (prefix <= n && std::equal(w.begin(), w.end() - 1, seq + n - prefix)) scores[w.back()] = kBanned;
  }
  if (n < min_length || (int64_t)outputs.size() < min_new_tokens)
    for (int64_t id : eos)
      if (id >= 0 && id < vocab) scores[id] = kBanned;
}

std::vector<std::vector<int64_t>> greedy_translate(Seq2Seq& model, const std::vector<std::vector<int64_t>>& sources,
                                                   int64_t max_len, int64_t batch_size, const TokenRules& rules) {
  check_max_len(max_len);
  QKV_CHECK(batch_size >= 1, "greedy decoding: batch size must be at least 1, got ", batch_size);
  NoGradGuard no_grad;
  std::vector<std::vector<int64_t>> results(sources.size());
  for (size_t start = 0; start < sources.size(); start += batch_size) {
    const size_t end = std::min(sources.size(), start + batch_size);
    std::vector<EncodedPair> chunk;
    std::vector<int64_t> idx;
    for (size_t i = start; i < end; ++i) {
      chunk.push_back({sources[i], {}});
      idx.push_back((int64_t)(i - start));
    }
    const DecodingIds ids = model.decoding_ids();
    Batch b = collate(chunk, idx, ids);
    const int64_t B = (int64_t)chunk.size();
    // The encoder runs once; each step feeds one token per sentence through
    // the cached decoder. Finished sentences leave the batch once a quarter
    // of the rows have finished (one gather for several of them).
    std::unique_ptr<DecodeState> state = model.start_decoding(b.src, b.src_lengths, max_len + 1);
    std::vector<int64_t> rows(B), next(B, ids.start);  // rows[r]: the sentence at state row r
    for (int64_t r = 0; r < B; ++r) rows[r] = r;
    std::vector<bool> done(B, false);
    int64_t finished_rows = 0;
    for (int64_t step = 0; step < max_len && !rows.empty(); ++step) {
      const int64_t R = (int64_t)rows.size();
      Tensor logits = model.decode_step(Tensor::from_ints(next, {R, 1}), *state);
      const int64_t V = logits.size(-1);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t s = rows[r];
        float* row = logits.data<float>() + r * V;
        if (!done[s]) rules.apply({&ids.start, 1}, results[start + s], {&ids.eos, 1}, row, V);
        next[r] = done[s] ? ids.pad : ids.next_output(row, V, step == max_len - 1);
        if (done[s]) continue;
        if (next[r] == ids.eos) {
          done[s] = true, ++finished_rows;
        } else {
          results[start + s].push_back(next[r]);
        }
      }
      if (finished_rows == R || finished_rows * 4 >= R) {
        std::vector<int64_t> keep, kept_rows, kept_next;
        for (int64_t r = 0; r < R; ++r)
          if (!done[rows[r]]) keep.push_back(r), kept_rows.push_back(rows[r]), kept_next.push_back(next[r]);
        rows = kept_rows, next = kept_next, finished_rows = 0;
        if (!rows.empty()) model.select_rows(*state, keep);
      }
    }
  }
  return results;
}

AlignedTranslation translate_with_attention(Seq2Seq& model, const std::vector<int64_t>& source, int64_t max_len,
                                            const TokenRules& rules) {
  check_max_len(max_len);
  NoGradGuard no_grad;
  const DecodingIds ids = model.decoding_ids();
  Batch b = collate({{source, {}}}, {0}, ids);
  std::unique_ptr<DecodeState> state = model.start_decoding(b.src, b.src_lengths, max_len + 1);
  AlignedTranslation out;
  out.source_length = b.src.size(1);
  std::vector<std::vector<float>> by_step;  // [L, H, S] per output token
  int64_t next = ids.start;
  for (int64_t step = 0; step < max_len; ++step) {
    Tensor logits = model.decode_step(Tensor::from_ints({next}, {1, 1}), *state, /*need_weights=*/true);
    std::vector<float> row = model.cross_weights().to_vector();  // [1, S]
    out.weights.insert(out.weights.end(), row.begin(), row.end());
    if (Tensor h = model.cross_weights_by_head(); h.defined()) {  // [L, H, S] this step
      out.layers = h.size(0), out.nheads = h.size(1);
      by_step.push_back(h.contiguous().to_vector());
    }
    rules.apply({&ids.start, 1}, out.tokens, {&ids.eos, 1}, logits.data<float>(), logits.size(-1));
    next = ids.next_output(logits.data<float>(), logits.size(-1), step == max_len - 1);
    out.tokens.push_back(next);
    if (next == ids.eos) break;
  }
  if (!by_step.empty()) {  // [T][L, H, S] -> [L, H, T, S]
    const int64_t T = (int64_t)by_step.size(), S = out.source_length;
    out.heads.resize((size_t)(out.layers * out.nheads * T * S));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t lh = 0; lh < out.layers * out.nheads; ++lh)
        std::copy_n(by_step[(size_t)t].begin() + lh * S, S, out.heads.begin() + (lh * T + t) * S);
  }
  std::vector<int64_t> inputs = {ids.start};  // what the decoder read: the start token, then its own outputs
  inputs.insert(inputs.end(), out.tokens.begin(), out.tokens.end() - 1);
  const AttentionWeights w =
      model.attention_weights(b.src, b.src_lengths, Tensor::from_ints(inputs, {1, (int64_t)inputs.size()}));
  const auto stacked = [](const std::vector<Tensor>& layers) {  // L x [1, H, n, m] -> [L, H, n, m]
    return layers.empty() ? Tensor() : concat(layers, 0).contiguous();
  };
  out.encoder_self = stacked(w.encoder);
  out.decoder_self = stacked(w.decoder);
  return out;
}

}  // namespace qkv
