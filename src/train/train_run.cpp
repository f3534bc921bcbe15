// Training from a config file, for every domain (qkv/train_run.h).
#include "qkv/train_run.h"

#include <omp.h>

#include <cmath>

#include "qkv/chat.h"
#include "qkv/io.h"
#include "qkv/registry.h"
#include "src/core/json.h"
#include "src/train/loop.h"

namespace qkv {
namespace {

// `name` as the caller spells an option: "--batch-tokens" or "batch_tokens".
std::string option(const TrainRun& r, std::string name) {
  if (!r.flag_names) return name;
  for (char& c : name)
    if (c == '_') c = '-';
  return "--" + name;
}

// What to pass for a validation set, in the caller's words.
std::string pass_valid(const TrainRun& r) { return r.flag_names ? "--valid" : "valid="; }

// The validation set of a run given none: the last 5% of `train` (at least
// one pair), removed from it. Too few pairs to spare any is an error naming
// the file and saying how to pass a validation set.
std::vector<SentencePair> hold_out_pairs(std::vector<SentencePair>& train, const TrainRun& r) {
  const size_t n = std::max<size_t>(1, train.size() / 20);
  QKV_CHECK(train.size() > n, r.train, ": too few pairs to hold some out for validation; pass ", pass_valid(r));
  std::vector<SentencePair> valid(train.end() - (ptrdiff_t)n, train.end());
  train.resize(train.size() - n);
  return valid;
}

// The same for a decoder's tokens: the last 5%, at least two.
std::vector<int64_t> hold_out_tokens(std::vector<int64_t>& train, const TrainRun& r) {
  const size_t n = std::max<size_t>(2, train.size() / 20);
  QKV_CHECK(train.size() > 2 * n, r.train, ": too little text to hold some out for validation; pass ", pass_valid(r));
  std::vector<int64_t> valid(train.end() - (ptrdiff_t)n, train.end());
  train.resize(train.size() - n);
  return valid;
}

template <class Options>
void apply_overrides(const TrainRun& r, Options& o) {
  if constexpr (requires { o.steps; }) {
    if (r.steps) o.steps = *r.steps;
  }
  if constexpr (requires { o.epochs; }) {
    if (r.epochs) o.epochs = *r.epochs;
  }
  if (r.lr) o.lr = (float)*r.lr;
  if (r.seed) o.seed = (uint64_t)*r.seed;
  if (r.precision) o.precision = *r.precision;
  o.resume = r.resume;
}

// What the starting line adds for the run's precision.
const char* precision_note(Precision p) { return p == Precision::Bf16 ? "; bf16 mixed precision" : ""; }

std::string starting_line(const TrainRun& r, const std::string& summary, const std::string& data) {
  const int processes = r.group ? r.group->size() : 1, threads = omp_get_max_threads();
  return summary + "\n  " + data + ", " +
         (processes > 1 ? std::to_string(processes) + " processes x " : std::string()) + std::to_string(threads) +
         (threads == 1 ? " thread" : " threads");
}

// Rank 0 alone says what is starting.
void say_starting(const TrainRun& r, const TrainHooks& hooks, const std::string& summary, const std::string& data) {
  if (hooks.starting && (!r.group || r.group->rank() == 0)) hooks.starting(starting_line(r, summary, data));
}

// What every process of a group must have read alike: the config, the
// overrides and the data (hashed; the processes compare hashes).
uint64_t run_hash(const TrainRun& r) {
  uint64_t h = fnv1a(r.config_text.data(), r.config_text.size());
  for (const auto& v : {r.steps, r.epochs, r.batch_tokens, r.seed}) {
    const int64_t x = v.value_or(-1);
    h = fnv1a(&x, sizeof x, h);
  }
  const double lr = r.lr.value_or(-1);
  const int precision = r.precision ? (int)*r.precision : -1;
  h = fnv1a(&precision, sizeof precision, h);
  h = fnv1a(r.init.data(), r.init.size(), h);
  return fnv1a(&lr, sizeof lr, fnv1a(&r.resume, sizeof r.resume, h));
}

Module& module_of(TranslationModel& m) { return *m.model; }
Module& module_of(LanguageModel& m) { return *m.model; }
Module& module_of(std::shared_ptr<VisionTransformer>& m) { return *m; }

// The model a run starts from: the --init folder's, ready to train (every
// Linear weight in float32, training mode), or `fresh()`.
template <class Model, class Load, class Fresh>
Model initial_model(const TrainRun& r, Load&& load, Fresh&& fresh) {
  if (r.init.empty()) return fresh();
  Model m = load(r.init, "train --init", "f32");
  module_of(m).train();
  return m;
}

uint64_t hash_texts(uint64_t h, const std::vector<SentencePair>& pairs) {
  for (const auto& [s, t] : pairs) h = fnv1a(t.data(), t.size() + 1, fnv1a(s.data(), s.size() + 1, h));
  return h;
}

uint64_t hash_ints(uint64_t h, const std::vector<int64_t>& v) { return fnv1a(v.data(), v.size() * sizeof(int64_t), h); }

void require_same_data(const TrainRun& r, uint64_t data_hash) {
  require_same_everywhere(r.group, data_hash, "a config, options or data (--config, --train, --valid)");
}

TrainOutcome train_translation_run(const TrainRun& r, const TrainHooks& hooks) {
  TrainOptions o = TrainOptions::from_json(r.config_text, r.config_source);
  apply_overrides(r, o);
  if (r.batch_tokens) o.batch_tokens = *r.batch_tokens;
  std::vector<SentencePair> train = read_parallel_tsv(r.train, {.replace_invalid_utf8 = r.replace_invalid_utf8});
  std::vector<SentencePair> valid = r.valid.empty()
                                        ? hold_out_pairs(train, r)
                                        : read_parallel_tsv(r.valid, {.replace_invalid_utf8 = r.replace_invalid_utf8});
  require_same_data(r, hash_texts(hash_texts(run_hash(r), train), valid));  // before a tokenizer is learnt from them
  // A resumed run takes the model's config and vocabulary from its folder; the
  // latest weights and the training state come from trainer_state.safetensors.
  TranslationModel m = r.resume ? load_translation_model(r.out, "train --resume")
                                : initial_model<TranslationModel>(r, load_translation_model, [&] {
                                    return new_translation_model(r.config_text, r.config_source, train, o.seed);
                                  });
  if (r.resume) m.model->train();
  say_starting(r, hooks, m.model->summary(),
               std::to_string(train.size()) + " training pairs, " + std::to_string(valid.size()) +
                   " validation pairs; " + std::to_string(o.steps) + " steps of up to " +
                   std::to_string(o.batch_tokens) + " tokens" + precision_note(o.precision));
  return train_translation(m, train, valid, o, r.out, hooks.translation, r.group);
}

// The documents of `text`, read from `path`, as one token stream; an error names the file.
std::vector<int64_t> documents(const Tokenizer& tok, const std::string& text, const std::string& path) {
  try {
    return pack_documents(tok, text);
  } catch (const Error& e) {
    fail(path, ":", e.what());
  }
}

TrainOutcome train_language_run(const TrainRun& r, const TrainHooks& hooks) {
  LmTrainOptions o = LmTrainOptions::from_json(r.config_text, r.config_source);
  apply_overrides(r, o);
  const std::string text = read_file(r.train), valid_text = r.valid.empty() ? "" : read_file(r.valid);
  require_same_data(r, fnv1a(valid_text.data(), valid_text.size(), fnv1a(text.data(), text.size(), run_hash(r))));
  LanguageModel m = r.resume ? load_language_model(r.out, "train --resume")
                             : initial_model<LanguageModel>(r, load_language_model, [&] {
                                 return new_language_model(r.config_text, r.config_source, text, o.seed);
                               });
  if (r.resume) m.model->train();
  std::vector<int64_t> train = documents(*m.tokenizer, text, r.train);
  std::vector<int64_t> valid = r.valid.empty() ? hold_out_tokens(train, r) : documents(*m.tokenizer, valid_text, r.valid);
  say_starting(r, hooks, m.model->summary(),
               std::to_string(train.size()) + " training tokens, " + std::to_string(valid.size()) +
                   " validation tokens; " + std::to_string(o.steps) + " steps of " + std::to_string(o.batch_size) +
                   " x " + std::to_string(m.model->config().context) + " tokens" + precision_note(o.precision));
  return train_language_model(m, train, valid, o, r.out, hooks.language, r.group);
}

TrainOutcome train_vision_run(const TrainRun& r, const TrainHooks& hooks) {
  VitTrainOptions o = VitTrainOptions::from_json(r.config_text, r.config_source);
  apply_overrides(r, o);
  ImageSet train = load_idx_folder(r.train, "train");
  ImageSet test = load_idx_folder(r.valid.empty() ? r.train : r.valid, "t10k");
  uint64_t h = run_hash(r);
  for (const ImageSet* set : {&train, &test})
    h = hash_ints(fnv1a(set->pixels.data(), set->pixels.size(), h), set->labels);
  require_same_data(r, h);
  std::shared_ptr<VisionTransformer> model;
  if (r.resume) {  // the config comes from the model folder, the latest weights from the trainer state
    model = load_vit_model(r.out, "train --resume");
    model->train();
  } else {
    model = initial_model<std::shared_ptr<VisionTransformer>>(
        r, load_vit_model, [&] { return new_vit_model(r.config_text, r.config_source, o.seed); });
  }
  const int64_t used = o.max_train_images > 0 ? std::min(o.max_train_images, train.count) : train.count;
  say_starting(r, hooks, model->summary(),
               std::to_string(used) + " training images (of " + std::to_string(train.count) + "), " +
                   std::to_string(test.count) + " test images; " + std::to_string(o.epochs) +
                   " epochs of batches of " + std::to_string(o.batch_size) + precision_note(o.precision));
  return train_vit(*model, train, test, o, r.out, hooks.vision, r.group);
}

// A run from --init carries the folder's chat template into its own (rank 0
// writes), so that the fine-tuned model still chats.
TrainOutcome with_chat_template(const TrainRun& r, TrainOutcome outcome) {
  if (!r.init.empty() && (!r.group || r.group->rank() == 0)) copy_chat_template(r.init, r.out);
  return outcome;
}

// The family of the --init folder; the config may then hold only a "train"
// section (and an "arch" that agrees), since the model is the folder's.
const Family& init_family(const TrainRun& r) {
  const Family& family = family_of_folder(r.init);
  const nlohmann::json config = parse_json(r.config_text, r.config_source);
  QKV_CHECK(config.is_object(), r.config_source, ": expected a JSON object");
  for (const auto& [key, value] : config.items()) {
    if (key == "train") continue;
    QKV_CHECK(key == "arch" && value == family.arch, "train ", option(r, "init"), ": the model comes from ", r.init,
              " (", family.description, "); ", r.config_source, " may hold only its \"train\" section, not '", key,
              "'", key == "arch" ? " = " + value.dump() : "");
  }
  return family;
}

}  // namespace

TrainOutcome train_from_config(const TrainRun& r, const TrainHooks& hooks) {
  QKV_CHECK(!r.steps || *r.steps >= 1, "train: ", option(r, "steps"), " must be at least 1, got ", *r.steps);
  QKV_CHECK(!r.epochs || *r.epochs >= 1, "train: ", option(r, "epochs"), " must be at least 1, got ", *r.epochs);
  QKV_CHECK(!r.batch_tokens || *r.batch_tokens >= 1, "train: ", option(r, "batch_tokens"), " must be at least 1, got ",
            *r.batch_tokens);
  QKV_CHECK(!r.lr || (*r.lr > 0 && std::isfinite(*r.lr)), "train: ", option(r, "lr"), " must be a positive number, got ",
            *r.lr);
  QKV_CHECK(!r.seed || *r.seed >= 0, "train: ", option(r, "seed"), " must be at least 0, got ", *r.seed);
  const Family& family = r.init.empty() ? family_of_config(r.config_text, r.config_source) : init_family(r);
  if (r.resume) {  // the folder must hold what the config describes
    const Family& held = family_of_folder(r.out);
    QKV_CHECK(held.arch == family.arch, "train --resume: ", r.out, " holds ", held.description, " (arch '", held.arch,
              "'), the config ", r.config_source, " is for arch '", family.arch, "'");
  }
  switch (family.domain) {
    case Domain::Vision:
      QKV_CHECK(!r.steps && !r.batch_tokens, "train: ", option(r, "steps"), " and ", option(r, "batch_tokens"),
                " are for translation; a vit config trains for ", option(r, "epochs"));
      return with_chat_template(r, train_vision_run(r, hooks));
    case Domain::Language:
      QKV_CHECK(!r.epochs, "train: ", option(r, "epochs"), " is for vit configs; decoder models train for ",
                option(r, "steps"));
      QKV_CHECK(!r.batch_tokens, "train: ", option(r, "batch_tokens"),
                " is for translation; a decoder config sets train.batch_size");
      return with_chat_template(r, train_language_run(r, hooks));
    case Domain::Embedding:
      fail("train: ", r.config_source, " describes ", family.description,
           ", which qkv train does not train yet (it runs pretrained ones: qkv embed)");
    case Domain::Translation:
      QKV_CHECK(!r.epochs, "train: ", option(r, "epochs"), " is for vit configs; translation models train for ",
                option(r, "steps"));
      return with_chat_template(r, train_translation_run(r, hooks));
  }
  fail("train: ", r.config_source, ": a family of an unknown domain");
}

}  // namespace qkv
