// qkv serve's request handling (tools/serve/server.cpp), the part of qkv a
// network reaches. The first byte picks an endpoint that reads a body; the
// rest is that body, POSTed over loopback to a server of one of the
// fixtures' tiny models, each running in this process on a thread of its
// own: a decoder with a chat template (qwen2), a translation model (marian),
// a sentence encoder (bert) and a ViT.
//
// The contract: every answer is a 200 (a JSON object, or a stream of JSON
// events ending in [DONE], none of them an error), or a 4xx whose body is a
// JSON error object. A 5xx (an exception the request checks let through, a
// failed generation), an error inside a stream, a dropped connection or a
// server that stops answering aborts.
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <nlohmann/json.hpp>

#include "qkv/checkpoint.h"
#include "tests/fuzz/fuzz.h"
#include "tools/serve/server.h"

namespace {

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "fuzz_serve: %s\n", why.c_str());
  std::abort();
}

// A server of tests/fixtures/hf/<name> on a thread of its own, and a client
// of it, once /health answers.
httplib::Client* serve(const std::string& name) {
  const std::string dir = std::string(QKV_FIXTURES_DIR) + "/hf/" + name;
  auto bound = std::make_shared<std::promise<int>>();
  qkv::serve::ServerOptions o;
  o.port = 0;  // any free one, which `listening` tells
  o.listening = [bound](int port) { bound->set_value(port); };
  o.quiet = true;
  o.parallel = 2;
  o.queue = 2;
  o.threads = 1;
  std::thread([dir, o] {
    try {
      qkv::serve::run(qkv::load_model_folder(dir), dir, o);
    } catch (const std::exception& e) {
      fail("serve " + dir + ": " + e.what());
    }
    fail("the server of " + dir + " stopped");
  }).detach();
  std::future<int> port = bound->get_future();
  if (port.wait_for(std::chrono::seconds(60)) != std::future_status::ready) fail("serve " + dir + ": not listening");
  auto* client = new httplib::Client("127.0.0.1", port.get());
  // Long enough for the slowest request within the server's bounds under the
  // sanitizers (a translation at a large beam and max_len: scripts/fuzz.sh),
  // short of libFuzzer's 300-s hang timeout, so a silent server is reported as one.
  client->set_read_timeout(std::chrono::seconds(240));
  for (int i = 0; i < 3000; ++i) {
    if (auto r = client->Get("/health"); r && r->status == 200) return client;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  fail("the server of " + dir + " did not answer /health in 30 s");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  struct Endpoint {
    httplib::Client* client;
    const char* path;
  };
  // Never destroyed: the servers answer until the process ends, and their
  // clients with them (LeakSanitizer sees them from this reference).
  static const std::vector<Endpoint>& endpoints = *[] {
    httplib::Client* lm = serve("qwen2");
    httplib::Client* translator = serve("marian");
    httplib::Client* encoder = serve("bert");
    httplib::Client* vit = serve("vit");
    return new std::vector<Endpoint>{{lm, "/v1/completions"},
                                     {lm, "/v1/chat/completions"},
                                     {translator, "/v1/translate"},
                                     {translator, "/v1/attention"},
                                     {encoder, "/v1/embeddings"},
                                     {vit, "/v1/classify"},
                                     {lm, "/tokenize"},
                                     {lm, "/detokenize"}};
  }();
  if (size == 0) return 0;
  const Endpoint& e = endpoints[data[0] % endpoints.size()];
  const httplib::Result res = e.client->Post(e.path, (const char*)data + 1, size - 1, "application/json");
  if (!res) fail(std::string("POST ") + e.path + ": no answer (" + httplib::to_string(res.error()) + ")");
  const std::string said = std::string("POST ") + e.path + ": " + std::to_string(res->status) + " " + res->body;
  if (res->status == 200) {
    // A stream: JSON events, none an error (a generation that failed after
    // the 200 went out), ending in [DONE]. Otherwise one JSON object.
    if (res->get_header_value("Content-Type").rfind("text/event-stream", 0) == 0) {
      const std::string_view events = res->body;
      const std::string_view last = "data: [DONE]\n\n";
      if (events.size() < last.size() || events.substr(events.size() - last.size()) != last) fail(said);
      for (size_t at = 0; at + last.size() < events.size();) {
        const size_t end = events.find("\n\n", at);
        if (events.substr(at, 6) != "data: " || end == std::string_view::npos) fail(said);
        const nlohmann::json event =
            nlohmann::json::parse(events.substr(at + 6, end - at - 6), nullptr, /*allow_exceptions=*/false);
        if (!event.is_object() || event.contains("error")) fail(said);
        at = end + 2;
      }
      return 0;
    }
    const nlohmann::json body = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object() || body.contains("error")) fail(said);
    return 0;
  }
  if (res->status < 400 || res->status >= 500) fail(said);
  const nlohmann::json body = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object() || !body.contains("error") || !body["error"].contains("message")) fail(said);
  return 0;
}
