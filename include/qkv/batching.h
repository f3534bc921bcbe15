// qkv/batching.h — continuous batching for a decoder language model: many
// generations share one decoding step.
//
// The generator has a fixed number of slots, each a KV cache of `context`
// positions for one sequence. A request waits in a bounded queue until a slot
// is free; it then joins at the next step: its prompt is prefilled into its
// slot (prompts scored with their logprobs together, packed into shared
// passes: DecoderLM::forward_cached_packed; any other alone, as generate()
// prefills it), and from then on every step computes the next token of all active
// sequences with one batched forward pass (DecoderLM::forward_cached_rows:
// the matrix products once for all rows, attention per row at its own
// length). A finished or cancelled request leaves at once and frees its slot.
//
// Each request samples with its own generator seeded by its seed, so its
// tokens are the ones qkv::generate() gives for the same prompt and options,
// whatever else shares the batch.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "qkv/infer.h"

namespace qkv {

// A token's log-probability under the model: the log-softmax of the logits
// it was chosen from, before temperature and the sampling rules (the model's
// own distribution, whatever the request samples with).
struct TokenLogprob {
  int64_t token = 0;
  std::string text;   // the bytes it added to the decoded text ("" for a special; maybe part of a character)
  float logprob = 0;  // NaN for a prompt's first token, which nothing predicts
  std::vector<std::pair<int64_t, float>> top;  // the request's `logprobs` likeliest tokens there, likeliest first
};

struct BatchResult {
  std::string text;  // the completion as emitted, less any stop sequence
  int64_t prompt_tokens = 0, completion_tokens = 0;
  // Prompt positions not prefilled but taken from the slot's caches
  // (reuse_prefix), or copied from another slot that prefilled the same
  // prompt in the same step (the choices of one request).
  int64_t cached_tokens = 0;
  // With BatchRequest::logprobs >= 0: one per completion token (those
  // completion_tokens counts: not <eos> or a stop id; the token whose text
  // completes a stop sequence is included), and with prompt_logprobs one
  // per prompt token.
  std::vector<TokenLogprob> logprobs, prompt_logprobs;
  // "stop": <eos> or a stop sequence; "length": max_new_tokens or the
  // context; "cancelled"; "error" (then `error` says what failed).
  std::string finish_reason;
  std::string error;
};

struct BatchRequest {
  std::vector<int64_t> prompt;  // token ids, <bos> first, fewer than the generator's context
  GenerateOptions options;      // max_new_tokens, temperature, top_k, top_p, seed
  // Generation ends where the text first contains one of these; the text up to
  // it is returned. Text that could still become one is held back meanwhile.
  std::vector<std::string> stop;
  // Generation also ends at any of these token ids, as at <eos> (a chat
  // format's end of turn); like <eos>, the token is not part of the text.
  std::vector<int64_t> stop_ids;
  // -1: no log-probabilities; k >= 0: each completion token's, with the k
  // likeliest tokens at its position (BatchResult::logprobs).
  int64_t logprobs = -1;
  // Also each prompt token's (with logprobs >= 0; the prompt is then
  // prefilled with the logits of every position, and max_new_tokens may be 0).
  bool prompt_logprobs = false;
  // Each new piece of text, on the generator's thread; never a split UTF-8
  // character. With logprobs, `tokens` are those drawn since the last piece
  // (a piece held back for a stop sequence comes with the tokens after it;
  // the tokens of text never emitted are only in the result).
  std::function<void(const std::string& piece, const std::vector<TokenLogprob>& tokens)> on_text;
  // With prompt_logprobs, once the prompt is scored and before any text, on
  // the generator's thread: its tokens' log-probabilities (as the result's).
  std::function<void(const std::vector<TokenLogprob>& prompt)> on_prompt;
  // Once, at the end, on the generator's thread.
  std::function<void(const BatchResult&)> on_done;
  // Set by the caller (a client gone): the request leaves at the next step.
  std::shared_ptr<std::atomic<bool>> cancel;
  // The prompt may take a free slot whose caches still hold positions of an
  // earlier request that begin as the prompt does (its prompt and the tokens
  // it generated: a chat's history), and prefill only the rest
  // (BatchResult::cached_tokens). Those positions were computed in another
  // order (decoding steps, a longer or shorter prefill), so the values can
  // differ from a prefill of the whole prompt in the last bits, and a token
  // drawn near a tie can then differ from generate()'s. Not with prompt_logprobs.
  bool reuse_prefix = false;
};

struct BatchStats {
  int64_t slots = 0, active = 0, waiting = 0;
  int64_t steps = 0;  // batched decoding steps run so far
};

class BatchGenerator {
public:
  // slots >= 1 sequences at once, each of up to `context` positions (at most
  // the model's); at most max_waiting requests wait for a slot.
  BatchGenerator(LanguageModel model, int64_t slots, int64_t context, int64_t max_waiting);
  ~BatchGenerator();
  BatchGenerator(const BatchGenerator&) = delete;
  BatchGenerator& operator=(const BatchGenerator&) = delete;

  // Queues a request (thread-safe). False, and nothing queued, when the queue
  // is full (requests cancelled while waiting do not count: the next step
  // ends them without a slot) or the generator is stopping. A prompt that
  // does not fit the context, or options out of range, are a qkv::Error.
  bool submit(BatchRequest request);
  // One round on the calling thread: admits waiting requests into free slots
  // (prefill and their first token), then one batched step for every active
  // sequence. Returns whether any request is still active or waiting.
  bool step();
  // Runs step() on a thread of its own (with `threads` OpenMP threads, 0: the
  // default) until stop().
  void start(int threads = 0);
  // Takes no new requests, lets the active and waiting ones finish, and joins
  // the thread. Idempotent.
  void stop();
  // Runs `task` on the generator's thread between two steps, so that it may
  // use the model while nothing else does (the model is not safe to run from
  // two threads at once). Returns at once; `task` tells its caller itself.
  // Without a thread, the next step() runs it; after stop(), the destructor.
  void post(std::function<void()> task);

  BatchStats stats() const;
  int64_t context() const { return context_; }
  const LanguageModel& model() const { return model_; }

private:
  struct Slot;
  void admit(Slot& slot, BatchRequest request);
  static bool scores_prompt(const Slot& slot);  // it asked for its prompt's logprobs
  // The positions of `slot`'s caches that `request` keeps (reuse_prefix).
  static int64_t reused_positions(const Slot& slot, const BatchRequest& request);
  static bool prefilling(const Slot& slot);     // part of its prompt is not in its caches yet
  // Every admitted prompt into its slot's caches: each prompt not scored in
  // a forward of its own, the scored ones side by side in passes of up to
  // kPrefillTokens positions (DecoderLM::forward_cached_packed). Each then
  // goes to prefilled().
  void prefill();
  // A slot's prompt is in its caches: its prompt's logprobs are told, and
  // its first token drawn from `logits` [1, 1, V], its last position's.
  void prefilled(Slot& slot, const Tensor& logits);
  // Appends the token sampled for `slot`, emits its text, and finishes it when it is done.
  void draw(Slot& slot, const float* logits, int64_t vocab);
  void accept(Slot& slot, int64_t token);
  void finish(Slot& slot, const std::string& reason, const std::string& error = "");
  void loop(int threads);

  LanguageModel model_;
  int64_t context_, max_waiting_;
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable std::mutex mutex_;  // guards waiting_, stopping_ and the counts read by stats()
  std::condition_variable wake_;
  std::deque<BatchRequest> waiting_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  int64_t active_ = 0, steps_ = 0;
  std::thread thread_;
};

}  // namespace qkv
