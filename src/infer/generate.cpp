// Language-model inference: sampling with the KV cache, the loss over a
// token stream, and the typed model-folder reader.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "qkv/checkpoint.h"
#include "qkv/infer.h"
#include "qkv/utf8.h"
#include "src/infer/sampling.h"

namespace qkv {

std::vector<int64_t> pack_documents(const Tokenizer& tok, const std::string& text) {
  std::vector<int64_t> out;
  std::istringstream in(text);
  std::string line, doc;
  int64_t number = 0;
  auto flush = [&] {
    if (doc.empty()) return;
    const Tokenizer::Specials& specials = tok.specials();
    out.insert(out.end(), specials.prefix.begin(), specials.prefix.end());
    for (int64_t id : tok.encode(doc)) out.push_back(id);
    out.insert(out.end(), specials.suffix.begin(), specials.suffix.end());
    doc.clear();
  };
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t bad = invalid_utf8_offset(line);
    QKV_CHECK(bad == std::string::npos, "line ", number, ": invalid UTF-8 at byte ", bad + 1);
    if (line.empty()) {
      flush();
    } else {
      doc += doc.empty() ? line : "\n" + line;
    }
  }
  flush();
  return out;
}

double language_model_loss(DecoderLM& model, const std::vector<int64_t>& tokens, int64_t batch_size) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const int64_t C = std::min<int64_t>(model.config().context, (int64_t)tokens.size() - 1);
  QKV_CHECK(C >= 1, "language model loss: need at least 2 tokens, have ", tokens.size());
  std::vector<int64_t> starts;
  for (int64_t s = 0; s + C + 1 <= (int64_t)tokens.size(); s += C) starts.push_back(s);
  double total = 0;
  int64_t count = 0;
  for (size_t b0 = 0; b0 < starts.size(); b0 += (size_t)batch_size) {
    const int64_t B = (int64_t)std::min(starts.size() - b0, (size_t)batch_size);
    std::vector<int64_t> in, target;
    for (int64_t b = 0; b < B; ++b) {
      in.insert(in.end(), tokens.begin() + starts[b0 + b], tokens.begin() + starts[b0 + b] + C);
      target.insert(target.end(), tokens.begin() + starts[b0 + b] + 1, tokens.begin() + starts[b0 + b] + C + 1);
    }
    Tensor logits = model.forward(Tensor::from_ints(in, {B, C})).reshape({B * C, -1});
    total += cross_entropy(logits, Tensor::from_ints(target, {B * C})).item() * (double)(B * C);
    count += B * C;
  }
  if (was_training) model.train();
  return total / (double)count;
}

LanguageModel load_language_model(const std::string& dir, const std::string& command, const std::string& dtype) {
  ModelFolder f = load_model_folder(dir, Task::Generate, command, {dtype});
  auto model = std::dynamic_pointer_cast<DecoderLM>(f.model);
  return {f.tokenizer, model, read_generation_defaults(dir, model->config().vocab_size)};
}

namespace detail {

size_t complete_utf8_prefix(const std::string& s) {
  size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const uint8_t c = (uint8_t)s[n - back];
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return back < need ? n - back : n;
  }
  return n;
}

namespace {

// The rest of sample_token with typical_p, epsilon_cutoff or eta_cutoff: the
// first `keep` candidates (most likely first, weights p) filtered in
// generate()'s order, each filter on the probabilities of what the ones
// before it left, then one drawn. Typical sampling keeps at least the most
// typical token, the cutoffs the most likely one.
int64_t draw_among(const std::vector<std::pair<float, int64_t>>& cand, const std::vector<double>& p, size_t keep,
                   const GenerateOptions& o, Rng& rng) {
  std::vector<size_t> left(keep);
  std::iota(left.begin(), left.end(), 0);
  // The log probabilities of the tokens left (from the logits, so that a
  // tiny probability does not underflow) and their entropy, where a token of
  // probability 0 (a logit of -inf, as a rule leaves it) adds nothing.
  std::vector<double> logp(cand.size());
  auto entropy = [&] {
    double sum = 0, h = 0;
    for (size_t i : left) sum += p[i];
    const double log_sum = std::log(sum);
    for (size_t i : left) logp[i] = (double)(cand[i].first - cand[0].first) / o.temperature - log_sum;
    for (size_t i : left)
      if (p[i] > 0) h -= std::exp(logp[i]) * logp[i];
    return h;
  };
  if (o.typical_p < 1) {
    // Locally typical sampling (TypicalLogitsWarper): tokens by how far their
    // surprise -log p lies from the entropy, nearest first; the first ones
    // until their mass reaches typical_p, and any as near as the last.
    const double h = entropy();
    std::vector<double> far(cand.size());
    for (size_t i : left) far[i] = std::abs(-logp[i] - h);
    std::vector<size_t> order = left;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return far[a] < far[b]; });
    size_t last = 0;
    for (double mass = 0; last + 1 < order.size(); ++last) {
      mass += std::exp(logp[order[last]]);
      if (mass >= o.typical_p) break;
    }
    const double bound = far[order[last]];
    std::erase_if(left, [&](size_t i) { return far[i] > bound; });
  }
  // epsilon_cutoff: tokens of probability below it; eta_cutoff: below
  // min(eta, sqrt(eta) * exp(-entropy)) (EpsilonLogitsWarper, EtaLogitsWarper).
  for (const auto& [on, eta] : {std::pair{o.epsilon_cutoff > 0, false}, std::pair{o.eta_cutoff > 0, true}}) {
    if (!on) continue;
    const double h = entropy();
    const double cut = eta ? std::min<double>(o.eta_cutoff, std::sqrt(o.eta_cutoff) * std::exp(-h)) : o.epsilon_cutoff;
    std::erase_if(left, [&](size_t i) { return i != 0 && std::exp(logp[i]) < cut; });
  }
  double total = 0;
  for (size_t i : left) total += p[i];
  double u = rng.next_uniform() * total;
  for (size_t i : left)
    if ((u -= p[i]) <= 0) return cand[i].second;
  return cand[left.back()].second;
}

}  // namespace

int64_t sample_token(const float* logits, int64_t V, const GenerateOptions& o, const Tokenizer::Specials& specials,
                     Rng& rng) {
  auto in = [](const std::vector<int64_t>& ids, int64_t v) { return std::find(ids.begin(), ids.end(), v) != ids.end(); };
  auto drawable = [&](int64_t v) { return !in(specials.never_sampled, v) && !(o.ignore_eos && in(specials.eos, v)); };
  // Most likely first; equal logits by id, so every path below agrees on the order.
  auto before = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (o.temperature <= 0) {  // greedy: the first of that order, without sorting the vocabulary
    int64_t best = -1;
    for (int64_t v = 0; v < V; ++v)
      if (drawable(v) && (best < 0 || logits[v] > logits[best])) best = v;
    return best;
  }
  std::vector<std::pair<float, int64_t>> cand;
  for (int64_t v = 0; v < V; ++v)
    if (drawable(v)) cand.push_back({logits[v], v});
  if (o.top_k > 0 && (size_t)o.top_k < cand.size()) {
    std::partial_sort(cand.begin(), cand.begin() + o.top_k, cand.end(), before);
    cand.resize((size_t)o.top_k);
  } else {
    std::sort(cand.begin(), cand.end(), before);
  }
  std::vector<double> p(cand.size());
  double total = 0;
  for (size_t i = 0; i < cand.size(); ++i) total += p[i] = std::exp((cand[i].first - cand[0].first) / o.temperature);
  size_t keep = cand.size();
  if (o.top_p < 1) {  // the smallest head of the sorted list with probability >= top_p
    double mass = 0;
    for (keep = 0; keep < cand.size();) {
      mass += p[keep++] / total;
      if (mass >= o.top_p) break;
    }
  }
  // min_p: only tokens at least min_p times as likely as the first (p[0] is
  // 1), as transformers' MinPLogitsWarper keeps them after top-k and top-p.
  while (keep > 1 && p[keep - 1] < o.min_p) --keep;
  if (o.typical_p < 1 || o.epsilon_cutoff > 0 || o.eta_cutoff > 0) return draw_among(cand, p, keep, o, rng);
  if (keep < cand.size()) total = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  double u = rng.next_uniform() * total;
  for (size_t i = 0; i < keep; ++i) {
    if ((u -= p[i]) <= 0) return cand[i].second;
  }
  return cand[keep - 1].second;
}

void check_options(const GenerateOptions& o) {
  QKV_CHECK(o.max_new_tokens >= 0 && o.top_k >= 0 && o.top_p > 0 && o.top_p <= 1 && o.temperature >= 0 &&
                o.min_p >= 0 && o.min_p <= 1 && o.typical_p > 0 && o.typical_p <= 1 && o.epsilon_cutoff >= 0 &&
                o.epsilon_cutoff < 1 && o.eta_cutoff >= 0 && o.eta_cutoff < 1,
            "generate: max-new-tokens, top-k and temperature must not be negative, top-p and typical-p in (0, 1], "
            "min-p in [0, 1], epsilon and eta cutoffs in [0, 1)");
  QKV_CHECK(std::fabs(o.presence_penalty) <= 2 && std::fabs(o.frequency_penalty) <= 2,
            "generate: presence and frequency penalties must be -2 to 2");
  for (const auto& [id, bias] : o.logit_bias)
    QKV_CHECK(id >= 0 && std::fabs(bias) <= 100, "generate: logit_bias takes token ids with biases -100 to 100, got ",
              id, ": ", bias);
}

void apply_penalties(const GenerateOptions& o, std::span<const int64_t> outputs, float* scores, int64_t V) {
  if (o.presence_penalty != 0 || o.frequency_penalty != 0) {
    thread_local std::vector<int64_t> seen;  // the outputs sorted: each id's run is its count
    seen.assign(outputs.begin(), outputs.end());
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      size_t j = i;
      while (j < seen.size() && seen[j] == seen[i]) ++j;
      if (seen[i] >= 0 && seen[i] < V) scores[seen[i]] -= (float)(j - i) * o.frequency_penalty + o.presence_penalty;
      i = j;
    }
  }
  for (const auto& [id, bias] : o.logit_bias) {
    QKV_CHECK(id >= 0 && id < V, "generate: logit_bias names token ", id, ", past the vocabulary of ", V);
    scores[id] += bias;
  }
}

int64_t next_token(const float* logits, int64_t V, const GenerateOptions& o, const Tokenizer::Specials& specials,
                   Rng& rng, const TokenRules& rules, std::span<const int64_t> prefix,
                   std::span<const int64_t> outputs) {
  const bool penalized = o.presence_penalty != 0 || o.frequency_penalty != 0 || !o.logit_bias.empty();
  if (rules.empty() && !penalized) return sample_token(logits, V, o, specials, rng);
  thread_local std::vector<float> scores;  // one vocabulary's row per thread, kept between tokens
  scores.assign(logits, logits + V);
  rules.apply(prefix, outputs, specials.eos, scores.data(), V);
  apply_penalties(o, outputs, scores.data(), V);
  return sample_token(scores.data(), V, o, specials, rng);
}

}  // namespace detail

std::vector<int64_t> generate(LanguageModel& m, const std::string& prompt, const GenerateOptions& o,
                              const std::function<void(const std::string&)>& emit) {
  detail::check_options(o);
  NoGradGuard no_grad;
  DecoderLM& model = *m.model;
  model.eval();
  const int64_t C = model.config().context;
  const Tokenizer::Specials& specials = m.tokenizer->specials();
  std::vector<int64_t> ids = m.tokenizer->encode_prompt(prompt);
  QKV_CHECK(!ids.empty(), "generate: the prompt is empty and the tokenizer puts no token before it; give a prompt");
  const int64_t keep = (int64_t)specials.prefix.size();  // the prefix stays when the prompt is cut
  if ((int64_t)ids.size() >= C) {
    QKV_CHECK(o.truncate_prompt && C - 1 > keep, "generate: the prompt is ", (int64_t)ids.size() - keep,
              " tokens, the model's context is ", C, " (pass --truncate-prompt to keep its last ", C - 1 - keep,
              " tokens)");
    ids.erase(ids.begin() + keep, ids.end() - (C - 1 - keep));
  }
  // The cache holds what this call can reach, not the whole context: a
  // pretrained model's context (32k to 128k positions) would otherwise cost
  // gigabytes for a short completion.
  const int64_t P = (int64_t)ids.size();
  const int64_t capacity = o.max_new_tokens < C - P ? P + o.max_new_tokens : C;
  std::vector<KVCache> caches = model.make_caches(1, capacity);
  Tensor logits = model.forward_cached(Tensor::from_ints(ids, {1, (int64_t)ids.size()}), caches, /*last_only=*/true);
  const int64_t V = logits.size(-1);
  Rng rng(o.seed);
  std::vector<int64_t> out;
  size_t emitted = 0;
  for (int64_t i = 0; i < o.max_new_tokens && caches[0].length < capacity; ++i) {
    const float* last = logits.data<float>() + (logits.size(1) - 1) * V;
    const int64_t next = detail::next_token(last, V, o, specials, rng, m.generation.rules, ids, out);
    if (m.tokenizer->is_eos(next)) break;  // never drawn with ignore_eos
    out.push_back(next);
    if (emit) {
      const std::string text = m.tokenizer->decode(out);
      const size_t cut = detail::complete_utf8_prefix(text);
      if (cut > emitted) emit(replace_invalid_utf8(text.substr(emitted, cut - emitted))), emitted = cut;
    }
    if (caches[0].length < capacity) logits = model.forward_cached(Tensor::from_ints({next}, {1, 1}), caches);
  }
  if (emit) {  // what is left, a character cut off at the end as U+FFFD: the stream adds up to the decoded text
    const std::string text = m.tokenizer->decode(out);
    if (text.size() > emitted) emit(replace_invalid_utf8(text.substr(emitted)));
  }
  return out;
}

std::string generate_turn(LanguageModel& m, const std::string& prompt, const std::string& end_of_turn,
                          const GenerateOptions& options, const std::function<void(const std::string&)>& emit) {
  struct TurnEnded {};
  std::string text;
  size_t shown = 0;
  auto show = [&](size_t upto) {
    if (emit && upto > shown) emit(text.substr(shown, upto - shown));
    shown = std::max(shown, upto);
  };
  try {
    generate(m, prompt, options, [&](const std::string& piece) {
      text += piece;
      if (!end_of_turn.empty() && text.find(end_of_turn) != std::string::npos) throw TurnEnded{};
      show(text.size() - marker_begins_at_end(text, end_of_turn));
    });
  } catch (const TurnEnded&) {
  }
  if (!end_of_turn.empty()) text.resize(std::min(text.size(), text.find(end_of_turn)));
  show(text.size());
  return text;
}

}  // namespace qkv
