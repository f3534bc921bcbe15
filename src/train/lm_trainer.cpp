// Training decoder-only language models, their folder, and sampling text.
#include "qkv/lm_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>

#include "qkv/io.h"
#include "qkv/optim.h"
#include "qkv/utf8.h"
#include "src/config/fields.h"
#include "src/train/train_state.h"

namespace qkv {

LmTrainOptions LmTrainOptions::from_json(const std::string& text, const std::string& source) {
  using O = LmTrainOptions;
  static const config::Fields<O> fields = config::Fields<O>("train.")
                                              .add("steps", &O::steps).at_least(1)
                                              .add("batch_size", &O::batch_size).at_least(1)
                                              .add("lr", &O::lr).positive()
                                              .add("warmup_steps", &O::warmup_steps).at_least(0)
                                              .add("weight_decay", &O::weight_decay).at_least(0)
                                              .add("clip_norm", &O::clip_norm).at_least(0)
                                              .add("seed", &O::seed)
                                              .add("eval_every", &O::eval_every).at_least(1);
  return config::read_train_section(fields, text, source);
}

std::vector<int64_t> pack_documents(const Tokenizer& tok, const std::string& text) {
  std::vector<int64_t> out;
  std::istringstream in(text);
  std::string line, doc;
  int64_t number = 0;
  auto flush = [&] {
    if (doc.empty()) return;
    out.push_back(Tokenizer::kBos);
    for (int64_t id : tok.encode(doc)) out.push_back(id);
    out.push_back(Tokenizer::kEos);
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

LanguageModel new_language_model(const std::string& config_text, const std::string& source,
                                 const std::string& train_text, uint64_t seed) {
  nlohmann::json j = parse_json(config_text, source);
  QKV_CHECK(j.is_object(), source, ": expected a JSON object");
  TokenizerConfig tc;
  tc.type = TokenizerKind::Bytes;
  if (j.contains("tokenizer")) tc = TokenizerConfig::from_json(j["tokenizer"].dump(), source);
  std::vector<std::string> lines;
  std::istringstream in(train_text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  QKV_CHECK(!lines.empty(), source, ": the training text is empty");
  LanguageModel m;
  m.tokenizer = train_tokenizer(tc, lines);
  j["vocab_size"] = m.tokenizer->size();
  Rng rng(seed);
  m.model = std::make_shared<DecoderLM>(DecoderConfig::from_json(j.dump(), source), rng);
  return m;
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

void save_language_model(const LanguageModel& m, const std::string& dir, const std::string& trainer_state_json) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  QKV_CHECK(std::filesystem::is_directory(dir), "cannot create the model folder ", dir, ec ? ": " + ec.message() : "");
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(m.model->config().to_json());
  config["tokenizer"] = nlohmann::ordered_json::parse(m.tokenizer->config_json());
  if (!m.tokenizer->file_name().empty())
    write_file_atomic(dir + "/" + m.tokenizer->file_name(), m.tokenizer->serialize());
  write_file_atomic(dir + "/config.json", config.dump(2) + "\n");
  save_safetensors(dir + "/model.safetensors", m.model->state_dict(), {{"format", "qkv"}, {"arch", "decoder"}});
  write_file_atomic(dir + "/trainer_state.json", trainer_state_json);
}

LanguageModel load_language_model(const std::string& dir) {
  QKV_CHECK(std::filesystem::is_directory(dir), "model folder ", dir, " does not exist");
  const std::string config_path = dir + "/config.json";
  nlohmann::json config = parse_json(read_file(config_path), config_path);
  QKV_CHECK(config.is_object() && config.contains("tokenizer"), config_path, ": no \"tokenizer\" field");
  LanguageModel m;
  m.tokenizer = load_tokenizer(config["tokenizer"].dump(), dir);
  DecoderConfig c = DecoderConfig::from_json(config.dump(), config_path);
  QKV_CHECK(c.vocab_size == m.tokenizer->size(), dir, ": tokenizer has ", m.tokenizer->size(),
            " tokens, config.json says vocab_size ", c.vocab_size);
  Rng rng(0);
  m.model = std::make_shared<DecoderLM>(c, rng);
  SafetensorsFile weights = load_safetensors(dir + "/model.safetensors");
  try {
    m.model->load_state_dict(weights.as_map());
  } catch (const Error& e) {
    fail(dir, "/model.safetensors: ", e.what());
  }
  m.model->eval();
  return m;
}

void train_language_model(LanguageModel& m, const std::vector<int64_t>& train, const std::vector<int64_t>& valid,
                          const LmTrainOptions& o, const std::string& out_dir, const LmCallbacks& cb) {
  DecoderLM& model = *m.model;
  const int64_t C = model.config().context, N = (int64_t)train.size();
  QKV_CHECK(N >= C + 1, "train: the training text has ", N, " tokens, fewer than one window of context + 1 = ",
            C + 1, " (a shorter context, or more text)");
  QKV_CHECK(valid.size() >= 2, "train: the validation text has fewer than 2 tokens");
  model.train();
  AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  WarmupCosine schedule{.peak_lr = o.lr, .min_lr = o.lr * 0.1f, .warmup_steps = o.warmup_steps, .total_steps = o.steps};
  const std::string state_path = out_dir + "/trainer_state.safetensors";
  int64_t step = 0, skipped = 0;
  double best = INFINITY;
  nlohmann::json history = nlohmann::json::array();
  if (o.resume) {
    SafetensorsFile f = load_safetensors(state_path);
    QKV_CHECK(f.metadata.count("format") && f.metadata.at("format") == "qkv-lm-trainer-state", state_path,
              ": not a qkv language-model trainer state");
    restore_training_state(f, state_path, model, opt);
    step = checkpoint_tensor(f, state_path, "step").to_ints()[0];
    skipped = checkpoint_tensor(f, state_path, "skipped").to_ints()[0];
    best = std::stod(f.metadata.count("best_loss") ? f.metadata.at("best_loss") : "inf");
    if (f.metadata.count("history")) history = nlohmann::json::parse(f.metadata.at("history"));
    QKV_CHECK(step < o.steps, "train --resume: the checkpoint is at step ", step, ", nothing to do for ", o.steps,
              " steps");
  }
  auto start = std::chrono::steady_clock::now();
  const int64_t first_step = step + 1;
  SkipCounter skips{.total = skipped, .max_in_a_row = o.max_skipped_in_a_row};
  int64_t tokens_seen = 0;
  for (step = first_step; step <= o.steps; ++step) {
    // The windows of step s depend only on (seed, s): a resumed run draws the same ones.
    Rng windows(o.seed * 0x9e3779b97f4a7c15ull + (uint64_t)step);
    std::vector<int64_t> in, target;
    for (int64_t b = 0; b < o.batch_size; ++b) {
      const int64_t s = (int64_t)windows.next_below((uint64_t)(N - C));
      in.insert(in.end(), train.begin() + s, train.begin() + s + C);
      target.insert(target.end(), train.begin() + s + 1, train.begin() + s + C + 1);
    }
    const float lr = schedule.lr_at(step);
    opt.set_lr(lr);
    opt.zero_grad();
    Tensor logits = model.forward(Tensor::from_ints(in, {o.batch_size, C})).reshape({o.batch_size * C, -1});
    Tensor loss = cross_entropy(logits, Tensor::from_ints(target, {o.batch_size * C}));
    const float value = loss.item();
    if (Tensor aux = model.aux_loss(); aux.defined()) loss = add(loss, aux);
    if (step_if_finite(loss, value, model, opt, o.clip_norm, skips, step, out_dir)) {
      tokens_seen += o.batch_size * C;
      if (cb.progress) {
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        double done = (double)(step - first_step + 1);
        cb.progress({step, o.steps, value, lr, tokens_seen / std::max(secs, 1e-9), secs / done * (o.steps - step),
                     skips.total});
      }
    }
    if (step % o.eval_every == 0 || step == o.steps) {
      LmEvalReport r{step, language_model_loss(model, valid), 0, false};
      r.perplexity = std::exp(r.valid_loss);
      r.best = r.valid_loss < best;
      history.push_back({{"step", step}, {"train_loss", value}, {"valid_loss", r.valid_loss},
                         {"perplexity", r.perplexity}});
      nlohmann::ordered_json state = {{"step", step},
                                      {"steps", o.steps},
                                      {"best_valid_loss", std::min(best, r.valid_loss)},
                                      {"skipped_steps", skips.total},
                                      {"history", history}};
      if (r.best) {
        best = r.valid_loss;
        save_language_model(m, out_dir, state.dump(2) + "\n");
      } else {
        write_file_atomic(out_dir + "/trainer_state.json", state.dump(2) + "\n");
      }
      save_trainer_state(state_path, model, opt, step, skips.total, {},
                         {{"format", "qkv-lm-trainer-state"}, {"best_loss", exact_text(best)},
                          {"history", history.dump()}});
      if (cb.evaluated) cb.evaluated(r);
    }
  }
}

namespace {

// The length of the longest prefix of s that ends on a whole UTF-8 character
// (a multi-byte character still arriving is held back).
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

int64_t sample(const float* logits, int64_t V, const GenerateOptions& o, Rng& rng) {
  std::vector<std::pair<float, int64_t>> cand;
  for (int64_t v = 0; v < V; ++v)
    if (v != Tokenizer::kPad && v != Tokenizer::kBos && v != Tokenizer::kUnk) cand.push_back({logits[v], v});
  std::sort(cand.begin(), cand.end(), [](auto& a, auto& b) { return a.first > b.first; });
  if (o.temperature <= 0) return cand[0].second;
  if (o.top_k > 0 && (size_t)o.top_k < cand.size()) cand.resize((size_t)o.top_k);
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
    total = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  double u = rng.next_uniform() * total;
  for (size_t i = 0; i < keep; ++i) {
    if ((u -= p[i]) <= 0) return cand[i].second;
  }
  return cand[keep - 1].second;
}

}  // namespace

std::vector<int64_t> generate(LanguageModel& m, const std::string& prompt, const GenerateOptions& o,
                              const std::function<void(const std::string&)>& emit) {
  QKV_CHECK(o.max_new_tokens >= 0 && o.top_k >= 0 && o.top_p > 0 && o.top_p <= 1 && o.temperature >= 0,
            "generate: max-new-tokens, top-k and temperature must not be negative, top-p in (0, 1]");
  NoGradGuard no_grad;
  DecoderLM& model = *m.model;
  model.eval();
  const int64_t C = model.config().context;
  std::vector<int64_t> ids = {Tokenizer::kBos};
  for (int64_t id : m.tokenizer->encode(prompt)) ids.push_back(id);
  if ((int64_t)ids.size() >= C) {
    QKV_CHECK(o.truncate_prompt, "generate: the prompt is ", ids.size() - 1, " tokens, the model's context is ", C,
              " (pass --truncate-prompt to keep its last ", C - 2, " tokens)");
    ids.erase(ids.begin() + 1, ids.end() - (C - 2));
  }
  std::vector<KVCache> caches = model.make_caches(1, C);
  Tensor logits = model.forward_cached(Tensor::from_ints(ids, {1, (int64_t)ids.size()}), caches);
  const int64_t V = logits.size(-1);
  Rng rng(o.seed);
  std::vector<int64_t> out;
  size_t emitted = 0;
  for (int64_t i = 0; i < o.max_new_tokens && caches[0].length < C; ++i) {
    const float* last = logits.data<float>() + (logits.size(1) - 1) * V;
    const int64_t next = sample(last, V, o, rng);
    if (next == Tokenizer::kEos) break;
    out.push_back(next);
    if (emit) {
      const std::string text = m.tokenizer->decode(out);
      const size_t cut = complete_utf8_prefix(text);
      if (cut > emitted) emit(replace_invalid_utf8(text.substr(emitted, cut - emitted))), emitted = cut;
    }
    if (caches[0].length < C) logits = model.forward_cached(Tensor::from_ints({next}, {1, 1}), caches);
  }
  if (emit) {  // what is left, less a character cut off by max_new_tokens (it is not text yet)
    const std::string text = m.tokenizer->decode(out);
    const size_t cut = complete_utf8_prefix(text);
    if (cut > emitted) emit(replace_invalid_utf8(text.substr(emitted, cut - emitted)));
  }
  return out;
}

}  // namespace qkv
