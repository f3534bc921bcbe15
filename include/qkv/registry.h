// qkv/registry.h — the model families: one entry per "arch" of config.json.
//
// A family says what it is, what it trains on, which tasks it serves, and how
// to build its model from a config. The CLI, the model-folder reader
// (qkv/checkpoint.h) and the trainers ask the registry instead of testing the
// arch string, so a folder of the wrong kind gets one clear error:
//   qkv generate: out/demo/model holds a translation Transformer (arch 'transformer'), which serves
//   translate and eval; generate needs a model that serves generate (arch decoder)
//
// The built-in families live in src/models/<family>/ and are listed once in
// src/models/registry.cpp; register_family adds one at run time.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qkv/nn.h"

namespace qkv {

enum class Task {
  Translate,  // text in one language to text in another (qkv translate)
  Generate,   // continue a prompt (qkv generate)
  Classify,   // images to classes (qkv classify)
  Eval,       // scores on a test set (qkv eval)
  Embed,      // texts to vectors (qkv embed)
};
const char* task_name(Task task);

// What a family trains on, which decides the trainer and the data qkv train reads.
enum class Domain {
  Translation,  // tab-separated parallel text; the model is a Seq2Seq (qkv/models.h)
  Language,     // plain text; the model is a DecoderLM (qkv/lm.h)
  Vision,       // IDX images; the model is a VisionTransformer (qkv/vit.h)
  Embedding,    // sentences to vectors; the model is a TextEncoder (qkv/encoder.h), not trained by qkv train yet
};

// A Hugging Face config.json as a family reads it: the qkv config of the same
// model ("arch" set), and the qkv name of each weight the HF checkpoint holds
// ("" for a name the family has no place for: an error naming it; kSkip for a
// tensor that is no weight, such as the causal mask GPT-2 checkpoints save as
// "attn.bias"). `convert`, when set, gives a tensor the layout qkv's weight has
// (GPT-2's Conv1D stores [in, out], qkv's Linear [out, in]).
struct HfImport {
  static constexpr const char* kSkip = "(not a weight)";
  std::string config_json;
  std::function<std::string(const std::string& hf_name)> weight_name;
  std::function<Tensor(const std::string& hf_name, const Tensor& t)> convert;
  // When set, called on the whole state (qkv names, after convert) before it
  // loads: for changes that need several tensors at once.
  std::function<void(StateDict& state)> finish;
};

struct Family {
  std::string arch;         // config.json's "arch"
  std::string description;  // for people: "a translation Transformer"
  Domain domain = Domain::Translation;
  std::vector<Task> tasks;
  // The model of a config (its model keys, "vocab_size" set for text
  // families; "train" and "tokenizer" already removed). Bad keys are errors
  // naming `source`.
  std::function<std::shared_ptr<Module>(const std::string& config_json, const std::string& source, Rng& rng)> build;
  // The config.json of a model this family built (with "arch", without "tokenizer").
  std::function<std::string(const Module& model)> config_json;
  // For families that read Hugging Face folders: the import of an HF
  // config.json whose "architectures" names one of `hf_architectures`; an
  // option that changes the math and that qkv does not implement is an error
  // naming the field. Empty for the others.
  std::vector<std::string> hf_architectures;
  std::function<HfImport(const std::string& hf_config, const std::string& source)> from_hf;

  bool serves(Task task) const;
  // from_hf, with a field of the wrong JSON type (in any family's import) as
  // one error line naming `source`: what callers use.
  HfImport import_hf(const std::string& hf_config, const std::string& source) const;
};

// Every family, built-in first, in registration order.
const std::deque<Family>& families();
// The family of `arch`; an unknown arch is "SOURCE: 'arch' is 'X', expected one of: ...".
const Family& find_family(const std::string& arch, const std::string& source);
// The family a config's text names: its "arch", "transformer" when absent;
// for a Hugging Face config.json (no "arch", an "architectures" list), the
// family that reads that architecture, or an error listing those qkv reads.
const Family& family_of_config(const std::string& config_text, const std::string& source);
// Whether a config's text is a Hugging Face config.json (see above).
bool is_hf_config(const std::string& config_text, const std::string& source);
// The path of `dir`'s config.json; a missing folder or file is an error naming it.
std::string folder_config_path(const std::string& dir);
// The family of the model folder `dir` (from its config.json).
const Family& family_of_folder(const std::string& dir);
// family_of_folder(dir), when it serves `task`; otherwise the error above,
// naming `command`, the folder, what it holds and which families would do.
const Family& family_for_task(const std::string& dir, Task task, const std::string& command);
// The same error when `family` (of the folder `dir`) does not serve `task`.
void require_task(const Family& family, const std::string& dir, Task task, const std::string& command);
// Adds a family (an extension, a test); an arch already registered is an error.
void register_family(Family family);

}  // namespace qkv
