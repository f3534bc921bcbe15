// Corpus BLEU and chrF, computed as sacreBLEU 2.x computes them by default
// (chrF: char order 6, beta 2, whitespace removed, averaged precision and
// recall over the effective orders; BLEU: tokenize "char", 4-gram, "exp"
// smoothing, brevity penalty). tests/test_translation.cpp checks both against
// values sacreBLEU produced for fixture sentences. Both are functions of sums
// of per-sentence counts, which is what makes the bootstrap cheap: a resample
// adds up the counts of the sentences it draws.
#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "qkv/translation.h"
#include "qkv/rng.h"
#include "qkv/utf8.h"

namespace qkv {
namespace {

// Non-space characters of a sentence (invalid UTF-8 bytes count as U+FFFD).
std::vector<std::string> chars_without_spaces(const std::string& s) {
  std::vector<std::string> out;
  for (auto& c : utf8_chars(replace_invalid_utf8(s)))
    if (c != " " && c != "\t" && c != "\n" && c != "\r") out.push_back(c);
  return out;
}

std::map<std::vector<std::string>, int64_t> ngrams(const std::vector<std::string>& toks, size_t n) {
  std::map<std::vector<std::string>, int64_t> counts;
  for (size_t i = 0; i + n <= toks.size(); ++i) counts[std::vector<std::string>(toks.begin() + i, toks.begin() + i + n)]++;
  return counts;
}

int64_t clipped_matches(const std::map<std::vector<std::string>, int64_t>& hyp,
                        const std::map<std::vector<std::string>, int64_t>& ref) {
  int64_t m = 0;
  for (auto& [g, c] : hyp) {
    auto it = ref.find(g);
    if (it != ref.end()) m += std::min(c, it->second);
  }
  return m;
}

constexpr int kChrfOrder = 6, kBleuOrder = 4;

// What one sentence adds to a corpus score: corpus chrF and BLEU are functions
// of these sums, so a bootstrap resample is a sum over the sentences drawn.
struct SentenceStats {
  std::array<double, kChrfOrder> chrf_hyp{}, chrf_ref{}, chrf_match{};  // n-grams per order
  std::array<double, kBleuOrder> bleu_correct{}, bleu_total{};
  double sys_len = 0, ref_len = 0;

  SentenceStats& operator+=(const SentenceStats& o) {
    for (int n = 0; n < kChrfOrder; ++n)
      chrf_hyp[n] += o.chrf_hyp[n], chrf_ref[n] += o.chrf_ref[n], chrf_match[n] += o.chrf_match[n];
    for (int n = 0; n < kBleuOrder; ++n) bleu_correct[n] += o.bleu_correct[n], bleu_total[n] += o.bleu_total[n];
    sys_len += o.sys_len, ref_len += o.ref_len;
    return *this;
  }
};

SentenceStats sentence_stats(const std::string& hyp, const std::string& ref) {
  const std::vector<std::string> h = chars_without_spaces(hyp), r = chars_without_spaces(ref);
  SentenceStats st;
  auto count = [](size_t len, int n) { return len >= (size_t)n ? (double)(len - n + 1) : 0.0; };
  for (int n = 1; n <= kChrfOrder; ++n) {
    const double matches = (double)clipped_matches(ngrams(h, n), ngrams(r, n));
    st.chrf_hyp[n - 1] = count(h.size(), n);
    st.chrf_ref[n - 1] = count(r.size(), n);
    st.chrf_match[n - 1] = matches;
    if (n <= kBleuOrder) st.bleu_correct[n - 1] = matches, st.bleu_total[n - 1] = count(h.size(), n);
  }
  st.sys_len = (double)h.size();
  st.ref_len = (double)r.size();
  return st;
}

std::vector<SentenceStats> corpus_stats(const std::vector<std::string>& hyps, const std::vector<std::string>& refs,
                                        const char* metric) {
  QKV_CHECK(hyps.size() == refs.size(), metric, ": ", hyps.size(), " hypotheses for ", refs.size(), " references");
  std::vector<SentenceStats> out;
  out.reserve(hyps.size());
  for (size_t i = 0; i < hyps.size(); ++i) out.push_back(sentence_stats(hyps[i], refs[i]));
  return out;
}

// chrF (beta 2): precision and recall averaged over the orders that have
// n-grams on both sides, then their F-score.
double chrf_of(const SentenceStats& t) {
  const double beta2 = 4.0;
  double avg_p = 0, avg_r = 0;
  int effective = 0;
  for (int n = 0; n < kChrfOrder; ++n) {
    if (t.chrf_hyp[n] > 0 && t.chrf_ref[n] > 0) {
      avg_p += t.chrf_match[n] / t.chrf_hyp[n];
      avg_r += t.chrf_match[n] / t.chrf_ref[n];
      ++effective;
    }
  }
  if (effective == 0) return 0.0;
  avg_p /= effective;
  avg_r /= effective;
  if (avg_p + avg_r == 0) return 0.0;
  return 100.0 * (1 + beta2) * avg_p * avg_r / (beta2 * avg_p + avg_r);
}

// BLEU: brevity penalty times the geometric mean of the n-gram precisions,
// an order with no match counted as 1 / (2^k total) ("exp" smoothing).
double bleu_of(const SentenceStats& t) {
  double bp = 1.0;
  if (t.sys_len < t.ref_len) bp = t.sys_len > 0 ? std::exp(1 - t.ref_len / t.sys_len) : 0.0;
  bool any = false;
  for (double c : t.bleu_correct) any = any || c > 0;
  if (!any) return 0.0;
  std::array<double, kBleuOrder> precision{};
  double smooth = 1.0;
  for (int n = 0; n < kBleuOrder; ++n) {
    if (t.bleu_total[n] == 0) break;
    if (t.bleu_correct[n] == 0) {
      smooth *= 2;
      precision[n] = 100.0 / (smooth * t.bleu_total[n]);
    } else {
      precision[n] = 100.0 * t.bleu_correct[n] / t.bleu_total[n];
    }
  }
  double log_sum = 0;
  for (double p : precision) log_sum += p == 0 ? -9999999999.0 : std::log(p);
  return bp * std::exp(log_sum / kBleuOrder);
}

SentenceStats total(const std::vector<SentenceStats>& stats) {
  SentenceStats t;
  for (auto& s : stats) t += s;
  return t;
}

// sacreBLEU's estimate_ci: the draws sorted, the bounds n/40 in from each end.
BootstrapInterval interval(std::vector<double> draws) {
  std::sort(draws.begin(), draws.end());
  const size_t n = draws.size(), lower = n / 40;
  double sum = 0;
  for (double d : draws) sum += d;
  return {.mean = sum / (double)n, .low = draws[lower], .high = draws[n - lower - 1]};
}

}  // namespace

double chrf(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
  return chrf_of(total(corpus_stats(hyps, refs, "chrF")));
}

double bleu_char(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
  return bleu_of(total(corpus_stats(hyps, refs, "BLEU")));
}

CorpusConfidence bootstrap_confidence(const std::vector<std::string>& hyps, const std::vector<std::string>& refs,
                                      int64_t resamples, uint64_t seed) {
  QKV_CHECK(resamples >= 1 && resamples <= 1000000, "bootstrap: ", resamples, " resamples, expected 1 to 1000000");
  QKV_CHECK(!hyps.empty(), "bootstrap: no sentences to resample");
  const std::vector<SentenceStats> stats = corpus_stats(hyps, refs, "bootstrap");
  const uint64_t n = stats.size();
  Rng rng(seed);
  std::vector<double> bleu(resamples), chrf_draws(resamples);
  for (int64_t r = 0; r < resamples; ++r) {
    SentenceStats t;
    for (uint64_t i = 0; i < n; ++i) t += stats[rng.next_below(n)];
    bleu[r] = bleu_of(t);
    chrf_draws[r] = chrf_of(t);
  }
  return {.bleu = interval(std::move(bleu)), .chrf = interval(std::move(chrf_draws)),
          .resamples = resamples};
}

}  // namespace qkv
