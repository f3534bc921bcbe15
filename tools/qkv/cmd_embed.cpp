// qkv embed: sentence embeddings, one JSON list of numbers per line of stdin.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "qkv/encoder.h"
#include "qkv/utf8.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {
namespace {

struct EmbedArgs {
  std::string model, dtype;
  bool normalize = false, truncate = false, replace_invalid = false;
  int threads = 0;
};

// A float as the shortest text that reads back as the same float.
void append_float(std::string& out, float v) {
  char text[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, (double)v);
    if (std::strtof(text, nullptr) == v) break;
  }
  out += text;
}

int run_embed(const EmbedArgs& a) {
  set_threads(a.threads);
  EmbeddingModel m = load_embedding_model(a.model, "embed", a.dtype);
  std::vector<std::string> lines;
  for (std::string line; std::getline(std::cin, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (size_t bad = invalid_utf8_offset(line); bad != std::string::npos) {
      QKV_CHECK(a.replace_invalid, "embed: stdin line ", lines.size() + 1, ": invalid UTF-8 at byte ", bad + 1,
                " (use --replace-invalid-utf8 to replace it with U+FFFD)");
      line = replace_invalid_utf8(line);
    }
    lines.push_back(std::move(line));
  }
  // All lines first: each is checked before any output, and batches group similar lengths.
  // Progress on stderr while they run, when it is a terminal.
  const auto start = std::chrono::steady_clock::now();
  auto shown = start;
  auto progress = [&](size_t done, size_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - shown < std::chrono::milliseconds(500)) return;
    shown = now;
    const double seconds = std::chrono::duration<double>(now - start).count();
    std::fprintf(stderr, "\rembed: %zu/%zu lines, %.0f lines/s   ", done, total, done / std::max(seconds, 1e-9));
    if (done == total) std::fprintf(stderr, "\r%60s\r", "");
  };
  const std::vector<std::vector<float>> vectors = embed_texts(
      m, lines, a.normalize, {.truncate = a.truncate},
      [](size_t i) { return "embed: stdin line " + std::to_string(i + 1); }, nullptr,
      isatty(STDERR_FILENO) ? std::function<void(size_t, size_t)>(progress) : nullptr);
  std::string out;
  for (const std::vector<float>& v : vectors) {
    out += '[';
    for (size_t d = 0; d < v.size(); ++d) {
      if (d) out += ", ";
      append_float(out, v[d]);
    }
    out += "]\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

Run add_embed(CLI::App& app) {
  auto args = std::make_shared<EmbedArgs>();
  CLI::App* sub = app.add_subcommand(
      "embed", "Sentence embeddings of stdin lines: one JSON list of numbers per line (an encoder model: BERT)");
  sub->add_option("--model", args->model, "Model folder (qkv, or Hugging Face BertModel / sentence-transformers)")
      ->required();
  sub->add_flag("--normalize", args->normalize, "Unit-length vectors (a sentence-transformers Normalize module does it anyway)");
  sub->add_flag("--truncate", args->truncate,
                "Cut a line longer than the model reads (its context, or max_seq_length) instead of failing");
  sub->add_flag("--replace-invalid-utf8", args->replace_invalid, "Replace invalid UTF-8 by U+FFFD instead of failing");
  sub->add_option("--threads", args->threads, "Threads (0: all cores)");
  add_dtype_option(sub, args->dtype);
  return [args] { return run_embed(*args); };
}

}  // namespace qkv::cli
