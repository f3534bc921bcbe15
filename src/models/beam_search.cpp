// Beam search for the translation Transformer, ranked as transformers'
// generate() ranks (num_beams, length_penalty, early_stopping).
//
// Each sentence keeps `beam` running hypotheses, score(y_1..t) = sum log p(y_i
// | y_<i, x). A step takes the 2 * beam best continuations of them all. Of
// the first `beam`, those that end (with <eos>, or at the length limit) are
// finished, ranked by score / (tokens, <eos> included) ^ length_penalty; the
// `beam` best finished ones are kept. The `beam` best continuations that do
// not end run on. A sentence is done when it holds `beam` finished
// hypotheses and the best running score, normalized by the current length,
// is no better than the worst finished one (the running scores only fall),
// or at the length limit, where every hypothesis ends; then it leaves the
// batch, and its best finished hypothesis is the translation. (That is
// early_stopping false; with true a sentence is done once `beam` have
// finished, and with "never" and a positive length_penalty the best running
// score is normalized by max_len, the longest it could grow to.) With the
// model's forced_eos the last step allows only <eos>, at log-probability 0.
// BeamOptions::rules (generate()'s logits processors) change each beam's
// log-probabilities before the continuations are chosen, and the changed
// values are what the scores add, as in generate().
// The encoder runs once per sentence and its cross-attention K/V are computed
// once and read by all its beams (the Transformer keeps them once per
// sentence); the self-attention caches follow their hypotheses by a row
// gather after each step.
#include <algorithm>
#include <cmath>
#include <limits>

#include "qkv/translation.h"

namespace qkv {
namespace {

struct Hypothesis {
  std::vector<int64_t> tokens;  // without <eos>
  double score = 0;             // sum of the log-probabilities, the <eos> included
  int64_t length = 0;           // finished: the tokens it is normalized by, the <eos> included
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

    std::vector<std::vector<Hypothesis>> alive(B), finished(B);  // finished: best normalized first
    for (int64_t s = 0; s < B; ++s) {
      alive[s].assign(K, Hypothesis{});
      for (int64_t k = 1; k < K; ++k) alive[s][k].score = -std::numeric_limits<double>::infinity();  // one start
    }
    const auto normalized = [&](const Hypothesis& h, int64_t length) {
      return h.score / std::pow((double)length, (double)o.length_penalty);
    };
    // The sentences still searching, in the order of their rows in the state.
    std::vector<int64_t> active(B);
    for (int64_t s = 0; s < B; ++s) active[s] = s;
    std::vector<int64_t> last(B * K, ids.start);
    std::vector<std::vector<std::pair<float, int64_t>>> row_best;  // per row: its best 2K tokens
    for (int64_t step = 0; step < max_len && !active.empty(); ++step) {
      const bool last_step = step == max_len - 1;  // every hypothesis ends here
      const bool only_eos = last_step && ids.forced_eos;
      const int64_t A = (int64_t)active.size();
      Tensor logp = log_softmax(model.decode_step(Tensor::from_ints(last, {A * K, 1}), *beams));
      const int64_t V = logp.size(-1);
      float* lp = logp.data<float>();
      // Each live row through o.rules, then its best 2K tokens: the rows
      // apart, so split between the threads (a row's answer is the same on
      // any thread; the rules run first, on this one, since they may throw).
      const auto live = [&](int64_t r) { return !only_eos && std::isfinite(alive[active[r / K]][r % K].score); };
      for (int64_t r = 0; r < A * K; ++r)
        if (live(r)) o.rules.apply({&ids.start, 1}, alive[active[r / K]][r % K].tokens, {&ids.eos, 1}, lp + r * V, V);
      row_best.resize((size_t)(A * K));
#pragma omp parallel for schedule(static) if (A * K * V >= 65536)
      for (int64_t r = 0; r < A * K; ++r)
        if (live(r)) best_tokens(lp + r * V, V, 2 * K, ids, row_best[(size_t)r]);
      std::vector<int64_t> still_active, origin, next_last;
      for (int64_t a = 0; a < A; ++a) {
        const int64_t s = active[a];
        // The best 2K continuations: at most K of them end with <eos>, so at
        // least K run on. They are among the best 2K tokens of each beam's row.
        std::vector<std::pair<double, int64_t>> cand;  // (score, beam * V + token)
        for (int64_t k = 0; k < K; ++k) {
          if (!std::isfinite(alive[s][k].score)) continue;
          if (only_eos) {
            cand.push_back({alive[s][k].score, k * V + ids.eos});
            continue;
          }
          for (const auto& [logp_v, v] : row_best[(size_t)(a * K + k)])
            cand.push_back({alive[s][k].score + logp_v, k * V + v});
        }
        const size_t keep = std::min<size_t>(cand.size(), 2 * K);
        std::partial_sort(cand.begin(), cand.begin() + keep, cand.end(), [](auto& x, auto& y) {
          return x.first > y.first || (x.first == y.first && x.second < y.second);
        });
        std::vector<Hypothesis> next;
        std::vector<int64_t> next_origin, next_token;
        for (size_t c = 0; c < keep; ++c) {
          const int64_t k = cand[c].second / V, v = cand[c].second % V;
          Hypothesis h{alive[s][k].tokens, cand[c].first};
          if (v != ids.eos) h.tokens.push_back(v);
          if (v == ids.eos || last_step) {
            if ((int64_t)c < K) {  // only the first K may finish, as in generate()
              auto at = std::upper_bound(finished[s].begin(), finished[s].end(), normalized(h, step + 1),
                                         [&](double x, const Hypothesis& f) { return x > normalized(f, f.length); });
              h.length = step + 1;
              finished[s].insert(at, std::move(h));
              if ((int64_t)finished[s].size() > K) finished[s].pop_back();
            }
            continue;
          }
          if ((int64_t)next.size() == K) continue;
          next.push_back(std::move(h));
          next_origin.push_back(a * K + k);
          next_token.push_back(v);
        }
        while ((int64_t)next.size() < K) {  // too few live continuations: pad with dead beams
          next.push_back(Hypothesis{{}, -std::numeric_limits<double>::infinity()});
          next_origin.push_back(a * K);
          next_token.push_back(ids.pad);
        }
        alive[s] = std::move(next);
        // Done when nothing runs, or K have finished and (as early_stopping
        // asks) the best running hypothesis cannot beat the worst of them.
        const Hypothesis& best_running = alive[s][0];
        bool done = last_step || !std::isfinite(best_running.score);
        if (!done && (int64_t)finished[s].size() == K) {
          const bool longest = o.early_stopping == EarlyStopping::Never && o.length_penalty > 0;
          done =
              o.early_stopping == EarlyStopping::First || normalized(best_running, longest ? max_len : step + 1) <=
                                                              normalized(finished[s].back(), finished[s].back().length);
        }
        if (done) continue;  // its rows leave
        still_active.push_back(s);
        origin.insert(origin.end(), next_origin.begin(), next_origin.end());
        next_last.insert(next_last.end(), next_token.begin(), next_token.end());
      }
      active = still_active;
      last = next_last;
      if (!active.empty()) model.select_rows(*beams, origin);  // caches follow their hypotheses
    }
    for (int64_t s = 0; s < B; ++s)
      if (!finished[s].empty()) results[start + s] = {finished[s][0].tokens, finished[s][0].score};
  }
  return results;
}

}  // namespace qkv
