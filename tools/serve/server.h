// qkv serve: an HTTP server over src/infer with OpenAI field names.
//
//   GET  /                   the attention explorer page (tools/serve/explorer.html, compiled in)
//   GET  /health             {"status": "ok", ...}
//   GET  /v1/models          the one model served, OpenAI's list format
//   GET  /metrics            Prometheus text: requests, tokens, queue depth, latency
//   POST /v1/completions     decoder models; a prompt, or a list (texts or token ids),
//                            a choice each; "stream": true as server-sent events;
//                            concurrent requests share decoding steps (qkv/batching.h)
//   POST /v1/translate       translation models: {"text": [...], "beam": k}
//   POST /v1/attention       translation models: one text, its translation and cross-attention weights
//   POST /v1/classify        vit models: base64 PNG/JPEG images -> top classes and attention rollout
//   POST /tokenize, /detokenize, GET /tokenizer_info   decoder models: vLLM's tokenizer endpoints
//   POST /v1/chat/completions, /v1/embeddings: a 400 saying what the model lacks
//
// Every error is a JSON body {"error": {"message", "type", "param", "code"}}
// with a 4xx or 5xx status, and the server keeps serving. SIGTERM or SIGINT
// stops taking connections, lets the requests in flight finish, and returns.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "qkv/checkpoint.h"

namespace qkv::serve {

struct ServerOptions {
  std::string name;  // the model id clients name ("model"); the folder's name when empty
  std::string host = "127.0.0.1";
  int port = 8080;        // 0: any free port (the line "listening on ..." says which)
  int64_t parallel = 4;   // sequences decoded at once
  int64_t queue = 16;     // requests that may wait for a slot; past that, 429
  int64_t context = 0;    // positions per slot; 0: the model's context
  int64_t batch_wait_ms = 0;  // translate/classify/embeddings: how long a request on an idle model waits for others
  size_t max_body = 1 << 20;  // bytes; a larger body is a 413
  int threads = 0;        // OpenMP threads for the model; 0: all cores
  bool quiet = false;     // no line per request on stderr
  // completions and chat: a prompt may start from the positions a slot still
  // caches from an earlier request (BatchRequest::reuse_prefix); a request's
  // cache_prompt field overrides it.
  bool cache_prompt = false;
  std::function<void(int port)> listening;  // called once bound, with the port (the fuzz harness's port 0)
};

// Serves `folder` (loaded from `dir`) until SIGTERM or SIGINT; returns the exit
// status. A model it cannot serve, or an address it cannot bind, is a qkv::Error.
int run(ModelFolder folder, const std::string& dir, const ServerOptions& options);

}  // namespace qkv::serve
