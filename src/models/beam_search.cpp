// Beam search for the translation Transformer.
//
// Each sentence keeps `beam` hypotheses. A step scores every continuation of
// every live hypothesis, score(y_1..t) = sum log p(y_i | y_<i, x), keeps the
// `beam` best that do not end, and sets aside those that end with <eos> as
// finished, ranked by the length-normalized score / (length ^ length_penalty).
// A sentence is done when it has `beam` finished hypotheses or reaches
// max_len, and then leaves the batch. The encoder runs once per sentence and
// its cross-attention K/V are computed once and read by all its beams (the
// Transformer keeps them once per sentence); the self-attention caches
// follow their hypotheses by a row gather after each step.
#include <algorithm>
#include <cmath>
#include <limits>

#include "qkv/translation.h"

namespace qkv {
namespace {

struct Hypothesis {
  std::vector<int64_t> tokens;
  double score = 0;
};

// The n best tokens of one row of log-probabilities, best first, those the
// model never outputs left out. One pass with a small sorted buffer: most
// values fall below its last entry and cost one comparison.
void best_tokens(const float* row, int64_t vocab, size_t n, const DecodingIds& ids,
                 std::vector<std::pair<float, int64_t>>& out) {
  out.clear();
  for (int64_t v = 0; v < vocab; ++v) {
    if (out.size() == n && !(row[v] > out.back().first)) continue;
    if (ids.never_output(v)) continue;
    if (out.size() == n) out.pop_back();
    auto at = std::upper_bound(out.begin(), out.end(), row[v], [](float x, const auto& e) { return x > e.first; });
    out.insert(at, {row[v], v});
  }
}

}  // namespace

std::vector<BeamHypothesis> beam_translate(Seq2Seq& model, const std::vector<std::vector<int64_t>>& sources,
                                           int64_t max_len, const BeamOptions& o) {
  QKV_CHECK(o.beam >= 1 && o.batch_size >= 1, "beam search: beam and batch size must be at least 1, got ", o.beam,
            " and ", o.batch_size);
  check_max_len(max_len);
  NoGradGuard no_grad;
  const int64_t K = o.beam;
  const DecodingIds ids = model.decoding_ids();
  std::vector<BeamHypothesis> results(sources.size());
  for (size_t start = 0; start < sources.size(); start += o.batch_size) {
    const int64_t B = (int64_t)std::min<size_t>(o.batch_size, sources.size() - start);
    std::vector<EncodedPair> chunk;
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < B; ++i) chunk.push_back({sources[start + i], {}}), idx.push_back(i);
    Batch b = collate(chunk, idx, ids);
    // The encoder once per sentence; then each sentence becomes K rows, which
    // share the sentence's cross-attention K/V where the model allows it.
    std::unique_ptr<DecodeState> beams = model.start_decoding(b.src, b.src_lengths, max_len + 1);
    model.expand_beams(*beams, B, K);

    std::vector<std::vector<Hypothesis>> alive(B), finished(B);
    for (int64_t s = 0; s < B; ++s) {
      alive[s].assign(K, Hypothesis{});
      for (int64_t k = 1; k < K; ++k) alive[s][k].score = -std::numeric_limits<double>::infinity();  // one start
    }
    // The sentences still searching, in the order of their rows in the state:
    // a sentence with K finished hypotheses leaves the batch.
    std::vector<int64_t> active(B);
    for (int64_t s = 0; s < B; ++s) active[s] = s;
    std::vector<int64_t> last(B * K, ids.start);
    for (int64_t step = 0; step < max_len && !active.empty(); ++step) {
      const int64_t A = (int64_t)active.size();
      Tensor logp = log_softmax(model.decode_step(Tensor::from_ints(last, {A * K, 1}), *beams));
      const int64_t V = logp.size(-1);
      const float* lp = logp.data<float>();
      std::vector<int64_t> still_active, origin, next_last;
      std::vector<std::pair<float, int64_t>> row_best;
      for (int64_t a = 0; a < A; ++a) {
        const int64_t s = active[a];
        // The best 2K continuations are enough: at most K of them end with
        // <eos>. They are among the best 2K tokens of each beam's row.
        std::vector<std::pair<double, int64_t>> cand;  // (score, beam * V + token)
        for (int64_t k = 0; k < K; ++k) {
          if (!std::isfinite(alive[s][k].score)) continue;
          best_tokens(lp + (a * K + k) * V, V, 2 * K, ids, row_best);
          for (const auto& [logp_v, v] : row_best) cand.push_back({alive[s][k].score + logp_v, k * V + v});
        }
        const size_t keep = std::min<size_t>(cand.size(), 2 * K);
        std::partial_sort(cand.begin(), cand.begin() + keep, cand.end(),
                          [](auto& x, auto& y) { return x.first > y.first; });
        std::vector<Hypothesis> next;
        std::vector<int64_t> next_origin, next_token;
        for (size_t c = 0; c < keep && (int64_t)next.size() < K; ++c) {
          const int64_t k = cand[c].second / V, v = cand[c].second % V;
          Hypothesis h = alive[s][k];
          h.score = cand[c].first;
          if (v == ids.eos) {
            if ((int64_t)finished[s].size() < K) finished[s].push_back(h);
            continue;
          }
          h.tokens.push_back(v);
          next.push_back(h);
          next_origin.push_back(a * K + k);
          next_token.push_back(v);
        }
        while ((int64_t)next.size() < K) {  // too few live continuations: pad with dead beams
          next.push_back(Hypothesis{{}, -std::numeric_limits<double>::infinity()});
          next_origin.push_back(a * K);
          next_token.push_back(ids.pad);
        }
        alive[s] = next;
        const bool live = std::any_of(next.begin(), next.end(), [](auto& h) { return std::isfinite(h.score); });
        if ((int64_t)finished[s].size() >= K || !live) continue;  // done: its rows leave
        still_active.push_back(s);
        origin.insert(origin.end(), next_origin.begin(), next_origin.end());
        next_last.insert(next_last.end(), next_token.begin(), next_token.end());
      }
      active = still_active;
      last = next_last;
      if (!active.empty()) model.select_rows(*beams, origin);  // caches follow their hypotheses
    }
    for (int64_t s = 0; s < B; ++s) {
      auto normalized = [&](const Hypothesis& h) {
        return h.score / std::pow((double)h.tokens.size() + 1, (double)o.length_penalty);  // +1: the <eos>
      };
      const Hypothesis* best = nullptr;
      for (auto& h : finished[s])
        if (!best || normalized(h) > normalized(*best)) best = &h;
      if (!best)  // nothing ended within max_len: the best live hypothesis
        for (auto& h : alive[s])
          if (std::isfinite(h.score) && (!best || h.score > best->score)) best = &h;
      if (best) results[start + s] = {best->tokens, best->score};
    }
  }
  return results;
}

}  // namespace qkv
