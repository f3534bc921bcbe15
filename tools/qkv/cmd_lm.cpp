// Decoder-only language models from the command line: qkv train and qkv eval
// for the decoder family, and qkv generate.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "qkv/chat.h"
#include "qkv/io.h"
#include "qkv/lm_trainer.h"
#include "qkv/utf8.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {

namespace {

// Text in and out needs the folder's tokenizer; a Hugging Face folder's is not read yet.
void require_tokenizer(const LanguageModel& m, const std::string& dir, const char* command) {
  QKV_CHECK(m.tokenizer != nullptr, command, ": ", dir, " is a Hugging Face folder without a tokenizer.json (qkv ",
            "does not read other tokenizer files yet), so its model runs only from the library, on token ids");
}

}  // namespace

LmCallbacks lm_train_printers() {
  LmCallbacks cb;
  cb.progress = [](const LmProgress& p) {
    char stats[128];
    std::snprintf(stats, sizeof stats, "loss %.3f  %.0f tok/s  lr %.2e", p.loss, p.tokens_per_second, p.lr);
    print_progress(p.step, p.total_steps, "step " + std::to_string(p.step) + "/" + std::to_string(p.total_steps),
                   stats, p.eta_seconds, p.skipped_steps);
  };
  cb.evaluated = [](const LmEvalReport& r) {
    std::printf("%sstep %lld: valid loss %.4f  perplexity %.3f%s\n", isatty(STDOUT_FILENO) ? "\n" : "",
                (long long)r.step, r.valid_loss, r.perplexity, r.best ? "  (best, saved)" : "");
    std::fflush(stdout);
  };
  return cb;
}

int run_lm_eval(const std::string& model_dir, const std::string& test, bool json, const std::string& dtype) {
  LanguageModel m = load_language_model(model_dir, "eval", dtype);
  require_tokenizer(m, model_dir, "eval");
  std::vector<int64_t> tokens;
  try {
    tokens = pack_documents(*m.tokenizer, read_file(test));
  } catch (const Error& e) {
    fail(test, ":", e.what());
  }
  QKV_CHECK(tokens.size() >= 2, test, ": no text to score");
  const double loss = language_model_loss(*m.model, tokens);
  nlohmann::ordered_json r = {{"loss", loss}, {"perplexity", std::exp(loss)}, {"tokens", tokens.size()}};
  if (json) {
    std::printf("%s\n", r.dump().c_str());
  } else {
    std::printf("%s on %s (%zu tokens)\n  loss       %.4f (per token, natural log)\n  perplexity %.3f\n",
                model_dir.c_str(), test.c_str(), tokens.size(), loss, std::exp(loss));
  }
  return 0;
}

namespace {

struct GenerateArgs {
  std::string model, prompt;
  GenerateOptions options;
  std::string dtype;
  int threads = 0;
  const CLI::App* command = nullptr;  // which flags were given
};

// The sampling flags not given take the folder's generation_config.json,
// where it has one, as transformers' generate() reads it: do_sample false is
// greedy; else its temperature, top_k (50 when absent), top_p, min_p,
// typical_p, epsilon_cutoff and eta_cutoff. Its
// max_new_tokens, where given, replaces the default of --max-new-tokens.
void take_folder_sampling(const CLI::App& command, const GenerationDefaults& d, GenerateOptions& o) {
  if (!d.from_file) return;
  if (command.count("--temperature") == 0) o.temperature = d.do_sample ? d.temperature : 0.0f;
  if (command.count("--top-k") == 0) o.top_k = d.top_k;
  if (command.count("--top-p") == 0) o.top_p = d.top_p;
  if (command.count("--min-p") == 0) o.min_p = d.min_p;
  if (command.count("--typical-p") == 0) o.typical_p = d.typical_p;
  o.epsilon_cutoff = d.epsilon_cutoff, o.eta_cutoff = d.eta_cutoff;  // (no flags: the file's only)
  if (command.count("--max-new-tokens") == 0 && d.decoder_max_new_tokens > 0)
    o.max_new_tokens = d.decoder_max_new_tokens;
}

// The language model of a folder, with its tokenizer, for `command`, on `threads` threads.
LanguageModel load_with_tokenizer(const std::string& model, const std::string& dtype, int threads,
                                  const char* command) {
  set_threads(threads);
  LanguageModel m = load_language_model(model, command, dtype);
  require_tokenizer(m, model, command);
  return m;
}

// A piece of generated text, to stdout as it comes.
void print_piece(const std::string& piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

int run_generate(GenerateArgs a) {
  LanguageModel m = load_with_tokenizer(a.model, a.dtype, a.threads, "generate");
  take_folder_sampling(*a.command, m.generation, a.options);
  QKV_CHECK(invalid_utf8_offset(a.prompt) == std::string::npos, "generate: the prompt is not valid UTF-8");
  std::fputs(a.prompt.c_str(), stdout);
  std::fflush(stdout);
  std::vector<int64_t> out = generate(m, a.prompt, a.options, print_piece);
  std::putchar('\n');
  const int64_t context = m.model->config().context;
  const int64_t prompt_tokens = std::min<int64_t>((int64_t)m.tokenizer->encode_prompt(a.prompt).size(), context - 1);
  if ((int64_t)out.size() < a.options.max_new_tokens && prompt_tokens + (int64_t)out.size() >= context)
    std::fprintf(stderr, "generate: stopped at the model's context of %lld tokens\n", (long long)context);
  return 0;
}

// --temperature, --top-k, --top-p, --min-p, --typical-p, the penalties and --seed, as generate and chat take them
// (those not given: the folder's generation_config.json, take_folder_sampling).
void add_sampling_options(CLI::App* sub, GenerateOptions& o) {
  sub->add_option("--temperature", o.temperature,
                  "Sampling temperature (0: greedy; not given: the folder's generation_config.json, if any)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--top-k", o.top_k, "Sample from the k most likely tokens (0: all)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--top-p", o.top_p, "Sample from the smallest set with this much probability")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  sub->add_option("--min-p", o.min_p,
                  "Sample only from tokens at least this fraction as likely as the most likely one (0: off)")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  sub->add_option("--typical-p", o.typical_p,
                  "Locally typical sampling: the tokens whose surprise is nearest the entropy, this much "
                  "probability of them (1: off)")
      ->capture_default_str()->check(CLI::Range(1e-6, 1.0));
  sub->add_option("--presence-penalty", o.presence_penalty,
                  "Subtracted once from the logit of every token already generated (OpenAI's; -2 to 2, 0: off)")
      ->capture_default_str()->check(CLI::Range(-2.0, 2.0));
  sub->add_option("--frequency-penalty", o.frequency_penalty,
                  "Subtracted from a token's logit once per time it was generated (OpenAI's; -2 to 2, 0: off)")
      ->capture_default_str()->check(CLI::Range(-2.0, 2.0));
  sub->add_option("--seed", o.seed, "Seed of the sampling")->capture_default_str();
}

struct ChatArgs {
  std::string model, system;
  GenerateOptions options;
  std::string dtype;
  int threads = 0;
  const CLI::App* command = nullptr;
};

// One line of stdin, one user message; the answer streams to stdout, ending
// at the format's end of turn. When the conversation outgrows the context,
// its oldest turns (after a system message) are dropped.
int run_chat(ChatArgs a) {
  LanguageModel m = load_with_tokenizer(a.model, a.dtype, a.threads, "chat");
  take_folder_sampling(*a.command, m.generation, a.options);
  const ChatTemplate t = chat_template_of_folder(a.model);
  QKV_CHECK(t.format != ChatFormat::None, "chat: ", a.model, " has no chat template (chat_template.jinja, or ",
            "chat_template in tokenizer_config.json); qkv generate continues plain text");
  QKV_CHECK(invalid_utf8_offset(a.system) == std::string::npos, "chat: --system is not valid UTF-8");
  std::vector<ChatMessage> messages;
  if (!a.system.empty()) messages.push_back({"system", a.system});
  const size_t kept = messages.size();  // the system message stays
  const int64_t context = m.model->config().context;
  const bool interactive = isatty(fileno(stdin));
  std::string line;
  for (int64_t turn = 1;; ++turn) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    QKV_CHECK(invalid_utf8_offset(line) == std::string::npos, "chat: line ", turn, " of stdin is not valid UTF-8");
    if (line.empty()) continue;
    messages.push_back({"user", line});
    std::string prompt = format_chat(t, messages);
    // Room for at least one new token: drop the oldest exchanges until it fits.
    while ((int64_t)m.tokenizer->encode_prompt(prompt).size() >= context) {
      QKV_CHECK(messages.size() > kept + 1, "chat: line ", turn, " does not fit the model's context of ", context,
                " tokens with the chat template's text");
      messages.erase(messages.begin() + (ptrdiff_t)kept,
                     messages.begin() + (ptrdiff_t)std::min(kept + 2, messages.size() - 1));
      std::fprintf(stderr, "chat: the oldest turn was dropped to fit the context of %lld tokens\n", (long long)context);
      prompt = format_chat(t, messages);
    }
    const std::string text = generate_turn(m, prompt, t.end_of_turn, a.options, print_piece);
    std::putchar('\n');
    std::fflush(stdout);
    messages.push_back({"assistant", text});
  }
  return 0;
}

}  // namespace

Run add_chat(CLI::App& app) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* sub = app.add_subcommand(
      "chat", "Chat with a decoder model whose folder has a chat template: each line of stdin is a message, each "
              "answer streams to stdout (docs/pretrained.md)");
  sub->add_option("--model", args->model, "Language-model folder with a chat template")->required();
  sub->add_option("--system", args->system, "A system message first");
  sub->add_option("--max-new-tokens", args->options.max_new_tokens, "The longest answer in tokens")
      ->capture_default_str()->check(CLI::PositiveNumber);
  add_sampling_options(sub, args->options);
  add_dtype_option(sub, args->dtype);
  sub->add_option("--threads", args->threads, "Threads (0: all cores)");
  args->command = sub;
  return [args] { return run_chat(*args); };
}

Run add_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand(
      "generate", "Continue a prompt with a decoder model: prefill, then one token at a time with the KV cache, "
                  "streamed to stdout");
  sub->add_option("--model", args->model, "Language-model folder (arch decoder)")->required();
  sub->add_option("--prompt", args->prompt, "Text to continue")->capture_default_str();
  sub->add_option("--max-new-tokens", args->options.max_new_tokens, "Stop after this many tokens")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  add_sampling_options(sub, args->options);
  sub->add_flag("--ignore-eos", args->options.ignore_eos,
                "Never sample <eos>: exactly --max-new-tokens tokens, or up to the context (for timing)");
  sub->add_flag("--truncate-prompt", args->options.truncate_prompt,
                "Keep the prompt's last tokens when it does not fit the context (default: an error)");
  add_dtype_option(sub, args->dtype);
  sub->add_option("--threads", args->threads, "Threads (0: all cores)");
  args->command = sub;
  return [args] { return run_generate(*args); };
}

}  // namespace qkv::cli
