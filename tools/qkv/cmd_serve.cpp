// qkv serve: the HTTP server (tools/serve/server.h) from the command line.
#include "tools/qkv/commands.h"
#include "tools/serve/server.h"

namespace qkv::cli {

Run add_serve(CLI::App& app) {
  struct Args {
    std::string model, dtype;
    serve::ServerOptions options;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "serve", "Serve a model over HTTP with OpenAI field names: /v1/completions (streamed, continuously batched), "
               "/v1/translate, /v1/attention, /v1/classify, /v1/models, /health, /metrics, and an attention explorer "
               "page at / (docs/serving.md)");
  sub->add_option("--model", a->model, "Model folder (decoder, translation or vit)")->required();
  sub->add_option("--name", a->options.name, "The model's id in requests and /v1/models (default: the folder's name)");
  sub->add_option("--host", a->options.host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", a->options.port, "Port (0: any free one, printed at start)")
      ->capture_default_str()->check(CLI::Range(0, 65535));
  sub->add_option("--parallel", a->options.parallel, "Sequences decoded at once (decoding slots)")
      ->capture_default_str()->check(CLI::Range(1, 256));
  sub->add_option("--queue", a->options.queue, "Requests that may wait for a slot; past that, 429")
      ->capture_default_str()->check(CLI::Range(0, 4096));
  sub->add_option("--ctx", a->options.context, "Positions per slot (0: the model's context)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--batch-wait-ms", a->options.batch_wait_ms,
                  "Translate, classify and embeddings: how long a request that finds the model idle waits for others "
                  "to share its batch (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 10000));
  sub->add_option("--max-body", a->options.max_body, "Largest request body in bytes; larger is a 413")
      ->capture_default_str()->check(CLI::Range(1024, 1 << 30));
  sub->add_flag("--quiet", a->options.quiet, "No line per request on stderr");
  sub->add_flag("--cache-prompt", a->options.cache_prompt,
                "Completions and chat: a prompt that begins as an earlier request's prompt and completion (a chat's "
                "next turn) takes its slot and prefills only the rest (a request's cache_prompt field overrides it)");
  add_dtype_option(sub, a->dtype);
  sub->add_option("--threads", a->options.threads, "Threads for the model (0: all cores)");
  return [a] {
    set_threads(a->options.threads);
    ModelFolder folder = load_model_folder(a->model, {a->dtype});
    return serve::run(std::move(folder), a->model, a->options);
  };
}

}  // namespace qkv::cli
