// qkv._qkv — the Python bindings: a thin, typed layer over qkv/infer.h,
// qkv/checkpoint.h, the trainers and the Tensor. python/qkv/__init__.py wraps
// it; docs/python.md is the API for people.
//
// Three rules hold for every function here:
//  - a qkv::Error becomes qkv.Error with the same one-line message;
//  - compute runs with the GIL released, on a worker thread (kept for the
//    next call: Workers below), while the calling thread waits and looks for
//    Ctrl-C every 50 ms; Ctrl-C cancels the work at its next token, batch or
//    step and raises KeyboardInterrupt (run_job below);
//  - a tensor crossing into or out of Python is shared, not copied, when its
//    layout allows (Tensor.from_dlpack, Tensor.numpy, __dlpack__).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <pthread.h>

#include "qkv/batching.h"
#include "qkv/chat.h"
#include "qkv/checkpoint.h"
#include "qkv/cpu.h"
#include "qkv/encoder.h"
#include "qkv/infer.h"
#include "qkv/io.h"
#include "qkv/ops.h"
#include "qkv/registry.h"
#include "qkv/train_run.h"
#include "qkv/utf8.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace qkv::python {
namespace {

constexpr int kMaxThreads = 1024;  // as qkv --threads

// Thrown inside a callback of the library to end the work after Ctrl-C.
struct Cancelled {};

// The threads that run Python's calls, each kept, idle, for the next call
// instead of ending with its call. libgomp keeps an OpenMP pool for every
// thread that opens a parallel region, so a thread started per call made a
// new pool per call: a 2-token generate on the tiny decoder fixture took
// 13.6-15 ms on 2 cores (Xeon, model 167), 0.32 ms with
// OMP_WAIT_POLICY=passive (no thread spins), 0.32-0.38 ms now. One caller at a
// time reuses one worker, so one pool; callers at the same time get a
// worker each, as before.
class Workers {
public:
  // Runs `job` on an idle worker, or a new one when none is idle, with
  // `threads` OpenMP threads (0: the process default); returns at once.
  // `job` catches its own exceptions. `finished` runs after it, once the
  // worker is idle again, so that a call made after it reuses the worker.
  void submit(std::function<void()> job, std::function<void()> finished, int threads) {
    std::unique_lock<std::mutex> lock(mu_);
    Worker* w;
    if (!idle_.empty()) {
      w = idle_.back();
      idle_.pop_back();
    } else {
      w = new Worker;  // lives as long as the process; so do its thread and the Workers
      std::thread([this, w] { serve(*w); }).detach();
    }
    w->job = std::move(job);
    w->finished = std::move(finished);
    w->threads = threads;
    w->cv.notify_one();
  }

  // The workers of the process; a child after fork() starts with none (the
  // parent's threads are not in it).
  static Workers& get() {
    static const bool made = [] {
      instance() = new Workers;  // never deleted: its threads may outlive static destruction
      pthread_atfork(nullptr, nullptr, [] { instance() = new Workers; });
      return true;
    }();
    (void)made;
    return *instance();
  }

private:
  struct Worker {
    std::function<void()> job, finished;
    int threads = 0;
    std::condition_variable cv;
  };

  void serve(Worker& w) {
    const int process_default = omp_get_max_threads();  // before this thread sets its own
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      w.cv.wait(lock, [&] { return bool(w.job); });
      std::function<void()> job = std::move(w.job), finished = std::move(w.finished);
      w.job = nullptr;
      const int threads = w.threads > 0 ? w.threads : process_default;
      lock.unlock();
      omp_set_num_threads(threads);
      job();
      job = nullptr;
      lock.lock();
      idle_.push_back(&w);
      lock.unlock();
      finished();  // the last this worker touches of its caller's
      finished = nullptr;
      lock.lock();
    }
  }

  static Workers*& instance() {
    static Workers* workers = nullptr;
    return workers;
  }

  std::mutex mu_;
  std::vector<Worker*> idle_;
};

// Runs `work` on a worker with `threads` OpenMP threads (0: the default)
// while the calling Python thread waits with the GIL released. Every 50 ms
// the caller checks for a signal; on Ctrl-C it sets `cancel`, which the
// work's callbacks read (throwing Cancelled), waits for the work to end, and
// raises KeyboardInterrupt. An exception of the work is raised here.
void run_job(const std::function<void()>& work, std::atomic<bool>& cancel, int threads) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  {
    nb::gil_scoped_release nogil;
    Workers::get().submit(
        [&] {
          try {
            work();
          } catch (const Cancelled&) {
          } catch (...) {
            error = std::current_exception();
          }
        },
        [&] {
          std::lock_guard<std::mutex> lock(mu);
          done = true;
          cv.notify_all();
        },
        threads);
  }
  bool interrupted = false;
  for (;;) {
    {
      nb::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lock(mu);
      if (cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; })) break;
    }
    if (!interrupted && PyErr_CheckSignals() != 0) {  // the KeyboardInterrupt stays set until raised below
      interrupted = true;
      cancel = true;
    }
  }
  cancel = false;
  if (interrupted) {
    error = nullptr;  // (with the GIL: it may hold a Python error) the interrupt is what the user asked for
    throw nb::python_error();
  }
  if (error) std::rethrow_exception(error);
}

void check_threads(int threads) {
  QKV_CHECK(threads >= 0 && threads <= kMaxThreads, "threads=", threads, ": expected 0 (all cores) or 1 to ",
            kMaxThreads);
}

// --- tensors ---------------------------------------------------------------

nb::dlpack::dtype to_dlpack(DType t) {
  switch (t) {
    case DType::F32: return nb::dtype<float>();
    case DType::F16: return {(uint8_t)nb::dlpack::dtype_code::Float, 16, 1};
    case DType::BF16: return {(uint8_t)nb::dlpack::dtype_code::Bfloat, 16, 1};
    case DType::I64: return nb::dtype<int64_t>();
    case DType::I32: return nb::dtype<int32_t>();
    case DType::I8: return nb::dtype<int8_t>();
    case DType::U8: return nb::dtype<uint8_t>();
  }
  fail("a tensor of an unknown dtype");
}

DType from_dlpack(nb::dlpack::dtype d) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8, DType::U8})
    if (to_dlpack(t) == d) return t;
  const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  fail("an array of ", d.code < 7 ? kinds[d.code] : "unknown", d.bits,
       " has no qkv dtype (qkv holds float32, float16, bfloat16, int64, int32, int8, uint8)");
}

using AnyArray = nb::ndarray<nb::device::cpu>;

// A qkv tensor over the memory of `a` (a NumPy array, a torch tensor, anything
// with the buffer protocol or __dlpack__), holding `a` until the last qkv
// tensor on it is gone. Nothing is copied; a negative stride is refused.
Tensor borrow_array(const AnyArray& a) {
  Shape shape, strides;
  for (size_t d = 0; d < a.ndim(); ++d) {
    shape.push_back((int64_t)a.shape(d));
    QKV_CHECK(a.stride(d) >= 0 || a.shape(d) <= 1, "Tensor.from_dlpack: dim ", d, " has the negative stride ",
              a.stride(d), " (qkv views step forward; pass a copy, numpy.ascontiguousarray)");
    strides.push_back(a.shape(d) <= 1 ? 0 : (int64_t)a.stride(d));
  }
  const DType dtype = from_dlpack(a.dtype());
  int64_t far = 0;
  for (size_t d = 0; d < shape.size(); ++d) far += shape[d] > 0 ? (shape[d] - 1) * strides[d] : 0;
  const size_t nbytes = shape_numel(shape) == 0 ? 0 : (size_t)(far + 1) * dtype_size(dtype);
  auto* keep = new AnyArray(a);  // released with the GIL held, from whichever thread drops the last tensor
  return Tensor::borrow(const_cast<void*>(a.data()), nbytes, dtype, shape, strides, [keep] {
    nb::gil_scoped_acquire gil;
    delete keep;
  });
}

// The array view of `t` (no copy), keeping t's storage alive while it lives.
nb::ndarray<> array_of(const Tensor& t) {
  QKV_CHECK(t.device() == Device::Cpu, "a tensor on the meta device has no values to share");
  auto* keep = new Tensor(t.detach());
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
  return nb::ndarray<>(t.raw_data(), shape.size(), shape.data(), owner, strides.data(), to_dlpack(t.dtype()),
                       nb::device::cpu::value);
}

nb::object to_numpy(const Tensor& t) {
  QKV_CHECK(t.dtype() != DType::BF16, "Tensor.numpy: NumPy has no bfloat16; use t.to('F32').numpy(), or "
            "torch.from_dlpack(t), which keeps it");
  return nb::cast(nb::ndarray<nb::numpy>(array_of(t)));
}

DType parse_dtype_name(const std::string& name) {
  std::string upper = name;
  for (char& c : upper) c = (char)std::toupper((unsigned char)c);
  if (upper == "FLOAT32") upper = "F32";
  if (upper == "BFLOAT16") upper = "BF16";
  if (upper == "FLOAT16") upper = "F16";
  DType t;
  QKV_CHECK(parse_dtype(upper, &t), "dtype '", name, "': expected one of F32, F16, BF16, I64, I32, I8, U8");
  return t;
}

// --- models ----------------------------------------------------------------

// What every model object holds: the folder it came from, its family, the
// thread count and a lock (one call at a time per model: the decoders keep
// their caches in the model).
struct ModelBase {
  std::string path;
  const Family* family = nullptr;
  int threads = 0;
  std::mutex busy;
  std::atomic<bool> cancel{false};

  void run(const std::function<void()>& work) {
    run_job(
        [&] {
          std::lock_guard<std::mutex> lock(busy);
          NoGradGuard no_grad;
          work();
        },
        cancel, threads);
  }
  void check_cancel() const {
    if (cancel) throw Cancelled{};
  }
  std::string arch() const { return family->arch; }
  std::string description() const { return family->description; }
};

// Text from Python: a str, or bytes that must be UTF-8. `where` names it in
// the error ("translate: source 2").
std::string text_arg(nb::handle h, const std::string& where) {
  if (nb::isinstance<nb::bytes>(h)) {
    nb::bytes b = nb::borrow<nb::bytes>(h);
    std::string s(b.c_str(), b.size());
    const size_t bad = invalid_utf8_offset(s);
    QKV_CHECK(bad == std::string::npos, where, ": invalid UTF-8 at byte ", bad + 1);
    return s;
  }
  if (!nb::isinstance<nb::str>(h))
    throw nb::type_error((where + ": expected str or bytes, got " + nb::type_name(h.type()).c_str()).c_str());
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(h.ptr(), &n);
  if (!s) {  // a lone surrogate ("\udc80", from surrogateescape): no UTF-8 for it
    PyErr_Clear();
    fail(where, ": the text holds a lone surrogate (U+D800-U+DFFF), which is not a character UTF-8 can encode");
  }
  return std::string(s, (size_t)n);
}

// A list (or tuple) of texts; a bare str is refused, being a common slip.
std::vector<std::string> texts_arg(nb::handle h, const std::string& what) {
  if (nb::isinstance<nb::str>(h) || nb::isinstance<nb::bytes>(h) ||
      !(nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h)))
    throw nb::type_error((what + "s: expected a list of str, got " + nb::type_name(h.type()).c_str() +
                          " (one text goes in a list: [text])").c_str());
  std::vector<std::string> out;
  size_t i = 0;
  for (nb::handle item : h) out.push_back(text_arg(item, what + " " + std::to_string(++i)));
  return out;
}

struct Translator : ModelBase {
  TranslationModel m;

  // beam and max_len: None for the folder's generation_config.json ones, else greedy and 128 (translation_decoding).
  std::vector<std::string> translate(nb::handle sources_arg, std::optional<int64_t> beam_arg,
                                     std::optional<int64_t> max_len_arg, int64_t max_source_tokens, bool truncate) {
    QKV_CHECK(!beam_arg || *beam_arg >= 1, "translate: beam must be at least 1, got ", beam_arg.value_or(0));
    QKV_CHECK(!max_len_arg || *max_len_arg >= 1, "translate: max_len must be at least 1, got ",
              max_len_arg.value_or(0));
    const TranslationDecoding d = translation_decoding(m, beam_arg.value_or(0), max_len_arg.value_or(0));
    const int64_t beam = d.beam, max_len = d.max_len;
    QKV_CHECK(max_source_tokens >= 0, "translate: max_source_tokens must be at least 0, got ", max_source_tokens);
    const std::vector<std::string> sources = texts_arg(sources_arg, "translate: source");
    std::vector<std::string> out;
    run([&] {
      const SourceLimit limit{.max_tokens = max_source_tokens, .truncate = truncate};
      std::vector<std::vector<int64_t>> ids;
      for (size_t i = 0; i < sources.size(); ++i)
        ids.push_back(encode_source(m, sources[i], limit, "translate: source " + std::to_string(i + 1)));
      constexpr size_t kBatch = 64;  // as qkv translate; Ctrl-C is looked for between batches
      for (size_t start = 0; start < ids.size(); start += kBatch) {
        check_cancel();
        std::vector<std::vector<int64_t>> batch(ids.begin() + start, ids.begin() + std::min(ids.size(), start + kBatch));
        for (std::string& t : translate_ids(m, batch, max_len, beam)) out.push_back(std::move(t));
      }
    });
    return out;
  }

  // Greedy translation of `source` with the cross-attention of every layer and
  // head, and for a Transformer its encoder's and decoder's self-attention.
  nb::dict attention(nb::handle source_arg, int64_t max_len) {
    QKV_CHECK(max_len >= 1, "attention: max_len must be at least 1, got ", max_len);
    const std::string source = text_arg(source_arg, "attention: source");
    AlignedTranslation a;
    std::vector<int64_t> src;
    run([&] {
      src = encode_source(m, source, {}, "attention: source");
      a = translate_with_attention(*m.model, src, max_len, m.generation.rules);
    });
    const int64_t T = (int64_t)a.tokens.size(), S = a.source_length;
    Tensor w;
    if (!a.heads.empty()) {
      w = Tensor::from_vector(a.heads, {a.layers, a.nheads, T, S});
    } else {  // one attention (the RNN's, the convolutional model's last layer): one layer, one head
      w = Tensor::from_vector(a.weights, {1, 1, T, S});
    }
    nb::dict d;
    d["translation"] = m.tokenizer->target().decode(a.tokens);
    d["source_tokens"] = m.tokenizer->pieces(src);
    d["output_tokens"] = m.tokenizer->target().pieces(a.tokens);
    d["weights"] = to_numpy(w);
    d["averaged"] = a.heads.empty();
    // [layers, heads, S, S] and [layers, heads, T, T] (the decoder's inputs: its start token, then the
    // output tokens but the last); None for models without self-attention.
    d["encoder_self_attention"] = a.encoder_self.defined() ? nb::object(to_numpy(a.encoder_self)) : nb::none();
    d["decoder_self_attention"] = a.decoder_self.defined() ? nb::object(to_numpy(a.decoder_self)) : nb::none();
    return d;
  }
};

struct Generator : ModelBase {
  LanguageModel m;
  ChatTemplate chat_template;  // the folder's chat format, read at load
  std::string chat_error;      // why it cannot chat, when it cannot

  void read_chat_template() {
    try {
      chat_template = chat_template_of_folder(path);
      if (chat_template.format == ChatFormat::None) chat_error = "its folder defines no chat template";
    } catch (const Error& e) {
      chat_error = e.what();
    }
  }

  // A list of {"role": str, "content": str} in the folder's chat format.
  std::string chat_prompt(nb::handle messages_arg) {
    QKV_CHECK(chat_error.empty(), "chat: ", path, " cannot chat: ", chat_error);
    QKV_CHECK(nb::isinstance<nb::list>(messages_arg), "chat: messages must be a list of {\"role\", \"content\"}");
    std::vector<ChatMessage> messages;
    size_t i = 0;
    for (nb::handle m : nb::borrow<nb::list>(messages_arg)) {
      const std::string where = "chat: messages[" + std::to_string(i++) + "]";
      QKV_CHECK(nb::isinstance<nb::dict>(m), where, " must be a dict with \"role\" and \"content\"");
      nb::dict d = nb::borrow<nb::dict>(m);
      QKV_CHECK(d.contains("role") && nb::isinstance<nb::str>(d["role"]), where, ": \"role\" must be a str");
      QKV_CHECK(d.contains("content") && nb::isinstance<nb::str>(d["content"]), where, ": \"content\" must be a str");
      messages.push_back({nb::cast<std::string>(d["role"]), nb::cast<std::string>(d["content"])});
    }
    return format_chat(chat_template, messages);
  }

  // The assistant's answer to `messages`: generate on chat_prompt, up to the
  // format's end of turn.
  std::string chat(nb::handle messages_arg, const GenerateOptions& o) {
    const std::string prompt = chat_prompt(messages_arg);
    std::string text;
    run([&] {
      text = generate_turn(m, prompt, chat_template.end_of_turn, o, [&](const std::string&) { check_cancel(); });
    });
    return text;
  }

  GenerateOptions options(int64_t max_new_tokens, float temperature, int64_t top_k, float top_p, float min_p,
                          float typical_p, float presence_penalty, float frequency_penalty, uint64_t seed,
                          bool ignore_eos, bool truncate_prompt) const {
    QKV_CHECK(max_new_tokens >= 0, "generate: max_new_tokens must be at least 0, got ", max_new_tokens);
    QKV_CHECK(temperature >= 0, "generate: temperature must be at least 0, got ", temperature);
    QKV_CHECK(top_k >= 0, "generate: top_k must be at least 0, got ", top_k);
    QKV_CHECK(top_p > 0 && top_p <= 1, "generate: top_p must be in (0, 1], got ", top_p);
    QKV_CHECK(min_p >= 0 && min_p <= 1, "generate: min_p must be in [0, 1], got ", min_p);
    QKV_CHECK(typical_p > 0 && typical_p <= 1, "generate: typical_p must be in (0, 1], got ", typical_p);
    QKV_CHECK(std::fabs(presence_penalty) <= 2, "generate: presence_penalty must be in [-2, 2], got ",
              presence_penalty);
    QKV_CHECK(std::fabs(frequency_penalty) <= 2, "generate: frequency_penalty must be in [-2, 2], got ",
              frequency_penalty);
    return {.max_new_tokens = max_new_tokens, .temperature = temperature, .top_k = top_k, .top_p = top_p,
            .min_p = min_p, .typical_p = typical_p, .seed = seed, .presence_penalty = presence_penalty,
            .frequency_penalty = frequency_penalty, .truncate_prompt = truncate_prompt, .ignore_eos = ignore_eos};
  }

  std::string generate(const std::string& prompt, const GenerateOptions& o) {
    std::string text;
    run([&] {
      qkv::generate(m, prompt, o, [&](const std::string& piece) {
        check_cancel();
        text += piece;
      });
    });
    return text;
  }

  std::vector<int64_t> tokenize(nb::handle text) {
    QKV_CHECK(m.tokenizer, "tokenize: ", path, " has no tokenizer (the model runs on token ids)");
    return m.tokenizer->encode(text_arg(text, "tokenize: text"));
  }

  // One prompt of score(): a text (after <bos> where the model puts one) or
  // a list of token ids, as given.
  std::vector<int64_t> score_ids(nb::handle h, const std::string& where) const {
    if (nb::isinstance<nb::str>(h) || nb::isinstance<nb::bytes>(h))
      return m.tokenizer->encode_prompt(text_arg(h, where));
    if (!nb::isinstance<nb::list>(h) && !nb::isinstance<nb::tuple>(h))
      throw nb::type_error((where + ": expected str, bytes or a list of token ids, got " +
                            nb::type_name(h.type()).c_str()).c_str());
    std::vector<int64_t> ids;
    const int64_t V = m.model->config().vocab_size;
    for (nb::handle item : h) {
      if (!nb::isinstance<nb::int_>(item) || nb::isinstance<nb::bool_>(item))
        throw nb::type_error((where + ": token ids must be int, got " + nb::type_name(item.type()).c_str()).c_str());
      const int64_t id = nb::cast<int64_t>(item);
      QKV_CHECK(id >= 0 && id < V, where, ": token id ", id, " is outside the vocabulary [0, ", V, ")");
      ids.push_back(id);
    }
    return ids;
  }

  // Each prompt's tokens and their log-probabilities given the tokens before
  // them, the prompts scored side by side as qkv serve scores an `echo`
  // request's (BatchGenerator: packed prefill passes).
  nb::object score(nb::handle prompts_arg) {
    QKV_CHECK(m.tokenizer, "score: ", path, " has no tokenizer (the model runs on token ids)");
    const bool many = (nb::isinstance<nb::list>(prompts_arg) || nb::isinstance<nb::tuple>(prompts_arg)) &&
                      nb::len(prompts_arg) > 0 && !nb::isinstance<nb::int_>(prompts_arg[0]);
    std::vector<std::vector<int64_t>> prompts;
    if (!many) {
      prompts.push_back(score_ids(prompts_arg, "score: prompt"));
    } else {
      size_t i = 0;
      for (nb::handle h : prompts_arg) prompts.push_back(score_ids(h, "score: prompt " + std::to_string(++i)));
    }
    const int64_t context = m.model->config().context;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::string which = many ? " " + std::to_string(i + 1) : "";
      QKV_CHECK(!prompts[i].empty(), "score: prompt", which, " is empty");
      QKV_CHECK((int64_t)prompts[i].size() < context, "score: prompt", which, " is ", prompts[i].size(),
                " tokens; at most ", context - 1, " fit (the context is ", context, ")");
    }
    std::vector<BatchResult> results(prompts.size());
    run([&] {
      constexpr int64_t kSlots = 8;  // prompts prefilled side by side at most
      BatchGenerator g(m, std::min<int64_t>(kSlots, (int64_t)prompts.size()), context, (int64_t)prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        BatchRequest r;
        r.prompt = prompts[i];
        r.options.max_new_tokens = 0;
        r.logprobs = 0;
        r.prompt_logprobs = true;
        r.on_done = [&results, i](const BatchResult& done) { results[i] = done; };
        QKV_CHECK(g.submit(std::move(r)), "score: the prompts did not fit the queue");
      }
      while (g.step()) check_cancel();
    });
    nb::list out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const BatchResult& r = results[i];
      QKV_CHECK(r.finish_reason == "length", "score: prompt", many ? " " + std::to_string(i + 1) : "", " failed: ",
                r.error.empty() ? r.finish_reason : r.error);
      nb::list logprobs;
      for (const TokenLogprob& t : r.prompt_logprobs)
        logprobs.append(std::isnan(t.logprob) ? nb::none() : nb::cast(t.logprob));
      nb::dict d;
      d["tokens"] = nb::cast(prompts[i]);
      d["logprobs"] = logprobs;
      out.append(d);
    }
    return many ? nb::object(out) : nb::object(out[0]);
  }
};

// The pieces of a streaming generate, produced by a worker thread and read by
// Python's iterator protocol. Leaving the loop early (or Ctrl-C while it
// waits) cancels the generation at its next token.
class Stream {
public:
  Stream(std::shared_ptr<Generator> g, std::string prompt, GenerateOptions o) : g_(std::move(g)) {
    Workers::get().submit(
        [this, prompt = std::move(prompt), o] {
          try {
            std::lock_guard<std::mutex> busy(g_->busy);
            NoGradGuard no_grad;
            qkv::generate(g_->m, prompt, o, [this](const std::string& piece) {
              if (stop_) throw Cancelled{};
              std::lock_guard<std::mutex> lock(mu_);
              pieces_.push_back(piece);
              cv_.notify_all();
            });
          } catch (const Cancelled&) {
          } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            error_ = std::current_exception();
          }
        },
        [this] {
          std::lock_guard<std::mutex> lock(mu_);
          done_ = true;
          cv_.notify_all();
        },
        g_->threads);
  }
  ~Stream() { close(); }

  std::string next() {
    for (;;) {
      {
        nb::gil_scoped_release nogil;
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return !pieces_.empty() || done_; })) {
          if (!pieces_.empty()) {
            std::string piece = std::move(pieces_.front());
            pieces_.pop_front();
            return piece;
          }
          if (error_) {
            std::exception_ptr e = error_;
            error_ = nullptr;
            lock.unlock();
            join();
            std::rethrow_exception(e);
          }
          lock.unlock();
          join();
          throw nb::stop_iteration();
        }
      }
      if (PyErr_CheckSignals() != 0) {
        close();
        throw nb::python_error();
      }
    }
  }

  void close() {
    stop_ = true;
    join();
  }

private:
  // Waits for the work to end (it has set done_).
  void join() {
    auto wait = [this] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return done_; });
    };
    if (PyGILState_Check()) {
      nb::gil_scoped_release nogil;
      wait();
    } else {
      wait();
    }
  }

  std::shared_ptr<Generator> g_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> pieces_;
  std::exception_ptr error_;
  bool done_ = false;
  std::atomic<bool> stop_{false};
};

struct Embedder : ModelBase {
  EmbeddingModel m;

  // [N, D] float32: one row per text, as qkv embed writes them.
  Tensor embed(nb::handle texts_in, std::optional<bool> normalize, bool truncate) {
    const std::vector<std::string> texts = texts_arg(texts_in, "embed: text");
    std::vector<std::vector<float>> rows;
    run([&] {
      rows = embed_texts(m, texts, normalize.value_or(false), {.truncate = truncate},
                         [](size_t i) { return "embed: text " + std::to_string(i + 1); });
    });
    const int64_t D = m.model->config().d_model;
    Tensor out = Tensor::empty({(int64_t)rows.size(), D});
    for (size_t i = 0; i < rows.size(); ++i) std::copy(rows[i].begin(), rows[i].end(), out.data<float>() + i * D);
    return out;
  }
};

struct Classifier : ModelBase {
  std::shared_ptr<VisionTransformer> m;

  // Images as the model's pixels: uint8 arrays [B, H, W] (one channel) or
  // [B, C, H, W] (one image without B is one too), or a list of PNG/JPEG paths.
  ImageSet images(const nb::handle& in) const {
    const ViTConfig& c = m->config();
    const int64_t size = c.image_size, pixels = c.channels * size * size;
    ImageSet set;
    set.channels = c.channels, set.height = size, set.width = size;
    if (nb::isinstance<nb::list>(in) || nb::isinstance<nb::tuple>(in)) {
      for (nb::handle item : in) {
        QKV_CHECK(nb::isinstance<nb::str>(item), "classify: a list of images holds file paths (str), got ",
                  nb::type_name(item.type()).c_str());
        const std::vector<uint8_t> im = read_image(nb::cast<std::string>(item), c.channels, c.image_resize());
        set.pixels.insert(set.pixels.end(), im.begin(), im.end());
        ++set.count;
      }
    } else {
      // uint8 only: a float array is not cast silently (nanobind would truncate it).
      AnyArray any;
      const bool is_array = nb::try_cast(in, any, /*convert=*/false);
      QKV_CHECK(is_array && any.dtype() == nb::dtype<uint8_t>(), "classify: images are a uint8 array (pixels "
                "0-255) or a list of file paths, got ", is_array ? "an array of another dtype" : nb::type_name(in.type()).c_str());
      nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu> a;
      QKV_CHECK(nb::try_cast(in, a), "classify: the images could not be read as one contiguous uint8 array");
      Shape s;
      for (size_t d = 0; d < a.ndim(); ++d) s.push_back((int64_t)a.shape(d));
      const bool gray = c.channels == 1;
      const bool ok = (s.size() == 4 && s[1] == c.channels && s[2] == size && s[3] == size) ||
                      (s.size() == 3 && ((gray && s[1] == size && s[2] == size) ||
                                         (s[0] == c.channels && s[1] == size && s[2] == size))) ||
                      (s.size() == 2 && gray && s[0] == size && s[1] == size);
      QKV_CHECK(ok, "classify: images of shape ", shape_str(s), "; the model takes ", c.channels, "x", size, "x", size,
                " pixels: [B, ", c.channels, ", ", size, ", ", size, "]", gray ? " or [B, H, W] or [H, W]" : "");
      set.pixels.assign(a.data(), a.data() + a.size());
      set.count = (int64_t)a.size() / pixels;
    }
    QKV_CHECK(set.count > 0, "classify: no images");
    return set;
  }

  Tensor probabilities(const ImageSet& set) {
    Tensor probs;
    run([&] {
      std::vector<int64_t> all(set.count);
      for (int64_t i = 0; i < set.count; ++i) all[i] = i;
      probs = classify_images(*m, image_batch(set, all));
    });
    return probs;
  }

  std::vector<std::vector<std::pair<std::string, float>>> classify(const nb::handle& in, int64_t top_k) {
    QKV_CHECK(top_k >= 1, "classify: top_k must be at least 1, got ", top_k);
    const ImageSet set = images(in);
    Tensor probs = probabilities(set);
    const ViTConfig& c = m->config();
    const int64_t C = c.num_classes, k = std::min(top_k, C);
    std::vector<std::vector<std::pair<std::string, float>>> out;
    for (int64_t i = 0; i < set.count; ++i) {
      const float* p = probs.data<float>() + i * C;
      std::vector<std::pair<std::string, float>> top;
      for (int64_t j : top_classes(p, C, k)) top.emplace_back(c.class_names[j], p[j]);
      out.push_back(std::move(top));
    }
    return out;
  }
};

// A model object of type T for the folder `path`, its weights read by
// `read(T&)` on the worker thread (in the dtype the loader was given).
template <class T, class Read>
nb::object load_as(const std::string& path, const Family& family, int threads, Read read) {
  auto model = std::make_shared<T>();
  model->path = path;
  model->family = &family;
  model->threads = threads;
  std::atomic<bool> cancel{false};
  run_job([&] { read(*model); }, cancel, threads);
  return nb::cast(model);
}

nb::object load(const std::string& path, const std::string& dtype, int threads) {
  check_threads(threads);
  QKV_CHECK(dtype.empty() || dtype == "f32" || dtype == "bf16" || dtype == "f16" || dtype == "int8", "load: dtype '", dtype,
            "': expected None (as stored), 'f32', 'bf16', 'f16' or 'int8'");
  const Family& family = family_of_folder(path);
  switch (family.domain) {
    case Domain::Translation:
      return load_as<Translator>(path, family, threads,
                                 [&](Translator& t) { t.m = load_translation_model(path, "load", dtype); });
    case Domain::Language:
      return load_as<Generator>(path, family, threads,
                                [&](Generator& g) {
                                  g.m = load_language_model(path, "load", dtype);
                                  g.read_chat_template();
                                });
    case Domain::Vision:
      return load_as<Classifier>(path, family, threads,
                                 [&](Classifier& c) { c.m = load_vit_model(path, "load", dtype); });
    case Domain::Embedding:
      return load_as<Embedder>(path, family, threads,
                               [&](Embedder& e) { e.m = load_embedding_model(path, "load", dtype); });
  }
  fail("load: ", path, ": a family of an unknown domain");
}

// --- training ----------------------------------------------------------------

nb::dict progress_dict(int64_t step, int64_t total, float loss, float lr, double eta, int64_t skipped) {
  nb::dict d;
  d["step"] = step, d["total_steps"] = total, d["loss"] = loss, d["lr"] = lr, d["eta_seconds"] = eta;
  d["skipped_steps"] = skipped;
  return d;
}

// qkv.train: train_from_config (qkv/train_run.h), as `qkv train` runs it, with
// Python callbacks in place of its printing. on_step(dict) after every step;
// on_eval(dict) after each validation (each epoch for a vit), a true return
// ending a translation run there. The callbacks run on the worker thread,
// each taking the GIL for its call.
nb::dict train(TrainRun run, int threads, nb::object on_step, nb::object on_eval) {
  check_threads(threads);
  run.flag_names = false;
  QKV_CHECK(!run.config_source.empty() || !run.init.empty(), "train: config is required (or init= to fine-tune a model folder)");
  if (run.config_source.empty()) run.config_source = "(the default train section)", run.config_text = "{}";
  else run.config_text = read_file(run.config_source);
  std::atomic<bool> cancel{false};
  // `report` makes the step's dict, with the GIL held.
  auto step = [&](const auto& report) {
    if (cancel) throw Cancelled{};
    if (on_step.is_none()) return;
    nb::gil_scoped_acquire gil;
    on_step(report());
  };
  // on_eval's answer: whether to stop.
  auto evaluated = [&](const auto& report) {
    if (on_eval.is_none()) return false;
    nb::gil_scoped_acquire gil;
    nb::object r = on_eval(report());
    const int truth = PyObject_IsTrue(r.ptr());
    if (truth < 0) throw nb::python_error();
    return truth == 1;
  };
  TrainHooks hooks;
  hooks.translation.progress = [&](const TrainProgress& p) {
    step([&] {
      nb::dict d = progress_dict(p.step, p.total_steps, p.loss, p.lr, p.eta_seconds, p.skipped_steps);
      d["tokens_per_second"] = p.tokens_per_second;
      return d;
    });
  };
  bool stop_now = false;
  hooks.translation.evaluated = [&](const EvalReport& r) {
    stop_now = evaluated([&] {
      nb::dict d;
      d["step"] = r.step, d["valid_loss"] = r.valid_loss, d["chrf"] = r.chrf, d["bleu"] = r.bleu, d["best"] = r.best;
      return d;
    });
  };
  hooks.translation.stop = [&](const EvalReport&) { return stop_now; };
  hooks.language.progress = [&](const LmProgress& p) {
    step([&] {
      nb::dict d = progress_dict(p.step, p.total_steps, p.loss, p.lr, p.eta_seconds, p.skipped_steps);
      d["tokens_per_second"] = p.tokens_per_second;
      return d;
    });
  };
  hooks.language.evaluated = [&](const LmEvalReport& r) {
    evaluated([&] {
      nb::dict d;
      d["step"] = r.step, d["valid_loss"] = r.valid_loss, d["perplexity"] = r.perplexity, d["best"] = r.best;
      return d;
    });
  };
  hooks.vision.progress = [&](const VitProgress& p) {
    step([&] {
      nb::dict d = progress_dict(p.step, p.total_steps, p.loss, p.lr, p.eta_seconds, p.skipped_steps);
      d["epoch"] = p.epoch, d["images_per_second"] = p.images_per_second;
      return d;
    });
  };
  hooks.vision.epoch_done = [&](const VitEpochReport& r) {
    evaluated([&] {
      nb::dict d;
      d["epoch"] = r.epoch, d["train_loss"] = r.train_loss, d["test_accuracy"] = r.test_accuracy;
      d["seconds"] = r.seconds, d["best"] = r.best;
      return d;
    });
  };
  TrainOutcome outcome;
  run_job([&] { outcome = train_from_config(run, hooks); }, cancel, threads);
  nb::dict result;
  result["out"] = run.out;
  result["last_step"] = outcome.last_step;
  result["stopped_early"] = outcome.stopped_early;
  return result;
}

}  // namespace
}  // namespace qkv::python

NB_MODULE(_qkv, m) {
  using namespace qkv;
  using namespace qkv::python;
  m.doc() = "qkv: attention and Transformers in C++ (the compiled part; import qkv)";

  nb::exception<Error>(m, "Error", PyExc_ValueError);

  m.def("runtime", [] { return runtime_summary(); },
        "What runs the compute: the CPU, its features, the kernel level, the GEMM library, the threads.");

  nb::class_<Tensor>(m, "Tensor", "A qkv tensor: shape, strides (in elements), dtype; shares memory with NumPy "
                                   "and DLPack consumers.")
      .def_static("from_dlpack", [](AnyArray a) { return borrow_array(a); }, "array"_a,
                  "A tensor over the memory of `array` (NumPy, torch, anything with __dlpack__ or the buffer "
                  "protocol), without a copy; the array is kept alive while the tensor is.")
      .def("numpy", &to_numpy, "The values as a NumPy array sharing this tensor's memory (no copy).")
      .def("__dlpack__", [](const Tensor& t, nb::kwargs kwargs) {
             return nb::cast(nb::ndarray<nb::array_api>(array_of(t))).attr("__dlpack__")(**kwargs);
           }, "kwargs"_a)
      .def("__dlpack_device__", [](const Tensor&) { return nb::make_tuple(1, 0); })  // kDLCPU, device 0
      .def("__array__", [](const Tensor& t, nb::args, nb::kwargs) { return to_numpy(t); })
      .def_prop_ro("shape", [](const Tensor& t) { return nb::tuple(nb::cast(t.shape())); })
      .def_prop_ro("strides", [](const Tensor& t) { return nb::tuple(nb::cast(t.strides())); },
                   "Strides in elements (NumPy's are in bytes).")
      .def_prop_ro("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_prop_ro("ndim", &Tensor::dim)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("contiguous", &Tensor::contiguous, "This tensor, or a contiguous copy when it is a strided view.")
      .def("to", [](const Tensor& t, const std::string& dtype) { return t.to(parse_dtype_name(dtype)); }, "dtype"_a,
           "A copy converted to `dtype` (F32, F16, BF16, I64, I32, I8, U8).")
      .def("shares_memory", [](const Tensor& a, const Tensor& b) { return a.same_storage(b); }, "other"_a)
      .def("__len__", [](const Tensor& t) {
        QKV_CHECK(t.dim() > 0, "len() of a 0-d tensor");
        return t.size(0);
      })
      .def("__repr__", [](const Tensor& t) {
        return "qkv.Tensor(shape=" + shape_str(t.shape()) + ", dtype=" + dtype_name(t.dtype()) + ")";
      });

  nb::class_<ModelBase>(m, "Model")
      .def_ro("path", &ModelBase::path, "The folder the model was loaded from.")
      .def_prop_ro("arch", &ModelBase::arch, "The family's config.json \"arch\".")
      .def_prop_ro("description", &ModelBase::description)
      .def_ro("threads", &ModelBase::threads);

  nb::class_<Translator, ModelBase>(m, "Translator", "A translation model (arch transformer, rnn_attention, conv).")
      .def("translate", &Translator::translate,
           nb::sig("def translate(self, sources: list[str | bytes], *, beam: int | None = None, "
                   "max_len: int | None = None, max_source_tokens: int = 0, truncate: bool = False) -> list[str]"),
           "sources"_a, nb::kw_only(), "beam"_a = nb::none(), "max_len"_a = nb::none(), "max_source_tokens"_a = 0,
           "truncate"_a = false,
           "Each source sentence translated: greedy when beam is 1, else beam search. None: the folder's "
           "generation_config.json num_beams and length (else 1 and 128).")
      .def("attention", &Translator::attention,
           nb::sig("def attention(self, source: str | bytes, *, max_len: int = 128) -> dict[str, object]"), "source"_a,
           nb::kw_only(), "max_len"_a = 128,
           "The greedy translation of `source` with its cross-attention weights, [layers, heads, output tokens, "
           "source tokens], and for a Transformer its encoder's and decoder's self-attention.")
      .def("__repr__",
           [](const Translator& t) { return "<qkv.Translator " + t.m.model->summary() + " from " + t.path + ">"; });

  nb::class_<Generator, ModelBase>(m, "LanguageModel", "A decoder-only language model (arch decoder; GPT-2, Llama, "
                                                       "Mistral, Mixtral, Qwen2, Qwen3 folders).")
      .def("generate", [](std::shared_ptr<Generator> g, nb::handle prompt_arg, int64_t max_new_tokens,
                          float temperature, int64_t top_k, float top_p, float min_p, float typical_p,
                          float presence_penalty, float frequency_penalty, uint64_t seed, bool stream, bool ignore_eos,
                          bool truncate_prompt) -> nb::object {
             const std::string prompt = text_arg(prompt_arg, "generate: prompt");
             GenerateOptions o = g->options(max_new_tokens, temperature, top_k, top_p, min_p, typical_p,
                                            presence_penalty, frequency_penalty, seed, ignore_eos, truncate_prompt);
             if (stream) return nb::cast(std::make_unique<Stream>(g, prompt, o));
             return nb::cast(g->generate(prompt, o));
           },
           nb::sig("def generate(self, prompt: str | bytes, *, max_new_tokens: int = 100, temperature: float = 1.0, "
                   "top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, typical_p: float = 1.0, "
                   "presence_penalty: float = 0.0, frequency_penalty: float = 0.0, seed: int = 1, "
                   "stream: bool = False, ignore_eos: bool = False, truncate_prompt: bool = False) "
                   "-> str | GenerateStream"),
           "prompt"_a, nb::kw_only(), "max_new_tokens"_a = 100, "temperature"_a = 1.0f, "top_k"_a = 0,
           "top_p"_a = 1.0f, "min_p"_a = 0.0f, "typical_p"_a = 1.0f, "presence_penalty"_a = 0.0f,
           "frequency_penalty"_a = 0.0f, "seed"_a = 1, "stream"_a = false, "ignore_eos"_a = false,
           "truncate_prompt"_a = false,
           "The text that continues `prompt`: sampled at `temperature` (0: greedy) from the top_k / top_p tokens "
           "(and, with min_p, only those at least min_p times as likely as the most likely one; with typical_p, "
           "locally typical sampling; OpenAI's presence and frequency penalties on the tokens generated so far), "
           "until <eos> or max_new_tokens. With stream=True, an iterator of the text's pieces as they are made.")
      .def("chat",
           [](Generator& g, nb::handle messages, int64_t max_new_tokens, float temperature, int64_t top_k, float top_p,
              float min_p, float typical_p, float presence_penalty, float frequency_penalty, uint64_t seed) {
             return g.chat(messages, g.options(max_new_tokens, temperature, top_k, top_p, min_p, typical_p,
                                               presence_penalty, frequency_penalty, seed, false, false));
           },
           nb::sig("def chat(self, messages: list[dict[str, str]], *, max_new_tokens: int = 100, "
                   "temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, "
                   "typical_p: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0, "
                   "seed: int = 1) -> str"),
           "messages"_a, nb::kw_only(), "max_new_tokens"_a = 100, "temperature"_a = 1.0f, "top_k"_a = 0,
           "top_p"_a = 1.0f, "min_p"_a = 0.0f, "typical_p"_a = 1.0f, "presence_penalty"_a = 0.0f,
           "frequency_penalty"_a = 0.0f, "seed"_a = 1,
           "The assistant's answer to `messages` ([{\"role\": ..., \"content\": ...}]): generate on "
           "chat_prompt(messages), up to the chat format's end of turn.")
      .def("chat_prompt", &Generator::chat_prompt,
           nb::sig("def chat_prompt(self, messages: list[dict[str, str]]) -> str"), "messages"_a,
           "The prompt text of `messages` in the folder's chat format: its chat template run as transformers "
           "runs it (less a leading bos_token, which the tokenizer puts first itself), or a known layout.")
      .def("tokenize", &Generator::tokenize, nb::sig("def tokenize(self, text: str | bytes) -> list[int]"), "text"_a,
           "The token ids of `text`.")
      .def("score", &Generator::score,
           nb::sig("def score(self, prompts: str | bytes | list[int] | list[str | bytes | list[int]]) "
                   "-> dict | list[dict]"),
           "prompts"_a,
           "{\"tokens\": ids, \"logprobs\": values} for a prompt: each token's log-probability (natural log) "
           "given the tokens before it, None for the first. A text is scored after <bos> where the model puts "
           "one, a list of token ids as given; a list of prompts gives a list, scored side by side as qkv serve "
           "scores them.")
      .def("__repr__", [](const Generator& g) { return "<qkv.LanguageModel " + g.m.model->summary() + " from " + g.path + ">"; });

  nb::class_<Stream>(m, "GenerateStream", "The text of a generate(..., stream=True), piece by piece.")
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &Stream::next)
      .def("close", &Stream::close, "Stops the generation (also when the stream is dropped).");

  nb::class_<Embedder, ModelBase>(m, "Embedder", "A text encoder for sentence embeddings (arch encoder; a Hugging "
                                  "Face BertModel or sentence-transformers folder).")
      .def("embed", [](Embedder& e, nb::handle texts, std::optional<bool> normalize, bool truncate) {
             return to_numpy(e.embed(texts, normalize, truncate));
           },
           nb::sig("def embed(self, texts: list[str | bytes], *, normalize: bool | None = None, truncate: bool = False) "
                   "-> numpy.typing.NDArray[numpy.float32]"),
           "texts"_a, nb::kw_only(), "normalize"_a = nb::none(), "truncate"_a = false,
           "One embedding per text, as a float32 array [len(texts), d_model]: the folder's pooling (mean or [CLS]), "
           "unit length when normalize is True or the folder has a Normalize module. A text longer than the model "
           "reads is an error naming it, unless truncate=True cuts it (as sentence-transformers does).")
      .def_prop_ro("dimension", [](const Embedder& e) { return e.m.model->config().d_model; },
                   "The length of each embedding.")
      .def("__repr__", [](const Embedder& e) { return "<qkv.Embedder " + e.m.model->summary() + " from " + e.path + ">"; });

  nb::class_<Classifier, ModelBase>(m, "ImageClassifier", "A Vision Transformer (arch vit).")
      .def("classify", &Classifier::classify, "images"_a, nb::kw_only(), "top_k"_a = 3,
           "The top_k (label, probability) pairs of each image, most likely first.")
      .def("probabilities", [](Classifier& c, nb::handle images) { return to_numpy(c.probabilities(c.images(images))); },
           "images"_a, "The softmax probabilities, [images, classes].")
      .def_prop_ro("class_names", [](const Classifier& c) { return c.m->config().class_names; })
      .def("__repr__", [](const Classifier& c) { return "<qkv.ImageClassifier " + c.m->summary() + " from " + c.path + ">"; });

  m.def("load", &load, "path"_a, nb::kw_only(), "dtype"_a = "", "threads"_a = 0,
        "The model in folder `path` (a qkv model folder or a Hugging Face one): a Translator, LanguageModel or "
        "ImageClassifier, by its family.");

  m.def("train", [](const std::string& config, const std::string& train_data, const std::string& out,
                    const std::string& valid, std::optional<int64_t> steps, std::optional<int64_t> epochs,
                    std::optional<double> lr, std::optional<int64_t> seed, std::optional<std::string> precision,
                    const std::string& init, bool resume, int threads, nb::object on_step, nb::object on_eval) {
          std::optional<Precision> p;
          if (precision) {
            QKV_CHECK(*precision == "f32" || *precision == "bf16", "train: precision must be 'f32' or 'bf16', got '",
                      *precision, "'");
            p = *precision == "bf16" ? Precision::Bf16 : Precision::F32;
          }
          return qkv::python::train({.config_source = config, .train = train_data, .valid = valid, .out = out,
                                     .resume = resume, .init = init, .steps = steps, .epochs = epochs, .seed = seed, .lr = lr,
                                     .precision = p},
                                    threads, on_step, on_eval);
        },
        "config"_a, nb::kw_only(), "train"_a, "out"_a, "valid"_a = "", "steps"_a = nb::none(),
        "epochs"_a = nb::none(), "lr"_a = nb::none(), "seed"_a = nb::none(), "precision"_a = nb::none(),
        "init"_a = "", "resume"_a = false, "threads"_a = 0,
        "on_step"_a = nb::none(), "on_eval"_a = nb::none(), "Trains as `qkv train` does (see docs/python.md).");
}
