// Corpus BLEU and chrF, computed as sacreBLEU 2.x computes them by default
// (chrF: char order 6, beta 2, whitespace removed, averaged precision and
// recall over the effective orders; BLEU: tokenize "char", 4-gram, "exp"
// smoothing, brevity penalty). tests/test_translation.cpp checks both against
// values sacreBLEU produced for fixture sentences.
#include <cmath>
#include <map>

#include "qkv/translation.h"
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

void check_sizes(const std::vector<std::string>& h, const std::vector<std::string>& r, const char* metric) {
  QKV_CHECK(h.size() == r.size(), metric, ": ", h.size(), " hypotheses for ", r.size(), " references");
}

}  // namespace

double chrf(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
  check_sizes(hyps, refs, "chrF");
  const int order = 6;
  const double beta2 = 4.0;  // beta = 2
  std::vector<int64_t> n_hyp(order, 0), n_ref(order, 0), n_match(order, 0);
  for (size_t i = 0; i < hyps.size(); ++i) {
    std::vector<std::string> h = chars_without_spaces(hyps[i]), r = chars_without_spaces(refs[i]);
    for (int n = 1; n <= order; ++n) {
      auto hg = ngrams(h, n), rg = ngrams(r, n);
      n_hyp[n - 1] += h.size() >= (size_t)n ? (int64_t)(h.size() - n + 1) : 0;
      n_ref[n - 1] += r.size() >= (size_t)n ? (int64_t)(r.size() - n + 1) : 0;
      n_match[n - 1] += clipped_matches(hg, rg);
    }
  }
  double avg_p = 0, avg_r = 0;
  int effective = 0;
  for (int n = 0; n < order; ++n) {
    if (n_hyp[n] > 0 && n_ref[n] > 0) {
      avg_p += (double)n_match[n] / n_hyp[n];
      avg_r += (double)n_match[n] / n_ref[n];
      ++effective;
    }
  }
  if (effective == 0) return 0.0;
  avg_p /= effective;
  avg_r /= effective;
  if (avg_p + avg_r == 0) return 0.0;
  return 100.0 * (1 + beta2) * avg_p * avg_r / (beta2 * avg_p + avg_r);
}

double bleu_char(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
  check_sizes(hyps, refs, "BLEU");
  const int order = 4;
  std::vector<double> correct(order, 0), total(order, 0);
  double sys_len = 0, ref_len = 0;
  for (size_t i = 0; i < hyps.size(); ++i) {
    std::vector<std::string> h = chars_without_spaces(hyps[i]), r = chars_without_spaces(refs[i]);
    sys_len += (double)h.size();
    ref_len += (double)r.size();
    for (int n = 1; n <= order; ++n) {
      correct[n - 1] += (double)clipped_matches(ngrams(h, n), ngrams(r, n));
      total[n - 1] += h.size() >= (size_t)n ? (double)(h.size() - n + 1) : 0;
    }
  }
  double bp = 1.0;
  if (sys_len < ref_len) bp = sys_len > 0 ? std::exp(1 - ref_len / sys_len) : 0.0;
  bool any = false;
  for (double c : correct) any = any || c > 0;
  if (!any) return 0.0;
  std::vector<double> precision(order, 0.0);
  double smooth = 1.0;
  for (int n = 0; n < order; ++n) {
    if (total[n] == 0) break;
    if (correct[n] == 0) {
      smooth *= 2;
      precision[n] = 100.0 / (smooth * total[n]);
    } else {
      precision[n] = 100.0 * correct[n] / total[n];
    }
  }
  double log_sum = 0;
  for (double p : precision) log_sum += p == 0 ? -9999999999.0 : std::log(p);
  return bp * std::exp(log_sum / order);
}

}  // namespace qkv
