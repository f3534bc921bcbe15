// Continuous batching (qkv/batching.h): slots of KV caches, a bounded queue,
// and one batched decoding step for every active sequence.
#include "qkv/batching.h"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>

#include "qkv/ops.h"
#include "qkv/utf8.h"
#include "src/infer/sampling.h"

namespace qkv {

struct BatchGenerator::Slot {
  bool active = false;
  BatchRequest request;
  std::vector<KVCache> caches;  // one per layer, batch 1, `context` positions
  Rng rng;
  std::vector<int64_t> tokens;  // generated so far
  std::string text;             // their decoded text
  size_t emitted = 0;           // bytes of `text` already given to on_text
  int64_t pending = -1;         // the token the next step feeds, or -1
  TokenLogprob drawn;           // the last token drawn, with request.logprobs, until accept() keeps it
  size_t logprobs_emitted = 0;  // entries of result.logprobs already given to on_text
  BatchResult result;
  // While the slot is free: the tokens whose positions its caches hold, from
  // the last request that ended well (stop or length), for reuse_prefix.
  std::vector<int64_t> history;
};

namespace {

// The k largest of row[0, V) with their ids, largest first (of equal ones
// the smaller id; a NaN ranks as -inf), in one pass.
std::vector<std::pair<int64_t, float>> largest(const float* row, int64_t V, int64_t k) {
  std::vector<std::pair<int64_t, float>> top;
  if (k <= 0) return top;
  top.reserve((size_t)k + 1);
  for (int64_t v = 0; v < V; ++v) {
    const float key = row[v] == row[v] ? row[v] : -INFINITY;
    if ((int64_t)top.size() == k && !(key > top.back().second)) continue;
    auto at = std::find_if(top.begin(), top.end(), [&](const auto& t) { return key > t.second; });
    top.insert(at, {v, key});
    if ((int64_t)top.size() > k) top.pop_back();
  }
  return top;
}

// log_softmax(logits)[token], and the k likeliest ids with theirs (a NaN
// logit ranks last).
TokenLogprob logprob_of(const float* logits, int64_t V, int64_t token, int64_t k) {
  auto key = [&](int64_t i) { return logits[i] == logits[i] ? logits[i] : -INFINITY; };
  float max = -INFINITY;
  for (int64_t i = 0; i < V; ++i) max = std::max(max, key(i));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp((double)key(i) - max);
  const float log_z = max + (float)std::log(sum);
  TokenLogprob t;
  t.token = token;
  t.logprob = logits[token] - log_z;
  for (const auto& [id, ignored] : largest(logits, V, k)) t.top.emplace_back(id, logits[id] - log_z);
  return t;
}

// logprob_of for rows [0, rows) of logits [rows or more, V], row i scoring
// targets[i], into out[i]. The log-softmax is the library's, over a block of
// rows at once, vectorized and split between the threads: logprob_of, a row
// at a time in double precision, took 34 ms of a 300-ms request scoring 8
// prompts of 109 tokens (lm-20m, vocabulary 4,096). A row holding a NaN or
// +inf keeps logprob_of's treatment (a NaN ranks last).
void score_rows(const Tensor& logits, int64_t rows, const int64_t* targets, int64_t k, TokenLogprob* out) {
  constexpr int64_t kBlock = 64;  // rows per log-softmax: 64 x V floats more at a time
  const int64_t V = logits.size(-1);
  const Tensor all = logits.reshape({-1, V});
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t n = std::min(kBlock, rows - r0);
    const Tensor logp = log_softmax(all.slice(0, r0, r0 + n)).contiguous();
    for (int64_t i = 0; i < n; ++i) {
      const float* x = all.data<float>() + (r0 + i) * V;
      const float* y = logp.data<float>() + i * V;
      bool plain = true;
      for (int64_t v = 0; v < V; ++v) plain &= (x[v] == x[v]) & (x[v] != INFINITY);
      TokenLogprob& t = out[r0 + i];
      if (!plain || std::isnan(y[targets[r0 + i]])) {
        t = logprob_of(x, V, targets[r0 + i], k);
        continue;
      }
      t.token = targets[r0 + i];
      t.logprob = y[t.token];
      t.top = largest(y, V, k);
    }
  }
}

// The bytes token `id` added when the decoded text went from `before` to
// `after`; its own decoding where a tokenizer's output is not a prefix of
// the longer one.
std::string added_text(const Tokenizer& t, const std::string& before, const std::string& after, int64_t id) {
  return after.compare(0, before.size(), before) == 0 ? after.substr(before.size()) : t.decode({id});
}

// The bytes token i adds to the decoded text of ids[0..i], told by decoding
// a few tokens before it with and without it (all of them, for every token
// of a long prompt, would cost P^2 decodes).
std::string token_text(const Tokenizer& t, const std::vector<int64_t>& ids, size_t i) {
  std::vector<int64_t> window(ids.begin() + (ptrdiff_t)(i >= 8 ? i - 8 : 0), ids.begin() + (ptrdiff_t)i);
  const std::string before = t.decode(window);
  window.push_back(ids[i]);
  return added_text(t, before, t.decode(window), ids[i]);
}

// Positions of scored prompts one prefill pass takes together (a longer prompt goes alone).
constexpr int64_t kPrefillTokens = 1024;
// Positions whose logits a scored prompt keeps at a time.
constexpr int64_t kScoreChunk = 256;

bool cancelled(const BatchRequest& r) { return r.cancel && *r.cancel; }

// The end of a request that never took a slot.
void end_unadmitted(BatchRequest& r, const char* reason) {
  BatchResult result;
  result.prompt_tokens = (int64_t)r.prompt.size();
  result.finish_reason = reason;
  if (r.on_done) r.on_done(result);
}

}  // namespace

BatchGenerator::BatchGenerator(LanguageModel model, int64_t slots, int64_t context, int64_t max_waiting)
    : model_(std::move(model)), context_(context), max_waiting_(max_waiting) {
  QKV_CHECK(model_.model && model_.tokenizer, "batch generator: needs a decoder model with its tokenizer");
  QKV_CHECK(slots >= 1 && slots <= 1024, "batch generator: slots must be 1 to 1024, got ", slots);
  QKV_CHECK(max_waiting >= 0, "batch generator: the queue length must not be negative, got ", max_waiting);
  const int64_t model_context = model_.model->config().context;
  QKV_CHECK(context >= 2 && context <= model_context, "batch generator: context must be 2 to the model's ",
            model_context, ", got ", context);
  model_.model->eval();
  for (int64_t i = 0; i < slots; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->caches = model_.model->make_caches(1, context);
  }
}

BatchGenerator::~BatchGenerator() {
  stop();
  for (auto& task : tasks_) task();  // without a thread, posted tasks still run (and tell their callers)
  // Without a thread (step() driven by the caller) requests may remain: each still hears its end.
  for (auto& s : slots_)
    if (s->active) finish(*s, "cancelled");
  for (BatchRequest& r : waiting_) end_unadmitted(r, "cancelled");
}

bool BatchGenerator::submit(BatchRequest r) {
  detail::check_options(r.options);
  QKV_CHECK(!r.prompt.empty() && (int64_t)r.prompt.size() < context_, "generate: the prompt is ", r.prompt.size(),
            " tokens; it must be 1 to ", context_ - 1, " (the context is ", context_, ")");
  for (const std::string& s : r.stop) QKV_CHECK(!s.empty(), "generate: a stop sequence must not be empty");
  // (checked here: a prompt fails alone, not the prefill pass it would share)
  const int64_t V = model_.model->config().vocab_size;
  for (int64_t id : r.prompt)
    QKV_CHECK(id >= 0 && id < V, "generate: token id ", id, " is outside the vocabulary [0, ", V, ")");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t free_slots = (int64_t)slots_.size() - active_;  // those admit at the next step
    // A cancelled request still waiting holds no place: the next step drops it.
    const auto live =
        std::count_if(waiting_.begin(), waiting_.end(), [](const BatchRequest& w) { return !cancelled(w); });
    if (stopping_ || (int64_t)live >= max_waiting_ + free_slots) return false;
    waiting_.push_back(std::move(r));
  }
  wake_.notify_one();
  return true;
}

void BatchGenerator::admit(Slot& s, BatchRequest r) {
  s.active = true;
  s.request = std::move(r);
  s.rng = Rng(s.request.options.seed);
  s.tokens.clear();
  s.text.clear();
  s.emitted = 0;
  s.pending = -1;
  s.logprobs_emitted = 0;
  s.result = BatchResult{};
  s.result.prompt_tokens = (int64_t)s.request.prompt.size();
  // What the last request left is overwritten, but for the positions it shares with this prompt.
  const int64_t kept = reused_positions(s, s.request);
  for (KVCache& c : s.caches) c.length = kept;
  s.result.cached_tokens = kept;
  s.history.clear();
  if (s.request.cancel && *s.request.cancel) return finish(s, "cancelled");
  if (scores_prompt(s)) s.result.prompt_logprobs.resize(s.request.prompt.size());
  if (s.request.options.max_new_tokens == 0 && !scores_prompt(s)) return finish(s, "length");
  // prefill() takes its prompt next.
}

bool BatchGenerator::scores_prompt(const Slot& s) { return s.request.logprobs >= 0 && s.request.prompt_logprobs; }

int64_t BatchGenerator::reused_positions(const Slot& s, const BatchRequest& r) {
  if (!r.reuse_prefix || (r.logprobs >= 0 && r.prompt_logprobs)) return 0;
  // The last prompt position is always run again: its logits draw the first token.
  const size_t most = std::min(s.history.size(), r.prompt.size() - 1);
  return std::mismatch(r.prompt.begin(), r.prompt.begin() + (ptrdiff_t)most, s.history.begin()).first -
         r.prompt.begin();
}

bool BatchGenerator::prefilling(const Slot& s) {
  return s.active && s.pending < 0 && s.caches.front().length < (int64_t)s.request.prompt.size();
}

void BatchGenerator::prefill() {
  // A prompt not scored goes alone, in one forward over all of it (the last
  // position's logits only), as generate() runs it: its products then take
  // the kernels, and sum in the order, they take there, and its completion
  // is generate()'s whatever shares the step. The same prompt admitted
  // again in the step (the choices of one request: `n`) is prefilled once:
  // the others copy its positions and draw from its logits, the same values
  // a prefill of their own would give.
  std::map<std::vector<int64_t>, std::pair<Slot*, Tensor>> whole;  // prompt -> its slot here, its last logits
  for (auto& s : slots_) {
    if (!prefilling(*s) || scores_prompt(*s)) continue;
    const std::vector<int64_t>& p = s->request.prompt;
    const int64_t kept = s->caches.front().length;  // reuse_prefix's positions
    if (auto same = whole.find(p); kept == 0 && same != whole.end()) {
      const std::vector<KVCache>& from = same->second.first->caches;
      const int64_t P = (int64_t)p.size();
      for (size_t i = 0; i < from.size(); ++i) {
        NoGradGuard no_grad;
        s->caches[i].k.slice(2, 0, P).copy_(from[i].k.slice(2, 0, P));
        s->caches[i].v.slice(2, 0, P).copy_(from[i].v.slice(2, 0, P));
        s->caches[i].length = P;
      }
      s->result.cached_tokens = P;
      prefilled(*s, same->second.second);
      continue;
    }
    Tensor logits;
    try {
      const std::vector<int64_t> rest(p.begin() + kept, p.end());
      logits = model_.model->forward_cached(Tensor::from_ints(rest, {1, (int64_t)rest.size()}), s->caches, true)
                   .contiguous();
    } catch (const std::exception& e) {
      finish(*s, "error", e.what());
      continue;
    }
    if (kept == 0) whole.emplace(p, std::make_pair(s.get(), logits));
    prefilled(*s, logits);
  }
  // Scored prompts go together, whole, in passes of up to kPrefillTokens
  // positions (a longer prompt alone): a pass's matrix products run once
  // over all of its positions. The products of 8 prompts of 109 tokens at
  // lm-20m's shape ran 1.18-1.23x faster so than one prompt at a time; a row's
  // sums may then take another kernel than they take alone, so the values
  // may differ from its prompt's alone in the last bits.
  for (;;) {
    std::vector<Slot*> group;
    std::vector<int64_t> lengths, ids;
    std::vector<std::vector<KVCache>*> caches;
    for (auto& s : slots_) {
      const std::vector<int64_t>& p = s->request.prompt;
      if (!prefilling(*s) || (!ids.empty() && (int64_t)(ids.size() + p.size()) > kPrefillTokens)) continue;
      group.push_back(s.get());
      lengths.push_back((int64_t)p.size());
      ids.insert(ids.end(), p.begin(), p.end());
      caches.push_back(&s->caches);
    }
    if (group.empty()) return;
    std::vector<Tensor> last(group.size());  // each prompt's last position's logits [1, 1, V]
    try {
      const Tensor hidden =
          model_.model->forward_cached_packed(Tensor::from_ints(ids, {1, (int64_t)ids.size()}), lengths, caches);
      int64_t at = 0;  // the prompt's first position in `hidden`
      for (size_t b = 0; b < group.size(); at += lengths[b], ++b) {
        Slot& s = *group[b];
        const std::vector<int64_t>& p = s.request.prompt;
        const int64_t P = lengths[b];
        // Every position's logits, kScoreChunk x V floats at a time, not P x V.
        for (int64_t c = 0; c < P; c += kScoreChunk) {  // position c + i predicts the token at c + i + 1
          const int64_t m = std::min(kScoreChunk, P - c);
          const Tensor logits = model_.model->logits(hidden.slice(1, at + c, at + c + m)).contiguous();
          score_rows(logits, std::min(m, P - 1 - c), p.data() + c + 1, s.request.logprobs,
                     s.result.prompt_logprobs.data() + c + 1);
          if (c + m == P) last[b] = logits.slice(1, m - 1, m).contiguous();
        }
      }
    } catch (const std::exception& e) {
      for (Slot* s : group) finish(*s, "error", e.what());
      continue;
    }
    for (size_t b = 0; b < group.size(); ++b) prefilled(*group[b], last[b]);
  }
}

void BatchGenerator::prefilled(Slot& s, const Tensor& logits) {
  const std::vector<int64_t>& p = s.request.prompt;
  if (scores_prompt(s)) {
    s.result.prompt_logprobs[0].token = p[0];
    s.result.prompt_logprobs[0].logprob = NAN;  // nothing predicts the first
    for (size_t i = 0; i < p.size(); ++i) s.result.prompt_logprobs[i].text = token_text(*model_.tokenizer, p, i);
    if (s.request.on_prompt) s.request.on_prompt(s.result.prompt_logprobs);
  }
  if (s.request.options.max_new_tokens == 0) return finish(s, "length");
  draw(s, logits.data<float>(), logits.size(-1));
}

// The slot's next token from its row of logits, or the slot finished with
// the error (a rule that fails on this vocabulary) instead of the thread.
void BatchGenerator::draw(Slot& s, const float* logits, int64_t V) {
  int64_t token = 0;
  try {
    token = detail::next_token(logits, V, s.request.options, model_.tokenizer->specials(), s.rng,
                               model_.generation.rules, s.request.prompt, s.tokens);
  } catch (const std::exception& e) {
    return finish(s, "error", e.what());
  }
  if (s.request.logprobs >= 0) s.drawn = logprob_of(logits, V, token, s.request.logprobs);
  accept(s, token);
}

namespace {

// Where the earliest of `stops` begins in `text` at or after `from`, or npos.
size_t find_stop(const std::string& text, const std::vector<std::string>& stops, size_t from) {
  size_t best = std::string::npos;
  for (const std::string& stop : stops) best = std::min(best, text.find(stop, from));
  return best;
}

// The longest tail of text[from, end) that begins one of `stops` (it may yet become one).
size_t held_back(const std::string& text, size_t from, size_t end, const std::vector<std::string>& stops) {
  if (end <= from) return 0;
  const std::string_view window = std::string_view(text).substr(from, end - from);
  size_t longest = 0;
  for (const std::string& stop : stops) longest = std::max(longest, marker_begins_at_end(window, stop));
  return longest;
}

}  // namespace

void BatchGenerator::accept(Slot& s, int64_t token) {
  auto emit_to = [&](size_t end) {
    if (end <= s.emitted) return;
    const std::string piece = replace_invalid_utf8(s.text.substr(s.emitted, end - s.emitted));
    s.emitted = end;
    s.result.text += piece;
    if (!s.request.on_text) return;
    const std::vector<TokenLogprob> tokens(s.result.logprobs.begin() + (ptrdiff_t)s.logprobs_emitted,
                                           s.result.logprobs.end());
    s.logprobs_emitted = s.result.logprobs.size();
    s.request.on_text(piece, tokens);
  };
  const std::vector<int64_t>& ids = s.request.stop_ids;
  if (model_.tokenizer->is_eos(token) || std::find(ids.begin(), ids.end(), token) != ids.end()) {
    // (eos is never drawn with ignore_eos; a stop id may be)
    emit_to(s.text.size());  // a character cut off before eos is U+FFFD, as in the decoded text
    return finish(s, "stop");
  }
  s.tokens.push_back(token);
  s.result.completion_tokens = (int64_t)s.tokens.size();
  std::string text = model_.tokenizer->decode(s.tokens);
  if (s.request.logprobs >= 0) {
    s.drawn.text = added_text(*model_.tokenizer, s.text, text, token);
    s.result.logprobs.push_back(std::move(s.drawn));
  }
  s.text = std::move(text);
  const std::vector<std::string>& stops = s.request.stop;
  if (const size_t at = find_stop(s.text, stops, s.emitted); at != std::string::npos) {
    emit_to(at);
    return finish(s, "stop");
  }
  const size_t whole = detail::complete_utf8_prefix(s.text);
  const int64_t length = s.caches.front().length;  // positions cached; the token goes to this one
  if ((int64_t)s.tokens.size() >= s.request.options.max_new_tokens || length + 1 >= context_) {
    emit_to(s.text.size());  // a character cut off at the end is U+FFFD, as in the decoded text (and generate())
    return finish(s, "length");
  }
  emit_to(whole - held_back(s.text, s.emitted, whole, stops));
  s.pending = token;
}

void BatchGenerator::finish(Slot& s, const std::string& reason, const std::string& error) {
  if (reason == "stop" || reason == "length") {  // the caches hold the prompt, then the tokens fed back
    const size_t held = (size_t)s.caches.front().length, P = s.request.prompt.size();
    s.history.assign(s.request.prompt.begin(), s.request.prompt.begin() + (ptrdiff_t)std::min(held, P));
    if (held > P)
      s.history.insert(s.history.end(), s.tokens.begin(),
                       s.tokens.begin() + (ptrdiff_t)std::min(held - P, s.tokens.size()));
  }
  s.result.finish_reason = reason;
  s.result.error = error;
  s.active = false;
  s.pending = -1;
  BatchRequest done = std::move(s.request);
  s.request = BatchRequest{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --active_;
  }
  if (done.on_done) done.on_done(s.result);
}

void BatchGenerator::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
}

bool BatchGenerator::step() {
  NoGradGuard no_grad;
  for (;;) {  // posted tasks first, each with the model to itself
    std::function<void()> task;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (tasks_.empty()) break;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
  std::vector<BatchRequest> dropped;  // cancelled while waiting: they end without taking a slot
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (!cancelled(*it)) {
        ++it;
        continue;
      }
      dropped.push_back(std::move(*it));
      it = waiting_.erase(it);
    }
  }
  for (BatchRequest& r : dropped) end_unadmitted(r, "cancelled");
  for (;;) {  // free slots take waiting requests, oldest first
    Slot* slot = nullptr;
    BatchRequest r;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (waiting_.empty()) break;
      // The free slot whose positions the prompt keeps most of and overwrites
      // least of (reuse_prefix): kept minus lost. A new conversation takes an
      // empty slot rather than the <bos> of one that holds another's history.
      int64_t best = INT64_MIN;
      for (auto& s : slots_) {
        if (s->active) continue;
        const int64_t kept = reused_positions(*s, waiting_.front()), lost = (int64_t)s->history.size() - kept;
        if (kept - lost > best) slot = s.get(), best = kept - lost;
      }
      if (!slot) break;
      r = std::move(waiting_.front());
      waiting_.pop_front();
      ++active_;
    }
    admit(*slot, std::move(r));
  }
  prefill();
  std::vector<Slot*> rows;
  std::vector<int64_t> ids;
  std::vector<std::vector<KVCache>*> caches;
  for (auto& s : slots_) {
    if (!s->active) continue;
    if (s->request.cancel && *s->request.cancel) {
      finish(*s, "cancelled");
      continue;
    }
    if (s->pending < 0) continue;
    rows.push_back(s.get());
    ids.push_back(s->pending);
    caches.push_back(&s->caches);
  }
  if (!rows.empty()) {
    Tensor logits;
    try {
      logits = model_.model->forward_cached_rows(Tensor::from_ints(ids, {(int64_t)rows.size(), 1}), caches);
    } catch (const std::exception& e) {
      for (Slot* s : rows) finish(*s, "error", e.what());
      rows.clear();
    }
    {  // counted before any request it finishes is answered, so a client sees it
      std::lock_guard<std::mutex> lock(mutex_);
      ++steps_;
    }
    const int64_t V = logits.defined() ? logits.size(-1) : 0;
    for (size_t b = 0; b < rows.size(); ++b) {
      Slot& s = *rows[b];
      s.pending = -1;
      draw(s, logits.data<float>() + (int64_t)b * V, V);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return active_ > 0 || !waiting_.empty() || !tasks_.empty();
}

void BatchGenerator::loop(int threads) {
  if (threads > 0) omp_set_num_threads(threads);  // a new thread starts from the process default
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || active_ > 0 || !waiting_.empty() || !tasks_.empty(); });
      if (stopping_ && active_ == 0 && waiting_.empty() && tasks_.empty()) return;
    }
    step();
  }
}

void BatchGenerator::start(int threads) {
  QKV_CHECK(!thread_.joinable(), "batch generator: already started");
  thread_ = std::thread([this, threads] { loop(threads); });
}

void BatchGenerator::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

BatchStats BatchGenerator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {(int64_t)slots_.size(), active_, (int64_t)waiting_.size(), steps_};
}

}  // namespace qkv
