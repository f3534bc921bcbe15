// qkv serve (tools/serve/server.h): routes, request checking, streaming and
// metrics. The HTTP itself is cpp-httplib's; the model work is src/infer's.
#include "tools/serve/server.h"

#include <httplib.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <string_view>
#include <utility>
#include <nlohmann/json.hpp>

#include "qkv/base64.h"
#include "qkv/batching.h"
#include "qkv/chat.h"
#include "qkv/encoder.h"
#include "qkv/infer.h"
#include "qkv/ops.h"
#include "qkv/registry.h"
#include "qkv/utf8.h"
#include "src/core/json.h"
#include "tools/serve/explorer_html.h"
#include "tools/serve/merged_runs.h"

namespace qkv::serve {

namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// The most alternatives a request's logprobs (top_logprobs) may ask for, as OpenAI's chat.
constexpr int64_t kMaxTopLogprobs = 20;

// The most stop sequences a request may give (each is looked for at every token).
constexpr size_t kMaxStops = 32;

// A request the server refuses: its status, the field at fault, and why.
struct HttpError {
  int status;
  std::string param, message;
  std::string type = "invalid_request_error";
};

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw HttpError{400, param, message}; }

// The most attention weights one /v1/attention answer holds, every layer
// and head of every view counted: 4,194,304, about 90 MB of JSON (some 20
// bytes a weight). Without a bound an 800-byte text to the 2-layer, 4-head
// Marian fixture answered 111 MB (773 source tokens: its encoder's 8 heads
// of 773 x 773), and a real model's answer to a long text would not fit in
// memory (Qwen2-0.5B's 336 heads of 32k x 32k).
constexpr int64_t kMaxAttentionWeights = int64_t(1) << 22;

// The 400 for an answer of `weights` attention weights past the bound.
void check_attention_size(int64_t weights, const std::string& what) {
  if (weights <= kMaxAttentionWeights) return;
  bad("text", "the attention of " + what + " is " + std::to_string(weights) + " weights (every layer and head), " +
                  "more than the " + std::to_string(kMaxAttentionWeights) + " one answer holds; send a shorter text");
}

// JSON text; bytes that are not UTF-8 (none should reach here) become U+FFFD rather than an exception.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const HttpError& e) {
  json error = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) error["param"] = e.param;
  send_json(res, e.status, {{"error", error}});
}

std::string nested_too_deep(std::string field) {
  field += " is nested deeper than ";
  field += std::to_string(kMaxRequestJsonDepth);
  return field + " levels";
}

// The body as a JSON object; `known` lists the fields the endpoint reads, any other is an error.
json parse_body(const httplib::Request& req, std::initializer_list<const char*> known) {
  if (const size_t at = invalid_utf8_offset(req.body); at != std::string::npos)
    bad("", "the body is not valid UTF-8 (at byte " + std::to_string(at + 1) + ")");
  if (json_text_nested_deeper_than(req.body, kMaxRequestJsonDepth)) bad("", nested_too_deep("the body"));
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::exception& e) {  // a parse error, or a number past a double's range (out_of_range 406)
    bad("", std::string("the body is not JSON: ") + e.what());
  }
  if (!body.is_object()) bad("", "the body must be a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it) {
    bool found = false;
    for (const char* k : known) found = found || it.key() == k;
    if (!found) bad(it.key(), "unknown field '" + it.key() + "'");
  }
  return body;
}

int64_t int_field(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  const json& v = body[name];
  if (!v.is_number_integer()) bad(name, std::string(name) + " must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(name, std::string(name) + " must be " + std::to_string(lo) + " to " + std::to_string(hi) +
                                      ", got " + std::to_string(x));
  return x;
}

double number_field(const json& body, const char* name, double fallback, double lo, double hi) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  const json& v = body[name];
  if (!v.is_number()) bad(name, std::string(name) + " must be a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "%s must be %g to %g, got %g", name, lo, hi, x);
    bad(name, msg);
  }
  return x;
}

bool bool_field(const json& body, const char* name, bool fallback) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  if (!body[name].is_boolean()) bad(name, std::string(name) + " must be true or false");
  return body[name].get<bool>();
}

// OpenAI's stream_options ({"include_usage": bool}, with stream only):
// whether the usage comes in an event of its own.
bool include_usage_field(const json& body, bool stream) {
  if (!body.contains("stream_options") || body["stream_options"].is_null()) return false;
  const json& o = body["stream_options"];
  if (!stream) bad("stream_options", "stream_options needs stream: true");
  if (!o.is_object()) bad("stream_options", "stream_options must be an object");
  for (const auto& [key, value] : o.items())
    if (key != "include_usage") bad("stream_options", "stream_options: unknown field '" + key + "'");
  const json v = o.value("include_usage", json(false));
  if (!v.is_null() && !v.is_boolean()) bad("stream_options", "stream_options.include_usage must be true or false");
  return v.is_boolean() && v.get<bool>();
}

// A string, or a list of them (OpenAI's prompt and stop).
std::vector<std::string> strings_field(const json& body, const char* name, size_t most) {
  if (!body.contains(name) || body[name].is_null()) return {};
  const json& v = body[name];
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array()) bad(name, std::string(name) + " must be a string or a list of strings");
  if (v.size() > most) bad(name, std::string(name) + " takes at most " + std::to_string(most) + " strings");
  std::vector<std::string> out;
  for (const json& s : v) {
    if (!s.is_string()) bad(name, std::string(name) + " must be a string or a list of strings");
    out.push_back(s.get<std::string>());
  }
  return out;
}

// Standard base64 (qkv/base64.h) to bytes; a data: URL prefix
// ("data:image/png;base64,") is skipped. Anything else is an error naming `param`.
std::string from_base64(const std::string& text, const std::string& param) {
  std::string_view in(text);
  if (in.rfind("data:", 0) == 0) {
    const size_t comma = in.find(',');
    if (comma == std::string_view::npos || in.substr(0, comma).find(";base64") == std::string_view::npos)
      bad(param, param + " is a data: URL that is not base64");
    in.remove_prefix(comma + 1);
  }
  std::string out, error;
  if (!base64_decode(in, &out, &error)) bad(param, param + " is not base64 (" + error + ")");
  return out;
}

// Request counts, tokens and latency, for GET /metrics.
class Metrics {
public:
  static constexpr double kBounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

  // seconds < 0: not known (the request is counted, not timed).
  void request(const std::string& endpoint, int status, double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++requests_[{endpoint, status}];
    if (seconds < 0) return;
    for (size_t i = 0; i < std::size(kBounds); ++i) buckets_[i] += seconds <= kBounds[i];
    sum_ += seconds;
    ++count_;
  }
  void generation(const BatchResult& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    prompt_tokens_ += r.prompt_tokens;
    cached_tokens_ += r.cached_tokens;
    completion_tokens_ += r.completion_tokens;
    ++finished_[r.finish_reason];
  }
  std::string text(const BatchStats* s) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string out;
    auto line = [&](const std::string& l) { out += l + "\n"; };
    line("# HELP qkv_requests_total HTTP requests answered, by endpoint and status code.");
    line("# TYPE qkv_requests_total counter");
    for (auto& [key, n] : requests_)
      line("qkv_requests_total{endpoint=\"" + key.first + "\",code=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(n));
    line("# HELP qkv_prompt_tokens_total Prompt tokens (with <bos>), those taken from a slot's caches included.");
    line("# TYPE qkv_prompt_tokens_total counter");
    line("qkv_prompt_tokens_total " + std::to_string(prompt_tokens_));
    line("# HELP qkv_prompt_tokens_cached_total Prompt tokens not prefilled: kept in a slot's caches (cache_prompt) "
         "or copied from another choice's prefill (n).");
    line("# TYPE qkv_prompt_tokens_cached_total counter");
    line("qkv_prompt_tokens_cached_total " + std::to_string(cached_tokens_));
    line("# HELP qkv_completion_tokens_total Tokens generated.");
    line("# TYPE qkv_completion_tokens_total counter");
    line("qkv_completion_tokens_total " + std::to_string(completion_tokens_));
    line("# HELP qkv_generations_total Generations ended, by finish reason (stop, length, cancelled, error).");
    line("# TYPE qkv_generations_total counter");
    for (auto& [reason, n] : finished_)
      line("qkv_generations_total{reason=\"" + reason + "\"} " + std::to_string(n));
    if (s) {
      line("# HELP qkv_queue_depth Requests waiting for a decoding slot.");
      line("# TYPE qkv_queue_depth gauge");
      line("qkv_queue_depth " + std::to_string(s->waiting));
      line("# HELP qkv_active_slots Sequences being decoded.");
      line("# TYPE qkv_active_slots gauge");
      line("qkv_active_slots " + std::to_string(s->active));
      line("# HELP qkv_slots Decoding slots (--parallel).");
      line("# TYPE qkv_slots gauge");
      line("qkv_slots " + std::to_string(s->slots));
      line("# HELP qkv_decode_steps_total Batched decoding steps.");
      line("# TYPE qkv_decode_steps_total counter");
      line("qkv_decode_steps_total " + std::to_string(s->steps));
    }
    line("# HELP qkv_request_duration_seconds Time from a request's arrival to its last byte.");
    line("# TYPE qkv_request_duration_seconds histogram");
    char buf[96];
    for (size_t i = 0; i < std::size(kBounds); ++i) {
      std::snprintf(buf, sizeof buf, "qkv_request_duration_seconds_bucket{le=\"%g\"} %lld", kBounds[i],
                    (long long)buckets_[i]);
      line(buf);
    }
    line("qkv_request_duration_seconds_bucket{le=\"+Inf\"} " + std::to_string(count_));
    std::snprintf(buf, sizeof buf, "qkv_request_duration_seconds_sum %.6f", sum_);
    line(buf);
    line("qkv_request_duration_seconds_count " + std::to_string(count_));
    return out;
  }

private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, int64_t> finished_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0;
  int64_t buckets_[std::size(kBounds)] = {};
  double sum_ = 0;
  int64_t count_ = 0;
};

// How a request's generations make its choices.
struct Choices {
  size_t per_prompt = 1;            // n: consecutive generations of one prompt (its tokens counted once in usage)
  std::vector<std::string> echoes;  // empty, or one per generation: its prompt's text, sent first in a stream
  bool usage_alone = false;         // stream_options.include_usage: a stream's usage in a last event of its own
};

// What one choice of a streamed answer has to say: a piece of its text, its
// echoed prompt, or its end.
struct StreamEvent {
  size_t choice = 0;
  std::string piece;
  std::vector<TokenLogprob> tokens;   // the piece's tokens, with logprobs
  bool echo = false;                  // the prompt, its tokens the prompt's
  std::optional<BatchResult> result;  // set on the choice's last event
};

// One streamed answer: events from the generator's thread to the HTTP thread writing them.
struct Stream {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<StreamEvent> events;
  void push(StreamEvent e) {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back(std::move(e));
    ready.notify_one();
  }
};

class Server {
public:
  Server(ModelFolder folder, const std::string& dir, const ServerOptions& o) : folder_(std::move(folder)), o_(o) {
    std::filesystem::path folder_path = std::filesystem::absolute(dir).lexically_normal();
    if (!folder_path.has_filename()) folder_path = folder_path.parent_path();  // "out/lm/" and "."
    name_ = o.name.empty() ? folder_path.filename().string() : o.name;
    const Domain domain = folder_.family->domain;
    QKV_CHECK(domain == Domain::Vision || folder_.tokenizer, "serve: ", dir,
              " is a Hugging Face folder without a tokenizer.json (qkv does not read other tokenizer files yet), so it "
              "cannot serve text from it");
    if (domain == Domain::Embedding) {
      embedder_ = {folder_.tokenizer, std::dynamic_pointer_cast<TextEncoder>(folder_.model)};
    } else if (domain == Domain::Vision) {
      vit_ = std::dynamic_pointer_cast<VisionTransformer>(folder_.model);
    } else if (domain == Domain::Language) {
      auto decoder = std::dynamic_pointer_cast<DecoderLM>(folder_.model);
      LanguageModel lm{folder_.tokenizer, decoder, read_generation_defaults(dir, decoder->config().vocab_size)};
      const int64_t model_context = lm.model->config().context;
      QKV_CHECK(o.context <= model_context, "serve: --ctx ", o.context, " is past the model's context of ",
                model_context);
      const int64_t context = o.context > 0 ? o.context : model_context;
      generator_ = std::make_unique<BatchGenerator>(lm, o.parallel, context, o.queue);
      try {  // a template qkv does not know leaves completions working; chat answers why not
        chat_ = chat_template_of_folder(dir);
        if (chat_.format == ChatFormat::None) chat_error_ = "its folder defines no chat format (no chat template)";
      } catch (const Error& e) {
        chat_error_ = e.what();
      }
      if (!chat_.end_of_turn.empty()) {  // the end-of-turn marker, when the vocabulary has it as one token
        const std::vector<int64_t> ids = lm.tokenizer->encode(chat_.end_of_turn);
        if (ids.size() == 1) end_of_turn_ = ids;
      }
    } else {
      translation_ = translation_model(folder_, dir);
    }
    created_ = (int64_t)std::time(nullptr);
  }

  int run() {
    // SIGTERM and SIGINT go to one thread that waits for them; every thread
    // started from here on (the generator's, the HTTP pool's) inherits the mask.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    signal(SIGPIPE, SIG_IGN);

    routes();
    const int port = o_.port == 0 ? http_.bind_to_any_port(o_.host)
                                  : (http_.bind_to_port(o_.host, o_.port) ? o_.port : -1);
    QKV_CHECK(port > 0, "serve: cannot listen on ", o_.host, ":", o_.port, " (", std::strerror(errno), ")");
    // The model was loaded on this thread, whose OpenMP pool now idles; decoding
    // runs on the generator's thread, with a pool of its own. With both pools
    // alive libgomp counts more threads than cores and has its workers sleep
    // (a futex wake) between parallel regions instead of spinning, which made
    // one bf16 stream 1.7x slower on two threads than on one. Releasing this
    // thread's pool leaves one.
    omp_pause_resource_all(omp_pause_soft);
    if (generator_) generator_->start(o_.threads);
    std::thread watcher([this, signals] {
      int sig = 0;
      sigwait(&signals, &sig);
      draining_ = true;  // new requests get a 503 from here on
      std::fprintf(stderr, "qkv serve: %s: finishing %lld requests in flight, then exiting\n",
                   sig == SIGTERM ? "SIGTERM" : "SIGINT", (long long)in_flight_.load());
      // httplib's stop() cuts the streams it is writing, so it waits for them to end.
      while (in_flight_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      http_.stop();
    });
    watcher.detach();
    std::printf("qkv serve: %s\n  model '%s': %s\n", folder_.family->description.c_str(), name_.c_str(),
                summary().c_str());
    std::printf("listening on http://%s:%d\n", o_.host.c_str(), port);
    std::fflush(stdout);
    if (o_.listening) o_.listening(port);
    const size_t pool = (size_t)(o_.parallel + o_.queue + 4);
    http_.new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
    const bool ok = http_.listen_after_bind();
    if (generator_) generator_->stop();
    std::printf("qkv serve: stopped\n");
    std::fflush(stdout);
    return ok ? 0 : 1;
  }

private:
  std::string summary() const {
    if (generator_) {
      const BatchStats s = generator_->stats();
      return generator_->model().model->summary() + "; " + std::to_string(s.slots) + " slots of " +
             std::to_string(generator_->context()) + " positions, queue " + std::to_string(o_.queue);
    }
    return vit_ ? "images" : embedder_.model ? embedder_.model->summary() : "translation";
  }

  // The endpoint's name for the metrics (a fixed set: never the raw path of a 404).
  static std::string endpoint_of(const httplib::Request& req) {
    static const char* known[] = {"/",
                                  "/health",
                                  "/metrics",
                                  "/v1/models",
                                  "/v1/completions",
                                  "/v1/chat/completions",
                                  "/v1/embeddings",
                                  "/v1/translate",
                                  "/v1/attention",
                                  "/v1/classify",
                                  "/tokenize",
                                  "/detokenize",
                                  "/tokenizer_info"};
    for (const char* k : known)
      if (req.path == k) return k;
    return "other";
  }

  void check_model_field(const json& body) {
    if (!body.contains("model") || body["model"].is_null()) return;
    if (!body["model"].is_string()) bad("model", "model must be a string");
    const std::string asked = body["model"].get<std::string>();
    if (asked != name_)
      throw HttpError{404, "model", "model '" + asked + "' is not served here; this server has '" + name_ + "'",
                      "not_found_error"};
  }

  const char* kind() const {
    return generator_ ? "a decoder language model" : vit_ ? "a Vision Transformer"
           : embedder_.model ? "an encoder (sentence embeddings)" : "a translation model";
  }

  // The 400 of an endpoint the served model cannot answer: `needs` says what it takes.
  void need(bool served, const std::string& endpoint, const std::string& needs) const {
    if (!served) bad("model", "model '" + name_ + "' is " + kind() + "; " + endpoint + " " + needs);
  }

  void routes() {
    http_.set_payload_max_length(o_.max_body);
    http_.set_keep_alive_timeout(2);
    // Without TCP_NODELAY a response written in two sends (headers, then
    // body) waits for the client's delayed ACK: every request on a kept-alive
    // connection (the openai client's, lm-eval's) took about 40 ms, /health too.
    http_.set_tcp_nodelay(true);
    http_.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
      started_ = Clock::now();
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      // A request httplib refused before routing (a malformed request line) was never stamped.
      const bool stamped = started_ != Clock::time_point{};
      const double seconds = stamped ? std::chrono::duration<double>(Clock::now() - started_).count() : 0.0;
      started_ = Clock::time_point{};
      metrics_.request(endpoint_of(req), res.status, stamped ? seconds : -1);
      if (!o_.quiet)
        std::fprintf(stderr, "%s %s %d %.3fs\n", req.method.c_str(), req.path.c_str(), res.status, seconds);
    });
    http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, {500, "", what, "server_error"});
    });
    http_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler's own error
      if (res.status == 413) return send_error(res, {413, "", "the body is too large", "invalid_request_error"});
      if (res.status == 404)
        return send_error(res, {404, "", "no endpoint " + req.method + " " + req.path, "not_found_error"});
      send_error(res, {res.status, "", "HTTP error " + std::to_string(res.status), "invalid_request_error"});
    });

    handle("GET", "/", [](const httplib::Request&, httplib::Response& res, const InFlightToken&) {
      res.set_content(kExplorerHtml, "text/html; charset=utf-8");
    });
    handle("GET", "/health", [this](const httplib::Request&, httplib::Response& res, const InFlightToken&) {
      json h = {{"status", "ok"}, {"model", name_}};
      if (generator_) {
        const BatchStats s = generator_->stats();
        h["slots"] = s.slots, h["active"] = s.active, h["waiting"] = s.waiting;
      }
      send_json(res, 200, h);
    });
    handle("GET", "/metrics", [this](const httplib::Request&, httplib::Response& res, const InFlightToken&) {
      BatchStats s;
      if (generator_) s = generator_->stats();
      std::string text = metrics_.text(generator_ ? &s : nullptr);
      text += "# HELP qkv_model_runs_total Batches run for /v1/translate, /v1/classify and /v1/embeddings (concurrent "
              "requests share one).\n";
      text += "# TYPE qkv_model_runs_total counter\n";
      text += "qkv_model_runs_total{endpoint=\"/v1/translate\"} " + std::to_string(translation_runs_.runs()) + "\n";
      text += "qkv_model_runs_total{endpoint=\"/v1/classify\"} " + std::to_string(image_runs_.runs()) + "\n";
      text += "qkv_model_runs_total{endpoint=\"/v1/embeddings\"} " + std::to_string(embedding_runs_.runs()) + "\n";
      res.set_content(text, "text/plain; version=0.0.4");
    });
    handle("GET", "/v1/models", [this](const httplib::Request&, httplib::Response& res, const InFlightToken&) {
      json model = {{"id", name_}, {"object", "model"}, {"created", created_}, {"owned_by", "qkv"},
                    {"arch", folder_.family->arch}};
      if (generator_) model["context"] = generator_->context();
      send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
    });
    handle("POST", "/tokenize",
           [this](const httplib::Request& req, httplib::Response& res, const InFlightToken&) { tokenize(req, res); });
    handle("POST", "/detokenize",
           [this](const httplib::Request& req, httplib::Response& res, const InFlightToken&) { detokenize(req, res); });
    handle("GET", "/tokenizer_info", [this](const httplib::Request&, httplib::Response& res, const InFlightToken&) {
      need(generator_ != nullptr, "/tokenizer_info", "serves decoder models");
      send_json(res, 200, tokenizer_info());
    });
    handle("POST", "/v1/completions",
           [this](const httplib::Request& req, httplib::Response& res, const InFlightToken& token) {
             completions(req, res, token);
           });
    handle("POST", "/v1/chat/completions",
           [this](const httplib::Request& req, httplib::Response& res, const InFlightToken& token) {
             chat_completions(req, res, token);
           });
    handle("POST", "/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res, const InFlightToken&) {
      embeddings(req, res);
    });
    handle("POST", "/v1/attention", [this](const httplib::Request& req, httplib::Response& res, const InFlightToken&) {
      attention(req, res);
    });
    handle("POST", "/v1/classify", [this](const httplib::Request& req, httplib::Response& res, const InFlightToken&) {
      classify(req, res);
    });
    handle("POST", "/v1/translate", [this](const httplib::Request& req, httplib::Response& res, const InFlightToken&) {
      translate(req, res);
    });
  }

  // Counts a request in flight while it lives: the handler holds one, and a
  // streamed response's content provider a copy, so the count drops when its last byte is written.
  struct InFlight {
    std::atomic<int64_t>& count;
    explicit InFlight(std::atomic<int64_t>& c) : count(c) { ++count; }
    ~InFlight() { --count; }
  };
  using InFlightToken = std::shared_ptr<InFlight>;

  // Registers a route whose HttpError becomes its JSON error response. While
  // draining (after SIGTERM) every route answers 503.
  void handle(const char* method, const char* path, std::function<void(const httplib::Request&, httplib::Response&,
                                                                        const InFlightToken&)> h) {
    auto wrapped = [this, h](const httplib::Request& req, httplib::Response& res) {
      InFlightToken token = std::make_shared<InFlight>(in_flight_);
      try {
        if (draining_) throw HttpError{503, "", "the server is shutting down", "server_error"};
        h(req, res, token);
      } catch (const HttpError& e) {
        send_error(res, e);
      }
    };
    if (std::string(method) == "GET") http_.Get(path, wrapped);
    else http_.Post(path, wrapped);
  }

  json completion_object(const std::string& id, json choices) const {
    return {{"id", id},
            {"object", "text_completion"},
            {"created", (int64_t)std::time(nullptr)},
            {"model", name_},
            {"choices", std::move(choices)}};
  }

  static json completion_choice(size_t index, const std::string& text, const json& finish, json logprobs) {
    return {{"text", text}, {"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}};
  }

  // A token as logprobs name it: the text it adds, or for a special (which
  // adds none) its piece, as "<|im_end|>".
  std::string token_string(int64_t id) const {
    const Tokenizer& t = *generator_->model().tokenizer;
    std::string text = t.decode({id});
    return text.empty() ? t.pieces({id}).at(0) : text;
  }

  static json logprob_value(float x) { return std::isnan(x) ? json(nullptr) : json(x); }

  // Legacy completions' logprobs of `tokens`: their texts, log-probabilities,
  // likeliest alternatives and offsets in characters, counted on from
  // `offset` (the characters before them in the choice's text).
  json completion_logprobs(const std::vector<TokenLogprob>& tokens, int64_t& offset) const {
    json out = {{"tokens", json::array()},
                {"token_logprobs", json::array()},
                {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
    for (const TokenLogprob& t : tokens) {
      out["tokens"].push_back(t.text);
      out["token_logprobs"].push_back(logprob_value(t.logprob));
      json top = json::object();
      for (const auto& [id, lp] : t.top) top.emplace(token_string(id), lp);  // the likelier of two alike is kept
      out["top_logprobs"].push_back(std::isnan(t.logprob) ? json(nullptr) : top);
      out["text_offset"].push_back(offset);
      for (unsigned char c : t.text) offset += (c & 0xC0) != 0x80;
    }
    return out;
  }

  // Chat's logprobs of `tokens`: {"content": [{token, logprob, bytes, top_logprobs}]}.
  json chat_logprobs(const std::vector<TokenLogprob>& tokens) const {
    auto entry = [](const std::string& text, float lp) {
      return json{{"token", text}, {"logprob", lp}, {"bytes", std::vector<uint8_t>(text.begin(), text.end())}};
    };
    json content = json::array();
    for (const TokenLogprob& t : tokens) {
      json e = entry(t.text, t.logprob);
      e["top_logprobs"] = json::array();
      for (const auto& [id, lp] : t.top) e["top_logprobs"].push_back(entry(token_string(id), lp));
      content.push_back(std::move(e));
    }
    return {{"content", content}};
  }

  // The tokens of `results`, each prompt's counted once (results[i] is of
  // prompt i / per_prompt); a prompt's cached tokens are those none of its
  // choices prefilled (one prefills, the others copy it: BatchResult::cached_tokens).
  static json usage(const std::vector<BatchResult>& results, size_t per_prompt) {
    int64_t prompt = 0, cached = 0, completion = 0;
    for (size_t i = 0; i < results.size(); ++i) {
      if (i % per_prompt == 0) {
        prompt += results[i].prompt_tokens;
        int64_t least = results[i].cached_tokens;
        for (size_t j = i; j < std::min(results.size(), i + per_prompt); ++j)
          least = std::min(least, results[j].cached_tokens);
        cached += least;
      }
      completion += results[i].completion_tokens;
    }
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  // The decoder's token ids in `list` (JSON integers), each below its
  // vocabulary size; anything else is a 400 naming `param`, and the entry by
  // `where` and its index.
  std::vector<int64_t> token_ids(const json& list, const std::string& where, const std::string& param) {
    const int64_t V = generator_->model().model->config().vocab_size;
    std::vector<int64_t> ids;
    for (size_t k = 0; k < list.size(); ++k) {
      const std::string at = where + "[" + std::to_string(k) + "]";
      if (!list[k].is_number_integer()) bad(param, at + " must be a token id (an integer)");
      const bool huge = list[k].is_number_unsigned() && list[k].get<uint64_t>() > (uint64_t)INT64_MAX;
      const int64_t id = huge ? -1 : list[k].get<int64_t>();
      if (id < 0 || id >= V)
        bad(param,
            at + " is " + list[k].dump() + ", not a token id of this model (0 to " + std::to_string(V - 1) + ")");
      ids.push_back(id);
    }
    return ids;
  }

  // vLLM's tokenizer endpoints, which lm-evaluation-harness's remote
  // tokenizer reads. /tokenize: a text's token ids, as completions encode a
  // prompt (add_special_tokens: after <bos> where the model puts one) and,
  // asked for, each token's text.
  void tokenize(const httplib::Request& req, httplib::Response& res) {
    json body = parse_body(req, {"model", "prompt", "add_special_tokens", "return_token_strs"});
    need(generator_ != nullptr, "/tokenize", "serves decoder models");
    check_model_field(body);
    if (!body.contains("prompt") || !body["prompt"].is_string()) bad("prompt", "prompt must be a string");
    const Tokenizer& t = *generator_->model().tokenizer;
    const std::string text = body["prompt"].get<std::string>();
    const std::vector<int64_t> ids =
        bool_field(body, "add_special_tokens", true) ? t.encode_prompt(text) : t.encode(text);
    json out = {
        {"count", ids.size()}, {"max_model_len", generator_->context()}, {"tokens", ids}, {"token_strs", nullptr}};
    if (bool_field(body, "return_token_strs", false)) out["token_strs"] = t.pieces(ids);
    send_json(res, 200, out);
  }

  // /detokenize: the text of token ids, as a completion's text (specials left out).
  void detokenize(const httplib::Request& req, httplib::Response& res) {
    json body = parse_body(req, {"model", "tokens"});
    need(generator_ != nullptr, "/detokenize", "serves decoder models");
    check_model_field(body);
    if (!body.contains("tokens") || !body["tokens"].is_array()) bad("tokens", "tokens must be a list of token ids");
    send_json(res, 200,
              {{"prompt", generator_->model().tokenizer->decode(token_ids(body["tokens"], "tokens", "tokens"))}});
  }

  // /tokenizer_info: the special tokens by their text (tokenizer_config.json's
  // where the folder has them, else a special's piece where the text encodes
  // to that one id; null otherwise), the context, and the chat template.
  json tokenizer_info() const {
    const Tokenizer& t = *generator_->model().tokenizer;
    auto named = [&](const char* key, int64_t id) -> json {
      if (chat_.tokens.contains(key) && chat_.tokens[key].is_string()) return chat_.tokens[key];
      if (id < 0) return nullptr;
      const std::string piece = t.pieces({id}).at(0);
      return t.encode(piece) == std::vector<int64_t>{id} ? json(piece) : json(nullptr);
    };
    const Tokenizer::Specials& sp = t.specials();
    return {{"eos_token", named("eos_token", sp.eos.empty() ? -1 : sp.eos.front())},
            {"bos_token", named("bos_token", sp.prefix.empty() ? -1 : sp.prefix.back())},
            {"pad_token", named("pad_token", -1)},
            {"unk_token", named("unk_token", -1)},
            {"model_max_length", generator_->context()},
            {"vocab_size", generator_->model().model->config().vocab_size},
            {"chat_template", chat_.source.empty() ? json(nullptr) : json(chat_.source)}};
  }

  // One prompt of /v1/completions: its token ids, and the text `echo` shows.
  struct Prompt {
    std::vector<int64_t> ids;
    std::string text;
  };

  // OpenAI's prompt: a string, a list of strings, a list of token ids, or a
  // list of lists of token ids; as many prompts as the server runs and
  // queues at once. A text is encoded as `qkv generate` encodes it (after
  // <bos> where the model puts one); token ids are the prompt as given.
  std::vector<Prompt> prompts_field(const json& body) {
    if (!body.contains("prompt") || body["prompt"].is_null()) bad("prompt", "prompt is required");
    const json& v = body["prompt"];
    const Tokenizer& t = *generator_->model().tokenizer;
    auto text = [&](const json& s) { return Prompt{t.encode_prompt(s.get<std::string>()), s.get<std::string>()}; };
    auto ids = [&](const json& list, const std::string& where) {
      if (list.empty()) bad("prompt", where + " is an empty list of token ids");
      Prompt p{token_ids(list, where, "prompt"), ""};
      p.text = t.decode(p.ids);
      return p;
    };
    const std::string shape =
        "prompt must be a string, a list of strings, a list of token ids or a list of lists of them";
    if (v.is_string()) return {text(v)};
    if (!v.is_array()) bad("prompt", shape);
    if (v.empty()) bad("prompt", "prompt is an empty list");
    if (v[0].is_number()) return {ids(v, "prompt")};
    if ((int64_t)v.size() > o_.parallel + o_.queue)
      bad("prompt", "prompt is a list of " + std::to_string(v.size()) + " prompts; " + capacity());
    std::vector<Prompt> out;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string() && !v[i].is_array()) bad("prompt", shape);
      out.push_back(v[i].is_string() ? text(v[i]) : ids(v[i], "prompt[" + std::to_string(i) + "]"));
    }
    return out;
  }

  // How many generations one request may ask for: as many as run and wait at once.
  std::string capacity() const {
    return "this server takes at most " + std::to_string(o_.parallel + o_.queue) + " generations at once (--parallel " +
           std::to_string(o_.parallel) + " plus --queue " + std::to_string(o_.queue) + ")";
  }

  // n: choices per prompt, each a generation of its own (its prompt
  // prefilled again: no prefix is shared), all of a request's together at
  // most capacity().
  int64_t n_field(const json& body, size_t prompts) {
    const int64_t n = int_field(body, "n", 1, 1, o_.parallel + o_.queue);
    if ((int64_t)prompts * n > o_.parallel + o_.queue)
      bad("n", "n " + std::to_string(n) + " for each of " + std::to_string(prompts) + " prompts is " +
                   std::to_string((int64_t)prompts * n) + " generations; " + capacity());
    return n;
  }

  // The j-th of a prompt's n choices samples from the request's seed + j
  // where it gives one (from the next arrival seed otherwise, as any request).
  static void choice_seed(const json& body, int64_t j, BatchRequest& r) {
    if (body.contains("seed") && !body["seed"].is_null()) r.options.seed += (uint64_t)j;
  }

  void completions(const httplib::Request& req, httplib::Response& res, const InFlightToken& token) {
    json body = parse_body(req, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "typical_p",
                                 "seed", "stop", "stream", "stream_options", "n", "echo", "logprobs",
                                 "presence_penalty", "frequency_penalty", "logit_bias", "user", "ignore_eos",
                                 "cache_prompt"});
    need(generator_ != nullptr, "/v1/completions", "needs a decoder model");
    check_model_field(body);
    const bool stream = bool_field(body, "stream", false), echo = bool_field(body, "echo", false);
    // logprobs: k of the likeliest tokens at each position (0 to 20), beside the chosen one's.
    const int64_t logprobs = int_field(body, "logprobs", -1, 0, kMaxTopLogprobs);
    const std::vector<Prompt> prompts = prompts_field(body);
    const int64_t n = n_field(body, prompts.size());
    // Choice i * n + j is prompt i's j-th (OpenAI's order).
    std::vector<BatchRequest> requests;
    Choices choices;
    choices.per_prompt = (size_t)n;
    choices.usage_alone = include_usage_field(body, stream);
    for (size_t i = 0; i < prompts.size(); ++i) {
      for (int64_t j = 0; j < n; ++j) {
        try {
          requests.push_back(generation_request(body, prompts[i].ids, "prompt", "max_tokens"));
        } catch (HttpError& e) {
          if (prompts.size() > 1) e.message = "prompt[" + std::to_string(i) + "]: " + e.message;
          throw;
        }
        choice_seed(body, j, requests.back());
        requests.back().logprobs = logprobs;
        requests.back().prompt_logprobs = echo;
        if (echo) choices.echoes.push_back(prompts[i].text);
      }
    }
    const std::string id = "cmpl-" + std::to_string(ids_++);
    // A stream's characters so far in each choice, for text_offset.
    auto offsets = std::make_shared<std::vector<int64_t>>(requests.size(), 0);
    const std::vector<std::string> echoes = choices.echoes;
    respond(
        std::move(requests), stream, res, token,
        [this, id, logprobs, offsets](size_t i, const std::string& piece, const std::vector<TokenLogprob>& tokens,
                                      const json& finish) {
          const json lp = logprobs < 0 ? json(nullptr) : completion_logprobs(tokens, (*offsets)[i]);
          return completion_object(id, json::array({completion_choice(i, piece, finish, lp)}));
        },
        [this, id, logprobs, echoes](const std::vector<BatchResult>& results) {
          json choices = json::array();
          for (size_t i = 0; i < results.size(); ++i) {
            const BatchResult& result = results[i];
            json lp = nullptr;
            if (logprobs >= 0) {
              std::vector<TokenLogprob> tokens = echoes.empty() ? std::vector<TokenLogprob>{} : result.prompt_logprobs;
              tokens.insert(tokens.end(), result.logprobs.begin(), result.logprobs.end());
              int64_t offset = 0;
              lp = completion_logprobs(tokens, offset);
            }
            const std::string text = (echoes.empty() ? "" : echoes[i]) + result.text;
            choices.push_back(completion_choice(i, text, result.finish_reason, lp));
          }
          return completion_object(id, choices);
        },
        choices);
  }

  // OpenAI's chat completions: the messages in the folder's chat format
  // (qkv/chat.h), then generation as for completions, ending also at the
  // format's end of turn.
  void chat_completions(const httplib::Request& req, httplib::Response& res, const InFlightToken& token) {
    json body =
        parse_body(req, {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
                         "min_p", "typical_p", "seed", "stop", "stream", "n", "presence_penalty", "frequency_penalty",
                         "user", "ignore_eos", "tools", "tool_choice", "parallel_tool_calls", "logprobs",
                         "top_logprobs", "stream_options", "logit_bias", "response_format", "cache_prompt"});
    need(generator_ != nullptr, "/v1/chat/completions", "needs a decoder model");
    check_model_field(body);
    if (chat_.format == ChatFormat::None)
      bad("model", "model '" + name_ + "' cannot chat: " + chat_error_ + "; use /v1/completions");
    if (!body.contains("messages") || !body["messages"].is_array()) bad("messages", "messages must be a list");
    std::vector<ChatMessage> messages;
    for (size_t i = 0; i < body["messages"].size(); ++i) {
      const json& m = body["messages"][i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        bad("messages", where + " must be an object with a string \"role\"");
      // A string, or OpenAI's content parts: the text parts, joined in order.
      std::string content;
      if (m.contains("content") && m["content"].is_string()) {
        content = m["content"].get<std::string>();
      } else if (m.contains("content") && m["content"].is_array()) {
        for (size_t k = 0; k < m["content"].size(); ++k) {
          const json& part = m["content"][k];
          const std::string at = where + ".content[" + std::to_string(k) + "]";
          if (!part.is_object() || !part.contains("type") || part["type"] != "text")
            bad("messages", at + ": only text parts are read (a model of text sees no images or audio)");
          if (!part.contains("text") || !part["text"].is_string()) bad("messages", at + ".text must be a string");
          content += part["text"].get<std::string>();
        }
      } else if (!(m.contains("tool_calls") && m.contains("content") && m["content"].is_null())) {
        bad("messages", where + ".content must be a string or a list of text parts");
      }
      for (const auto& [key, value] : m.items())
        if (key != "role" && key != "content" && key != "name" && key != "tool_calls" && key != "tool_call_id")
          bad("messages", where + ": unknown field '" + key + "'");
      ChatMessage message{m["role"].get<std::string>(), content};
      if (m.contains("tool_calls")) message.tool_calls = template_tool_calls(m["tool_calls"], where + ".tool_calls");
      if (m.contains("tool_call_id")) {
        if (!m["tool_call_id"].is_string()) bad("messages", where + ".tool_call_id must be a string");
        message.tool_call_id = m["tool_call_id"].get<std::string>();
      }
      messages.push_back(std::move(message));
    }
    // response_format: plain text only (a JSON mode needs constrained sampling, which qkv does not have).
    if (body.contains("response_format") && !body["response_format"].is_null() &&
        !(body["response_format"].is_object() && body["response_format"].size() == 1 &&
          body["response_format"].value("type", json()) == "text"))
      bad("response_format", "response_format must be {\"type\": \"text\"}: qkv cannot constrain a reply to JSON");
    const json tools = tools_field(body);
    std::string prompt;
    try {
      prompt = format_chat(chat_, messages, tools);
    } catch (const Error& e) {
      bad(std::string(e.what()).rfind("tools:", 0) == 0 ? "tools" : "messages", e.what());
    }
    // Calls written in the template's <tool_call> form come back as tool_calls.
    const bool read_calls = !tools.empty() && chat_.tool_call_tags;
    const bool new_name = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null();
    if (new_name && body.contains("max_tokens") && !body["max_tokens"].is_null())
      bad("max_tokens", "give max_tokens or max_completion_tokens, not both");
    const int64_t n = n_field(body, 1);
    // logprobs: true gives each token's; top_logprobs (0 to 20) the likeliest tokens beside it.
    const bool with_logprobs = bool_field(body, "logprobs", false);
    const int64_t top = int_field(body, "top_logprobs", 0, 0, kMaxTopLogprobs);
    if (body.contains("top_logprobs") && !body["top_logprobs"].is_null() && !with_logprobs)
      bad("top_logprobs", "top_logprobs needs logprobs: true");
    const int64_t logprobs = with_logprobs ? top : -1;
    const std::vector<int64_t> ids = generator_->model().tokenizer->encode_prompt(prompt);
    std::vector<BatchRequest> requests;
    for (int64_t j = 0; j < n; ++j) {
      BatchRequest r = generation_request(body, ids, "messages", new_name ? "max_completion_tokens" : "max_tokens");
      choice_seed(body, j, r);
      r.stop_ids = end_of_turn_;
      r.logprobs = logprobs;
      if (!chat_.end_of_turn.empty()) r.stop.push_back(chat_.end_of_turn);  // for a vocabulary that spells it in pieces
      requests.push_back(std::move(r));
    }
    const std::string id = "chatcmpl-" + std::to_string(ids_++);
    auto shape = [this, id](bool chunk, json choices) {
      return json{{"id", id},
                  {"object", chunk ? "chat.completion.chunk" : "chat.completion"},
                  {"created", (int64_t)std::time(nullptr)},
                  {"model", name_},
                  {"choices", std::move(choices)}};
    };
    // OpenAI's form of the calls in choice c's `reply` (message.tool_calls, or a stream's delta.tool_calls).
    auto calls_json = [id](size_t c, const ChatReply& reply) {
      json calls = json::array();
      const std::string prefix = "call_" + id.substr(id.find('-') + 1) + "_" + (c ? std::to_string(c) + "_" : "");
      for (size_t i = 0; i < reply.tool_calls.size(); ++i)
        calls.push_back(
            {{"index", i},
             {"id", prefix + std::to_string(i)},
             {"type", "function"},
             {"function", {{"name", reply.tool_calls[i].name}, {"arguments", reply.tool_calls[i].arguments.dump()}}}});
      return calls;
    };
    // Streaming with calls to read: text is sent as far as no <tool_call>
    // may begin; the calls, and any text held back that was none, come last.
    // Each choice's text so far, and the bytes of it sent.
    auto streamed = std::make_shared<std::vector<std::pair<std::string, size_t>>>(n);
    respond(
        std::move(requests), bool_field(body, "stream", false), res, token,
        [this, shape, read_calls, streamed, calls_json, logprobs](
            size_t c, const std::string& piece, const std::vector<TokenLogprob>& tokens, const json& finish) {
          json delta = json::object();
          json reason = finish;
          auto& [text, sent] = (*streamed)[c];
          if (!read_calls) {
            if (finish.is_null()) delta = {{"role", "assistant"}, {"content", piece}};
          } else if (finish.is_null()) {
            text += piece;
            const size_t upto = std::max(sent, text_before_tool_calls(text));
            delta = {{"role", "assistant"}, {"content", text.substr(sent, upto - sent)}};
            sent = upto;
          } else {
            const ChatReply reply = parse_tool_calls(text);
            if (!reply.tool_calls.empty()) {
              delta = {{"tool_calls", calls_json(c, reply)}};
              reason = "tool_calls";
            } else if (sent < text.size()) {
              delta = {{"content", text.substr(sent)}};
            }
          }
          const json lp = logprobs < 0 ? json(nullptr) : chat_logprobs(tokens);
          return shape(true,
                       json::array({{{"index", c}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", reason}}}));
        },
        [this, shape, read_calls, calls_json, logprobs](const std::vector<BatchResult>& results) {
          json choices = json::array();
          for (size_t c = 0; c < results.size(); ++c) {
            const BatchResult& result = results[c];
            json message = {{"role", "assistant"}, {"content", result.text}};
            std::string reason = result.finish_reason;
            if (read_calls) {
              const ChatReply reply = parse_tool_calls(result.text);
              if (!reply.tool_calls.empty()) {
                message["content"] = reply.content.empty() ? json(nullptr) : json(reply.content);
                message["tool_calls"] = calls_json(c, reply);
                reason = "tool_calls";
              }
            }
            const json lp = logprobs < 0 ? json(nullptr) : chat_logprobs(result.logprobs);
            choices.push_back({{"index", c}, {"message", message}, {"logprobs", lp}, {"finish_reason", reason}});
          }
          return shape(false, choices);
        },
        Choices{(size_t)n, {}, include_usage_field(body, bool_field(body, "stream", false))});
  }

  // The request's tools, checked: OpenAI's [{"type": "function", "function":
  // {"name", "description", "parameters"}}], as given; none (an empty list)
  // when absent or when tool_choice is "none".
  json tools_field(const json& body) {
    const json choice =
        body.contains("tool_choice") && !body["tool_choice"].is_null() ? body["tool_choice"] : json("auto");
    if (choice != "auto" && choice != "none")
      bad("tool_choice", "tool_choice must be \"auto\" or \"none\" (qkv cannot make a model call a tool)");
    if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_boolean())
      bad("parallel_tool_calls", "parallel_tool_calls must be true or false");
    if (!body.contains("tools") || body["tools"].is_null()) return json::array();
    const json& tools = body["tools"];
    if (!tools.is_array()) bad("tools", "tools must be a list");
    for (size_t i = 0; i < tools.size(); ++i) {
      const json& t = tools[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") ||
          !t["function"].is_object())
        bad("tools", where + " must be {\"type\": \"function\", \"function\": {...}}");
      const json& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
        bad("tools", where + ".function.name must be a non-empty string");
      if (f.contains("parameters") && !f["parameters"].is_object())
        bad("tools", where + ".function.parameters must be an object (a JSON schema)");
      if (f.contains("description") && !f["description"].is_string())
        bad("tools", where + ".function.description must be a string");
    }
    return choice == "none" ? json::array() : tools;
  }

  // An assistant message's tool_calls as a template reads them (as
  // transformers wants them): each function's arguments an object, where
  // OpenAI sends the JSON text of one.
  json template_tool_calls(const json& calls, const std::string& where) {
    if (!calls.is_array()) bad("messages", where + " must be a list");
    json out = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      const json& c = calls[i];
      const std::string at = where + "[" + std::to_string(i) + "]";
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object() || !c["function"].contains("name") ||
          !c["function"]["name"].is_string())
        bad("messages", at + " must be {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
      json arguments = c["function"].value("arguments", json::object());
      if (arguments.is_string()) {
        if (json_text_nested_deeper_than(arguments.get<std::string>(), kMaxRequestJsonDepth))
          bad("messages", nested_too_deep(at + ".function.arguments"));
        arguments = json::parse(arguments.get<std::string>(), nullptr, false);
      }
      if (!arguments.is_object()) bad("messages", at + ".function.arguments must be the JSON text of an object");
      json call = {{"type", "function"}, {"function", {{"name", c["function"]["name"]}, {"arguments", arguments}}}};
      if (c.contains("id")) call["id"] = c["id"];
      out.push_back(std::move(call));
    }
    return out;
  }

  // OpenAI's logit_bias: {"token id": bias}, each id the decoder's, each
  // bias -100 to 100.
  std::vector<std::pair<int64_t, float>> logit_bias_field(const json& body) {
    if (!body.contains("logit_bias") || body["logit_bias"].is_null()) return {};
    const json& b = body["logit_bias"];
    if (!b.is_object()) bad("logit_bias", "logit_bias must be an object of token ids (as text) to biases");
    const int64_t V = generator_->model().model->config().vocab_size;
    std::vector<std::pair<int64_t, float>> out;
    for (const auto& [key, value] : b.items()) {
      const bool digits = !key.empty() && key.size() <= 18 && key.find_first_not_of("0123456789") == std::string::npos;
      const int64_t id = digits ? std::stoll(key) : -1;
      if (id < 0 || id >= V)
        bad("logit_bias",
            "logit_bias: '" + key + "' is not a token id of this model (0 to " + std::to_string(V - 1) + ")");
      if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100))
        bad("logit_bias", "logit_bias['" + key + "'] must be a number from -100 to 100");
      out.emplace_back(id, (float)value.get<double>());
    }
    return out;
  }

  // The generation options both completion endpoints share, checked against
  // the context for `prompt` (its tokens; `what` names the field it came
  // from, `max_name` the field of the token budget).
  BatchRequest generation_request(const json& body, std::vector<int64_t> prompt, const std::string& what,
                                  const char* max_name) {
    if (body.contains("user") && !body["user"].is_string()) bad("user", "user must be a string");
    const int64_t C = generator_->context();
    BatchRequest r;
    r.prompt = std::move(prompt);
    if (r.prompt.empty()) bad(what, "the prompt is empty and the tokenizer puts no token before it");
    const int64_t P = (int64_t)r.prompt.size();
    if (P >= C)
      bad(what, "the prompt is " + std::to_string(P) + " tokens; the context is " + std::to_string(C) +
                    ", which leaves room for none to generate");
    const bool given = body.contains(max_name) && !body[max_name].is_null();
    r.options.max_new_tokens = int_field(body, max_name, std::min<int64_t>(16, C - P), 0, 1 << 30);
    if (given && P + r.options.max_new_tokens > C)
      bad(max_name, std::string(max_name) + " " + std::to_string(r.options.max_new_tokens) + " and the prompt's " +
                        std::to_string(P) + " tokens exceed the context of " + std::to_string(C));
    r.options.temperature = (float)number_field(body, "temperature", 1.0, 0, 2);
    r.options.top_p = (float)number_field(body, "top_p", 1.0, 1e-6, 1);
    r.options.top_k = int_field(body, "top_k", 0, 0, 1 << 20);
    r.options.min_p = (float)number_field(body, "min_p", 0.0, 0, 1);
    r.options.typical_p = (float)number_field(body, "typical_p", 1.0, 1e-6, 1);
    r.options.seed = (uint64_t)int_field(body, "seed", (int64_t)(seeds_++ + 1), 0, INT64_MAX);
    r.options.ignore_eos = bool_field(body, "ignore_eos", false);
    r.options.presence_penalty = (float)number_field(body, "presence_penalty", 0, -2, 2);
    r.options.frequency_penalty = (float)number_field(body, "frequency_penalty", 0, -2, 2);
    r.options.logit_bias = logit_bias_field(body);
    r.reuse_prefix = bool_field(body, "cache_prompt", o_.cache_prompt);
    // OpenAI takes 4; lm-evaluation-harness sends a task's `until` strings and the eos text, often more.
    r.stop = strings_field(body, "stop", kMaxStops);
    for (const std::string& s : r.stop)
      if (s.empty()) bad("stop", "a stop sequence must not be empty");
    return r;
  }

  // A stream's event for choice i: a piece of its text and the piece's
  // tokens, with finish_reason null until its last.
  using ChunkFn = std::function<json(size_t i, const std::string& piece, const std::vector<TokenLogprob>& tokens,
                                     const json& finish)>;

  // Runs `requests`, the answer's choices in order, and answers: one JSON
  // object, whole(results) with their usage summed; or server-sent events,
  // chunk(i, piece, tokens, null) per piece of choice i as the choices make
  // them, chunk(i, "", tokens, finish_reason) at each one's end (the last of
  // these with the usage, or with usage_alone that event again with no
  // choices and the usage), then [DONE]. With echoes, a stream begins each
  // choice with its prompt: chunk(i, echoes[i], the prompt's tokens where the
  // request scores them, null).
  void respond(std::vector<BatchRequest> requests, bool stream, httplib::Response& res, const InFlightToken& token,
               ChunkFn chunk, std::function<json(const std::vector<BatchResult>&)> whole, const Choices& choices = {}) {
    const std::vector<std::string>& echoes = choices.echoes;
    const size_t per_prompt = choices.per_prompt;
    const bool usage_alone = choices.usage_alone;
    auto cancel = std::make_shared<std::atomic<bool>>(false);  // one for all: a choice that fails ends the others
    for (BatchRequest& r : requests) r.cancel = cancel;

    if (!stream) {
      std::vector<std::future<BatchResult>> futures;
      for (BatchRequest& r : requests) {
        auto done = std::make_shared<std::promise<BatchResult>>();
        futures.push_back(done->get_future());
        r.on_done = [this, done](const BatchResult& result) {
          metrics_.generation(result);
          done->set_value(result);
        };
      }
      submit_all(requests, *cancel);
      std::vector<BatchResult> results;
      for (std::future<BatchResult>& f : futures) results.push_back(f.get());
      for (const BatchResult& result : results)
        if (result.finish_reason == "error") throw HttpError{500, "", result.error, "server_error"};
      json out = whole(results);
      out["usage"] = usage(results, per_prompt);
      return send_json(res, 200, out);
    }

    auto st = std::make_shared<Stream>();
    const size_t n = requests.size();
    for (size_t i = 0; i < n; ++i) {
      BatchRequest& r = requests[i];
      if (!echoes.empty()) {
        StreamEvent echo{i, echoes[i], {}, true, std::nullopt};
        if (r.logprobs >= 0 && r.prompt_logprobs) {  // sent once the prompt is scored, with its tokens
          r.on_prompt = [st, echo](const std::vector<TokenLogprob>& tokens) {
            StreamEvent e = echo;
            e.tokens = tokens;
            st->push(std::move(e));
          };
        } else {
          st->push(std::move(echo));
        }
      }
      r.on_text = [st, i](const std::string& piece, const std::vector<TokenLogprob>& tokens) {
        st->push({i, piece, tokens, false, std::nullopt});
      };
      r.on_done = [this, st, i](const BatchResult& result) {
        metrics_.generation(result);
        st->push({i, "", {}, false, result});
      };
    }
    submit_all(requests, *cancel);
    res.set_header("Cache-Control", "no-cache");
    struct Progress {
      std::vector<size_t> sent;          // each choice's tokens sent so far
      std::vector<BatchResult> results;  // each choice's, once it ends
      size_t ended = 0;
    };
    auto progress = std::make_shared<Progress>();
    progress->sent.resize(n);
    progress->results.resize(n);
    res.set_chunked_content_provider(
        "text/event-stream",
        [st, cancel, chunk, token, n, per_prompt, usage_alone, progress](size_t, httplib::DataSink& sink) {
          std::deque<StreamEvent> events;
          {
            std::unique_lock<std::mutex> lock(st->mutex);
            st->ready.wait_for(lock, std::chrono::milliseconds(100), [&] { return !st->events.empty(); });
            events.swap(st->events);
          }
          auto event = [&](const json& data) {
            const std::string line = "data: " + dump(data) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          auto finish = [&] {
            const std::string end = "data: [DONE]\n\n";
            sink.write(end.data(), end.size());
            sink.done();
            return true;
          };
          if (!sink.is_writable()) {  // the client has gone: its slots are freed at the next step
            *cancel = true;
            return false;
          }
          for (const StreamEvent& e : events) {
            json data;
            if (!e.result) {
              if (!e.echo) progress->sent[e.choice] += e.tokens.size();
              data = chunk(e.choice, e.piece, e.tokens, nullptr);
            } else if (e.result->finish_reason == "error") {
              *cancel = true;
              event(
                  {{"error",
                    {{"message", e.result->error}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}});
              return finish();
            } else {
              // The tokens of text never sent (cut by a stop sequence) come with the end.
              const std::vector<TokenLogprob>& all = e.result->logprobs;
              const std::vector<TokenLogprob> rest(
                  all.begin() + (ptrdiff_t)std::min(progress->sent[e.choice], all.size()), all.end());
              data = chunk(e.choice, "", rest, e.result->finish_reason);
              progress->results[e.choice] = *e.result;
              if (++progress->ended == n && usage_alone) {  // OpenAI's form: an event of its own, no choices
                if (!event(data)) {
                  *cancel = true;
                  return false;
                }
                data["choices"] = json::array();
              }
              if (progress->ended == n) data["usage"] = usage(progress->results, per_prompt);
            }
            if (!event(data)) {
              *cancel = true;
              return false;
            }
          }
          return progress->ended == n ? finish() : true;
        },
        [cancel](bool success) {
          if (!success) *cancel = true;
        });
  }

  // Queues every request, or none: past one refused, those queued are cancelled.
  void submit_all(std::vector<BatchRequest>& requests, std::atomic<bool>& cancel) {
    try {
      for (BatchRequest& r : requests) submit(std::move(r));
    } catch (...) {
      cancel = true;
      throw;
    }
  }

  void submit(BatchRequest r) {
    bool queued = false;
    try {
      queued = generator_->submit(std::move(r));
    } catch (const Error& e) {
      bad("", e.what());
    }
    if (!queued)
      throw HttpError{429, "",
                      "all " + std::to_string(o_.parallel) + " slots are busy and " + std::to_string(o_.queue) +
                          " requests wait; try again later",
                      "rate_limit_error"};
  }

  void translate(const httplib::Request& req, httplib::Response& res) {
    json body = parse_body(req, {"model", "text", "beam", "max_len"});
    need(translation_.model != nullptr, "/v1/translate", "needs a translation model");
    check_model_field(body);
    if (!body.contains("text")) bad("text", "text is required");
    const std::vector<std::string> texts = strings_field(body, "text", 256);
    // Not given: the folder's generation_config.json (translation_decoding), the length still at most 1024.
    const TranslationDecoding d =
        translation_decoding(translation_, int_field(body, "beam", 0, 1, 64), int_field(body, "max_len", 0, 1, 1024));
    const int64_t beam = d.beam, max_len = std::min<int64_t>(d.max_len, 1024);
    std::vector<std::vector<int64_t>> sources;
    for (size_t i = 0; i < texts.size(); ++i) {
      try {
        sources.push_back(encode_source(translation_, texts[i], {}, "text[" + std::to_string(i) + "]"));
      } catch (const Error& e) {
        bad("text", e.what());
      }
    }
    // Concurrent requests with the same beam and max_len translate as one batch.
    const TranslationRuns::Run run = [this, max_len, beam](const std::vector<std::vector<int64_t>>& batch) {
      const ModelTurn turn(*this);
      return translate_ids(translation_, batch, max_len, beam);
    };
    const std::vector<std::string> out =
        translation_runs_.submit(std::to_string(beam) + "/" + std::to_string(max_len), std::move(sources), run);
    send_json(res, 200, {{"model", name_}, {"translations", out}});
  }

  // The translation of one text with its cross-attention (the data of the
  // attention explorer; `qkv translate --attention-map` draws the same).
  void attention(const httplib::Request& req, httplib::Response& res) {
    json body = parse_body(req, {"model", "text", "max_len"});
    need(translation_.model || generator_, "/v1/attention", "serves text models");
    check_model_field(body);
    if (!body.contains("text") || !body["text"].is_string()) bad("text", "text must be a string");
    if (generator_) return self_attention(body["text"].get<std::string>(), res);
    const int64_t max_len = int_field(body, "max_len", 128, 1, 1024);
    std::vector<int64_t> source;
    try {
      source = encode_source(translation_, body["text"].get<std::string>(), {}, "text");
    } catch (const Error& e) {
      bad("text", e.what());
    }
    AlignedTranslation a;
    {
      const ModelTurn turn(*this);
      a = translate_with_attention(*translation_.model, source, max_len, translation_.generation.rules);
    }
    const int64_t T = (int64_t)a.tokens.size(), S = a.source_length;
    int64_t weights = T * S * (1 + a.layers * a.nheads);        // the cross view's mean and heads
    for (const Tensor* w : {&a.encoder_self, &a.decoder_self})  // [L, H, n, n]: its heads and the mean
      if (w->defined()) weights += w->size(2) * w->size(3) * (1 + w->size(0) * w->size(1));
    check_attention_size(
        weights, "a " + std::to_string(S) + "-token source and its " + std::to_string(T) + "-token translation");
    const std::vector<std::string> source_pieces = translation_.tokenizer->pieces(source);
    const Tokenizer& target = translation_.tokenizer->target();
    const std::vector<std::string> target_pieces = target.pieces(a.tokens);
    const json rows = matrix(a.weights.data(), T, S);
    const json layers = by_layer(a.heads.data(), a.layers, a.nheads, T, S);  // where the model has heads
    // The views the explorer switches between: the cross-attention, then
    // (for a Transformer) the encoder's self-attention over the source and
    // the decoder's masked self-attention over what it read.
    json views = json::array({{{"name", "cross"},
                               {"attention", translation_.model->attention_name()},
                               {"row_tokens", target_pieces},
                               {"column_tokens", source_pieces},
                               {"weights", rows},
                               {"layers", layers}}});
    if (a.encoder_self.defined())
      views.push_back(self_view("encoder", "encoder self-attention", a.encoder_self, source_pieces));
    if (a.decoder_self.defined()) {
      std::vector<int64_t> read = {translation_.model->decoding_ids().start};
      read.insert(read.end(), a.tokens.begin(), a.tokens.end() - 1);
      views.push_back(self_view("decoder", "decoder masked self-attention", a.decoder_self, target.pieces(read)));
    }
    send_json(res, 200,
              {{"model", name_},
               {"translation", target.decode(a.tokens)},
               {"source_tokens", source_pieces},
               {"target_tokens", target_pieces},
               {"attention", translation_.model->attention_name()},
               {"weights", rows},
               {"layers", layers},
               {"views", views}});
  }

  // Rows of a row-major [n, m] matrix.
  static json matrix(const float* p, int64_t n, int64_t m) {
    json rows = json::array();
    for (int64_t i = 0; i < n; ++i) rows.push_back(std::vector<float>(p + i * m, p + (i + 1) * m));
    return rows;
  }

  // [layer][head][row][column] of row-major [L, H, n, m] weights.
  static json by_layer(const float* p, int64_t L, int64_t H, int64_t n, int64_t m) {
    json layers = json::array();
    for (int64_t l = 0; l < L; ++l) {
      json heads = json::array();
      for (int64_t h = 0; h < H; ++h) heads.push_back(matrix(p + (l * H + h) * n * m, n, m));
      layers.push_back(std::move(heads));
    }
    return layers;
  }

  // An explorer view of self-attention weights [L, H, n, n] over `tokens`:
  // every head, and the last layer's heads averaged as the big map.
  static json self_view(const std::string& name, const std::string& what, const Tensor& weights,
                        const std::vector<std::string>& tokens) {
    const Tensor w = weights.contiguous();
    const int64_t L = w.size(0), H = w.size(1), n = w.size(2);
    const float* p = w.data<float>();
    std::vector<float> mean((size_t)(n * n), 0.0f);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n * n; ++i) mean[(size_t)i] += p[((L - 1) * H + h) * n * n + i] / (float)H;
    return {{"name", name},
            {"attention",
             what + ": last layer, mean of " + std::to_string(H) + " heads (a row per query, a column per key)"},
            {"row_tokens", tokens},
            {"column_tokens", tokens},
            {"weights", matrix(mean.data(), n, n)},
            {"layers", by_layer(p, L, H, n, n)}};
  }

  // A decoder's masked self-attention over `text` (after <bos>), every layer
  // and head, computed on the generator's thread between decoding steps.
  void self_attention(const std::string& text, httplib::Response& res) {
    const LanguageModel& m = generator_->model();
    const std::vector<int64_t> ids = m.tokenizer->encode_prompt(text);
    if (ids.empty()) bad("text", "text is empty and the tokenizer puts no token before it");
    const int64_t T = (int64_t)ids.size(), C = m.model->config().context;
    if (T > C)
      bad("text", "text is " + std::to_string(T) + " tokens (with <bos>); the context is " + std::to_string(C));
    // Checked before the model runs: every layer's [H, T, T] weights, and their mean.
    check_attention_size(T * T * (1 + (int64_t)m.model->layers.size() * m.model->config().nhead),
                         "a " + std::to_string(T) + "-token text");
    auto done = std::make_shared<std::promise<Tensor>>();
    std::future<Tensor> future = done->get_future();
    generator_->post([&m, ids, T, done] {
      try {
        NoGradGuard no_grad;
        m.model->forward(Tensor::from_ints(ids, {1, T}), /*need_weights=*/true);
        std::vector<Tensor> layers;  // [1, H, T, T] each
        for (auto& layer : m.model->layers) layers.push_back(std::exchange(layer->last_self_weights, Tensor()));
        done->set_value(concat(layers, 0));
      } catch (...) {
        done->set_exception(std::current_exception());
      }
    });
    const std::vector<std::string> pieces = m.tokenizer->pieces(ids);
    json view = self_view("self", "masked self-attention", future.get(), pieces);
    send_json(res, 200,
              {{"model", name_},
               {"source_tokens", pieces},
               {"target_tokens", pieces},
               {"attention", view["attention"]},
               {"weights", view["weights"]},
               {"layers", view["layers"]},
               {"views", json::array({view})}});
  }

  // OpenAI's embeddings: one vector per input string, as `qkv embed` computes
  // them; encoding_format "float" (lists of numbers) or "base64" (the
  // float32 bytes, little-endian, which the openai client asks for).
  void embeddings(const httplib::Request& req, httplib::Response& res) {
    json body = parse_body(req, {"model", "input", "encoding_format", "dimensions", "user"});
    need(embedder_.model != nullptr, "/v1/embeddings", "needs an encoder model");
    check_model_field(body);
    if (!body.contains("input")) bad("input", "input is required: a string or a list of up to 2048 strings");
    if (body["input"].is_array() && !body["input"].empty() && !body["input"][0].is_string())
      bad("input", "input as token ids is not supported; send the text");
    const std::vector<std::string> inputs = strings_field(body, "input", 2048);
    if (inputs.empty()) bad("input", "input must not be an empty list");
    const std::string format = body.value("encoding_format", json("float")).is_string()
                                   ? body.value("encoding_format", std::string("float")) : "";
    if (format != "float" && format != "base64") bad("encoding_format", "encoding_format must be \"float\" or \"base64\"");
    const int64_t D = embedder_.model->config().d_model;
    if (body.contains("dimensions") && !body["dimensions"].is_null() && body["dimensions"] != json(D))
      bad("dimensions", "this model's embeddings have " + std::to_string(D) + " dimensions; others are not offered");
    for (size_t i = 0; i < inputs.size(); ++i)
      if (size_t at = invalid_utf8_offset(inputs[i]); at != std::string::npos)
        bad("input", "input[" + std::to_string(i) + "] is not UTF-8 at byte " + std::to_string(at + 1));
    // Concurrent requests embed as one batch; a merged batch that fails (a
    // text past the context) runs again request by request, so that the
    // error names the input of the request that sent it.
    const EmbeddingRuns::Run run = [this](const std::vector<std::string>& texts) {
      const ModelTurn turn(*this);
      std::vector<int64_t> tokens;
      std::vector<std::vector<float>> vectors;
      try {
        vectors = embed_texts(embedder_, texts, false, {},
                              [](size_t i) { return "input[" + std::to_string(i) + "]"; }, &tokens);
      } catch (const Error& e) {
        bad("input", e.what());
      }
      std::vector<Embedded> out;
      for (size_t i = 0; i < vectors.size(); ++i) out.push_back({std::move(vectors[i]), tokens[i]});
      return out;
    };
    const std::vector<Embedded> embedded = embedding_runs_.submit("", inputs, run);
    int64_t tokens = 0;
    json data = json::array();
    for (size_t i = 0; i < embedded.size(); ++i) {
      const std::vector<float>& vector = embedded[i].vector;
      tokens += embedded[i].tokens;
      json e = {{"object", "embedding"}, {"index", i}};
      if (format == "base64") {
        std::string bytes(vector.size() * sizeof(float), '\0');
        std::memcpy(bytes.data(), vector.data(), bytes.size());  // x86-64: little-endian already
        e["embedding"] = base64_encode(bytes);
      } else {
        e["embedding"] = vector;
      }
      data.push_back(std::move(e));
    }
    send_json(res, 200, {{"object", "list"}, {"data", data}, {"model", name_},
                         {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}});
  }

  // Images (base64 PNG or JPEG, as the files `qkv classify` reads) to their
  // most likely classes, with the attention rollout over each image's patches.
  void classify(const httplib::Request& req, httplib::Response& res) {
    json body = parse_body(req, {"model", "image", "top_k"});
    need(vit_ != nullptr, "/v1/classify", "needs a vit model");
    check_model_field(body);
    if (!body.contains("image")) bad("image", "image is required: a base64 PNG or JPEG, or a list of up to 64");
    const std::vector<std::string> encoded = strings_field(body, "image", 64);
    if (encoded.empty()) bad("image", "image must not be an empty list");
    const ViTConfig& c = vit_->config();
    const int64_t top_k = int_field(body, "top_k", std::min<int64_t>(5, c.num_classes), 1, c.num_classes);
    std::vector<std::vector<uint8_t>> images;  // C x size x size bytes each
    for (size_t i = 0; i < encoded.size(); ++i) {
      const std::string param = body["image"].is_string() ? "image" : "image[" + std::to_string(i) + "]";
      try {
        images.push_back(decode_image(from_base64(encoded[i], param), param, c.channels, c.image_resize()));
      } catch (const Error& e) {
        bad(param, e.what());
      }
    }
    // Concurrent requests classify as one batch.
    const ImageRuns::Run run = [this](const std::vector<std::vector<uint8_t>>& images) {
      const ViTConfig& c = vit_->config();
      ImageSet batch;
      batch.count = (int64_t)images.size(), batch.channels = c.channels;
      batch.height = batch.width = c.image_size;
      for (const std::vector<uint8_t>& im : images) batch.pixels.insert(batch.pixels.end(), im.begin(), im.end());
      std::vector<int64_t> all((size_t)batch.count);
      for (size_t i = 0; i < all.size(); ++i) all[i] = (int64_t)i;
      const ModelTurn turn(*this);
      NoGradGuard no_grad;
      const Tensor probs = softmax(vit_->forward(image_batch(batch, all), /*need_weights=*/true));
      const Tensor rollout = vit_->rollout();  // [B, grid, grid]
      const int64_t C = c.num_classes, cells = c.grid() * c.grid();
      std::vector<ImageResult> out;
      for (int64_t i = 0; i < batch.count; ++i)
        out.push_back({std::vector<float>(probs.data<float>() + i * C, probs.data<float>() + (i + 1) * C),
                       std::vector<float>(rollout.data<float>() + i * cells, rollout.data<float>() + (i + 1) * cells)});
      return out;
    };
    const std::vector<ImageResult> classified = image_runs_.submit("", std::move(images), run);
    const int64_t C = c.num_classes, g = c.grid();
    json results = json::array();
    for (size_t i = 0; i < classified.size(); ++i) {
      const float* p = classified[i].probabilities.data();
      const std::vector<int64_t> order = top_classes(p, C, top_k);
      json top = json::array();
      for (int64_t j = 0; j < top_k; ++j)
        top.push_back({{"label", c.class_names[(size_t)order[(size_t)j]]}, {"probability", p[order[(size_t)j]]}});
      json grid = json::array();
      for (int64_t y = 0; y < g; ++y) {
        const float* row = classified[i].rollout.data() + y * g;
        grid.push_back(std::vector<float>(row, row + g));
      }
      results.push_back({{"top", top}, {"rollout", grid}});
    }
    send_json(res, 200, {{"model", name_}, {"results", results}});
  }

  ModelFolder folder_;
  ServerOptions o_;
  std::string name_;
  int64_t created_ = 0;
  std::unique_ptr<BatchGenerator> generator_;
  ChatTemplate chat_;
  std::string chat_error_;             // why there is no chat format, for /v1/chat/completions' 400
  std::vector<int64_t> end_of_turn_;   // the chat format's end-of-turn token, when the vocabulary has it
  TranslationModel translation_;
  std::shared_ptr<VisionTransformer> vit_;
  EmbeddingModel embedder_;
  std::mutex model_mutex_;
  // One run of the translation, vit or embedding model on this thread: the
  // lock (one run at a time) and the --threads it runs with.
  struct ModelTurn {
    explicit ModelTurn(Server& s) : lock(s.model_mutex_) {
      if (s.o_.threads > 0) omp_set_num_threads(s.o_.threads);
    }
    std::lock_guard<std::mutex> lock;
  };
  // Concurrent translation and image requests, merged into shared batches.
  using TranslationRuns = MergedRuns<std::vector<int64_t>, std::string>;
  struct ImageResult {
    std::vector<float> probabilities, rollout;  // [classes], [grid * grid]
  };
  using ImageRuns = MergedRuns<std::vector<uint8_t>, ImageResult>;
  struct Embedded {
    std::vector<float> vector;
    int64_t tokens = 0;  // the model read, specials included
  };
  using EmbeddingRuns = MergedRuns<std::string, Embedded>;
  TranslationRuns translation_runs_{64, std::chrono::milliseconds(o_.batch_wait_ms)};
  ImageRuns image_runs_{64, std::chrono::milliseconds(o_.batch_wait_ms)};
  EmbeddingRuns embedding_runs_{256, std::chrono::milliseconds(o_.batch_wait_ms)};
  std::atomic<uint64_t> ids_{0}, seeds_{0};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> draining_{false};
  Metrics metrics_;
  httplib::Server http_;
  static thread_local Clock::time_point started_;  // the request this HTTP thread is answering
};

thread_local Clock::time_point Server::started_;

}  // namespace

int run(ModelFolder folder, const std::string& dir, const ServerOptions& options) {
  QKV_CHECK(options.parallel >= 1 && options.parallel <= 256, "serve: --parallel must be 1 to 256, got ",
            options.parallel);
  QKV_CHECK(options.queue >= 0 && options.queue <= 4096, "serve: --queue must be 0 to 4096, got ", options.queue);
  QKV_CHECK(options.batch_wait_ms >= 0 && options.batch_wait_ms <= 10000,
            "serve: --batch-wait-ms must be 0 to 10000, got ", options.batch_wait_ms);
  QKV_CHECK(options.port >= 0 && options.port <= 65535, "serve: --port must be 0 to 65535, got ", options.port);
  Server server(std::move(folder), dir, options);
  return server.run();
}

}  // namespace qkv::serve
