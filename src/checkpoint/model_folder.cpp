// The model-folder reader and writer (see qkv/checkpoint.h).
#include "qkv/checkpoint.h"

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "qkv/tokenizer.h"
#include "src/core/json.h"

namespace qkv {

namespace {

// The ids that end generation: eos_token_id (a number or a list) of
// generation_config.json, as transformers' generate() reads it, else of
// config.json; none when neither has one.
std::vector<int64_t> hf_eos(const std::string& dir, const nlohmann::json& config, const std::string& config_path) {
  nlohmann::json from = config;
  std::string source = config_path;
  const std::string generation = dir + "/generation_config.json";
  if (std::filesystem::exists(generation)) {
    nlohmann::json g = parse_json(read_file(generation), generation);
    if (g.is_object() && g.contains("eos_token_id")) from = g, source = generation;
  }
  std::vector<int64_t> eos;
  const nlohmann::json id = from.is_object() ? from.value("eos_token_id", nlohmann::json()) : nlohmann::json();
  for (const nlohmann::json& v : id.is_array() ? id : nlohmann::json::array({id})) {
    if (v.is_null()) continue;
    QKV_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, source, ": eos_token_id must be an id or a list of ids");
    eos.push_back(v.get<int64_t>());
  }
  return eos;
}

// model.safetensors.index.json: file -> the tensors its "weight_map" puts there.
std::map<std::string, std::set<std::string>> read_shard_index(const std::string& index_path) {
  const nlohmann::json index = parse_json(read_file(index_path), index_path);
  QKV_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), index_path,
            ": expected an object with a \"weight_map\" object");
  std::map<std::string, std::set<std::string>> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    QKV_CHECK(file.is_string(), index_path, ": the file of '", name, "' is not a string");
    const std::string f = file.get<std::string>();
    QKV_CHECK(!f.empty() && f.find('/') == std::string::npos && f.find('\\') == std::string::npos && f != "." &&
                  f != "..",
              index_path, ": '", f, "' is not a file name in the folder");
    shards[f].insert(name);
  }
  QKV_CHECK(!shards.empty(), index_path, ": \"weight_map\" names no tensor");
  return shards;
}

bool sharded(const std::string& dir) {
  return !std::filesystem::exists(dir + "/model.safetensors") &&
         std::filesystem::exists(dir + "/model.safetensors.index.json");
}

// The weight files of a Hugging Face folder, open (headers read and checked):
// model.safetensors, or the shards model.safetensors.index.json lists (its
// "weight_map" names each tensor's file, a file name in `dir`). Every tensor
// the index names must be in its shard, and a shard holds no tensor the index
// does not give it, so a mixed-up folder is an error before a byte of weights
// is read, not a model with weights from the wrong place. `source` is the file
// errors about the whole set name.
struct HfWeights {
  std::string source;
  std::vector<std::unique_ptr<SafetensorsReader>> files;
};

HfWeights hf_weights(const std::string& dir) {
  const std::string single = dir + "/model.safetensors", index_path = dir + "/model.safetensors.index.json";
  HfWeights out;
  if (!sharded(dir)) {
    out.source = single;
    out.files.push_back(std::make_unique<SafetensorsReader>(single));
    return out;
  }
  out.source = index_path;
  for (const auto& [file, names] : read_shard_index(index_path)) {
    const std::string path = dir + "/" + file;
    out.files.push_back(std::make_unique<SafetensorsReader>(path));
    std::set<std::string> seen;
    for (const SafetensorsEntry& e : out.files.back()->entries()) {
      QKV_CHECK(names.count(e.name), path, ": tensor '", e.name, "' is not listed for this file in ", index_path);
      seen.insert(e.name);
    }
    for (const std::string& name : names)
      QKV_CHECK(seen.count(name), path, ": tensor '", name, "', which ", index_path, " places here, is missing");
  }
  return out;
}

// The dtype the Linear weights are built in for the dtype asked for (the
// --dtype names): none for "" (float32, converted as the folder says); bf16
// and f16 as asked, so that weights stored so are taken as they are; for
// int8, which quantizes each weight as it is filled in, the files' float
// dtype when they hold only bfloat16 or only float16 (nothing is lost); else
// float32.
std::optional<DType> build_dtype(const std::string& requested, const HfWeights& weights) {
  const std::optional<DType> d = linear_dtype_named(requested);
  if (d != DType::I8) return d;
  std::set<DType> floats;
  for (const auto& f : weights.files)
    for (const SafetensorsEntry& e : f->entries())
      if (dtype_traits(e.dtype).is_float) floats.insert(e.dtype);
  if (floats.size() == 1 && (*floats.begin() == DType::BF16 || *floats.begin() == DType::F16)) return *floats.begin();
  return DType::F32;
}

// The model of `config_json`, its weights unset (every one loads next), its
// Linear weights without memory in `linear` when given.
std::shared_ptr<Module> build_unset(const Family& family, const std::string& config_json, const std::string& source,
                                    std::optional<DType> linear) {
  Rng rng(0);
  SkipInitGuard uninitialized;
  std::optional<LinearDTypeGuard> in;
  if (linear) in.emplace(*linear);
  return family.build(config_json, source, rng);
}

// A Hugging Face folder: the family's import of its config.json, and the
// weights under their qkv names, read one tensor at a time into the model
// (converted to its dtypes: float32, and the Linear weights' dtype asked
// for); its tokenizer.json, else Marian's files, else a tokenizer.model, when
// there is one (m.tokenizer stays null without).
ModelFolder load_hf(const std::string& dir, const std::string& config_path, const std::string& text, ModelFolder m,
                    const LoadOptions& options) {
  const HfImport hf = m.family->import_hf(text, config_path);
  HfWeights weights = hf_weights(dir);
  m.model = build_unset(*m.family, hf.config_json, config_path, build_dtype(options.dtype, weights));
  StateLoader loader(*m.model);
  StateDict whole;  // for an import that finishes on the whole state
  std::set<std::string> placed;
  // For int8, each Linear weight is quantized as soon as it is in: the model
  // never holds all its Linear weights in two dtypes.
  const bool quantize = options.dtype == "int8";
  auto load = [&](const std::string& name, Tensor t) {
    try {
      loader.load(name, std::move(t));
      if (Linear* linear = quantize ? m.model->linear_of(name) : nullptr) linear->convert_weight(DType::I8);
    } catch (const Error& e) {
      fail(weights.source, ": ", e.what());
    }
  };
  for (const auto& file : weights.files) {
    for (size_t i = 0; i < file->entries().size(); ++i) {
      const std::string& name = file->entries()[i].name;
      const std::string to = hf.weight_name(name);
      QKV_CHECK(!to.empty(), weights.source, ": tensor '", name, "' has no place in ", m.family->description);
      if (to == HfImport::kSkip) continue;
      QKV_CHECK(placed.insert(to).second, weights.source, ": tensor '", name, "' is a second copy of ", to);
      Tensor t = file->read(i);
      if (hf.convert) t = hf.convert(name, t);
      if (hf.finish) {
        whole[to] = std::move(t);
      } else {
        load(to, std::move(t));
      }
    }
  }
  if (hf.finish) {
    try {
      hf.finish(whole);
    } catch (const Error& e) {
      fail(weights.source, ": ", e.what());
    }
    for (auto it = whole.begin(); it != whole.end(); it = whole.erase(it)) load(it->first, std::move(it->second));
  }
  try {
    loader.finish();
  } catch (const Error& e) {
    fail(weights.source, ": ", e.what());
  }
  m.model->convert_linear_weights(options.dtype);
  m.model->eval();
  const std::string tokenizer = dir + "/tokenizer.json";
  const nlohmann::json config = parse_json(text, config_path);
  const nlohmann::json vocab = config.value("vocab_size", nlohmann::json(-1));
  if (std::filesystem::exists(tokenizer)) {
    m.tokenizer = load_hf_tokenizer(tokenizer, hf_eos(dir, config, config_path));
    QKV_CHECK(!vocab.is_number_integer() || m.tokenizer->size() <= vocab.get<int64_t>(), tokenizer, ": ",
              m.tokenizer->size(), " tokens, more than the model's vocab_size ", vocab.dump());
  } else if (is_marian_tokenizer_folder(dir)) {
    m.tokenizer = load_marian_tokenizer(dir);
    QKV_CHECK(!vocab.is_number_integer() || m.tokenizer->size() == vocab.get<int64_t>(), dir, "/vocab.json: ",
              m.tokenizer->size(), " pieces, the model's vocab_size is ", vocab.dump());
    // The output side's pieces (target_vocab.json with separate vocabularies) are the decoder's.
    const Tokenizer& target = m.tokenizer->target();
    const nlohmann::json target_vocab = config.value("decoder_vocab_size", vocab);
    QKV_CHECK(!target_vocab.is_number_integer() || target.size() == target_vocab.get<int64_t>(), dir, "/",
              target.file_name(), ": ", target.size(), " pieces, the model's decoder_vocab_size is ",
              target_vocab.dump());
  } else if (is_sentencepiece_tokenizer_folder(dir)) {
    m.tokenizer = load_sentencepiece_folder_tokenizer(dir, hf_eos(dir, config, config_path));
    QKV_CHECK(!vocab.is_number_integer() || m.tokenizer->size() <= vocab.get<int64_t>(), dir, "/tokenizer.model: ",
              m.tokenizer->size(), " pieces, more than the model's vocab_size ", vocab.dump());
  }
  return m;
}

// config.json is read and parsed once; with a task, the family is checked
// before anything is built.
ModelFolder load(const std::string& dir, const Task* task, const std::string& command, const LoadOptions& options) {
  linear_dtype_named(options.dtype);  // an unknown name is an error before anything is read
  const std::string config_path = folder_config_path(dir);
  const std::string text = read_file(config_path);
  ModelFolder m;
  m.family = &family_of_config(text, config_path);
  if (task) require_task(*m.family, dir, *task, command);
  if (is_hf_config(text, config_path)) return load_hf(dir, config_path, text, std::move(m), options);
  nlohmann::json config = parse_json(text, config_path);
  if (m.family->domain != Domain::Vision) {
    QKV_CHECK(config.contains("tokenizer"), config_path, ": no \"tokenizer\" field");
    m.tokenizer = load_tokenizer(config["tokenizer"].dump(), dir);
    // A Hugging Face tokenizer may have fewer tokens than the model's
    // embedding has rows (vocabularies padded to a multiple of 64 or so).
    const bool at_most = config["tokenizer"].is_object() && (config["tokenizer"].value("type", "") == "huggingface" ||
                                                              config["tokenizer"].value("type", "") == "huggingface_sentencepiece");
    config.erase("tokenizer");
    const nlohmann::json vocab = config.value("vocab_size", nlohmann::json(-1));
    auto fits = [&](const Tokenizer& t, const nlohmann::json& size) {
      return size.is_number_integer() &&
             (size.get<int64_t>() == t.size() || (at_most && t.size() <= size.get<int64_t>()));
    };
    // vocab_size counts the output side's ids; a translation model with
    // separate vocabularies counts the source's in source_vocab_size.
    const Tokenizer& target = m.tokenizer->target();
    QKV_CHECK(fits(target, vocab), dir, ": tokenizer has ", target.size(), " tokens, config.json says vocab_size ",
              vocab.dump());
    if (const nlohmann::json source_vocab = config.value("source_vocab_size", nlohmann::json(0)); source_vocab != 0)
      QKV_CHECK(fits(*m.tokenizer, source_vocab), dir, ": the source's tokenizer has ", m.tokenizer->size(),
                " tokens, config.json says source_vocab_size ", source_vocab.dump());
    else
      QKV_CHECK(&target == m.tokenizer.get(), dir,
                ": the tokenizer has a vocabulary for each side, and config.json no "
                "source_vocab_size");
  }
  SafetensorsReader file(dir + "/model.safetensors");
  // A folder qkv convert wrote has its Linear weights in their own dtype
  // already: they are built without values (any dtype but float32 builds them
  // on the meta device), take each its file's dtype (adopt_linear_dtypes) and
  // keep the memory the file's tensors were read into, so that no float32
  // copy of them is ever made. A float32 folder is built as always.
  std::optional<DType> without_values;
  for (const SafetensorsEntry& e : file.entries())
    if (e.dtype == DType::BF16 || e.dtype == DType::F16 || e.dtype == DType::I8) without_values = DType::BF16;
  m.model = build_unset(*m.family, config.dump(), config_path, without_values);
  try {
    StateDict state;
    for (size_t i = 0; i < file.entries().size(); ++i) state.emplace(file.entries()[i].name, file.read(i));
    m.model->adopt_linear_dtypes(state);  // a folder qkv convert wrote: its bf16 or int8 Linear weights as they are
    StateLoader loader(*m.model);
    for (auto it = state.begin(); it != state.end(); it = state.erase(it))
      loader.load(it->first, std::move(it->second));
    loader.finish();
    // Then what a model converted in memory also has (a decoder's tied head in that dtype).
    if (m.model->linear_weight_dtype() != DType::F32) m.model->convert_linear_weights(m.model->linear_weight_dtype());
    m.model->convert_linear_weights(options.dtype);
  } catch (const Error& e) {
    fail(dir, "/model.safetensors: ", e.what());
  }
  m.model->eval();
  return m;
}

}  // namespace

ModelFolder load_model_folder(const std::string& dir, const LoadOptions& options) {
  return load(dir, nullptr, "", options);
}

std::vector<std::string> weight_files(const std::string& dir) {
  if (!sharded(dir)) return {dir + "/model.safetensors"};
  std::vector<std::string> files;
  for (const auto& [file, names] : read_shard_index(dir + "/model.safetensors.index.json"))
    files.push_back(dir + "/" + file);
  return files;
}

ModelFolder load_model_folder(const std::string& dir, Task task, const std::string& command,
                              const LoadOptions& options) {
  return load(dir, &task, command, options);
}

void average_model_folders(const std::vector<std::string>& dirs, const std::string& out) {
  QKV_CHECK(dirs.size() >= 2, "average: ", dirs.size(), " model folder", dirs.size() == 1 ? "" : "s",
            ", expected two or more");
  for (const std::string& dir : dirs)
    QKV_CHECK(std::filesystem::weakly_canonical(dir) != std::filesystem::weakly_canonical(out), "average: --out ", out,
              " is one of the folders to average");
  NoGradGuard no_grad;
  ModelFolder first = load_model_folder(dirs[0]);
  const std::string config = first.family->config_json(*first.model);
  const std::string vocabulary = first.tokenizer ? first.tokenizer->serialize() : "";
  StateDict sum = first.model->state_dict();
  for (auto& [name, t] : sum) {
    QKV_CHECK(t.dtype() == DType::F32, "average: ", dirs[0], ": weight '", name, "' is ", dtype_name(t.dtype()),
              ", not float32");
    t = t.clone();
  }
  for (size_t i = 1; i < dirs.size(); ++i) {
    ModelFolder f = load_model_folder(dirs[i]);
    QKV_CHECK(f.family == first.family && f.family->config_json(*f.model) == config, "average: ", dirs[i],
              " is not the same model as ", dirs[0], " (its config.json differs)");
    QKV_CHECK((f.tokenizer ? f.tokenizer->serialize() : "") == vocabulary, "average: ", dirs[i],
              " has another tokenizer than ", dirs[0]);
    for (auto& [name, t] : f.model->state_dict()) {
      Tensor& acc = sum.at(name);  // the same config: the same names and shapes
      const Tensor w = t.contiguous();
      float* a = acc.data<float>();
      const float* b = w.data<float>();
      const int64_t n = acc.numel();
      for (int64_t k = 0; k < n; ++k) a[k] += b[k];
    }
  }
  const float scale = 1.0f / (float)dirs.size();
  for (auto& [name, t] : sum) {
    float* a = t.data<float>();
    const int64_t n = t.numel();
    for (int64_t k = 0; k < n; ++k) a[k] *= scale;
  }
  first.model->load_state_dict(sum);
  nlohmann::ordered_json note = {{"averaged", dirs}};
  save_model_folder(out, *first.family, *first.model, first.tokenizer.get(), note.dump(2) + "\n");
}

void save_model_folder(const std::string& dir, const Family& family, const Module& model, const Tokenizer* tokenizer,
                       const std::string& trainer_state_json) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  QKV_CHECK(std::filesystem::is_directory(dir), "cannot create the model folder ", dir, ec ? ": " + ec.message() : "");
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(family.config_json(model));
  if (tokenizer) {
    config["tokenizer"] = nlohmann::ordered_json::parse(tokenizer->config_json());
    if (!tokenizer->file_name().empty()) write_file_atomic(dir + "/" + tokenizer->file_name(), tokenizer->serialize());
    for (const auto& [name, bytes] : tokenizer->extra_files()) write_file_atomic(dir + "/" + name, bytes);
  }
  write_file_atomic(dir + "/config.json", config.dump(2) + "\n");
  Metadata metadata = {{"format", "qkv"}, {"arch", family.arch}};
  const DType linear = model.linear_weight_dtype();
  if (linear != DType::F32) metadata["linear_weights"] = dtype_name(linear);
  if (linear == DType::I8)
    metadata["int8_format"] =
        "blockwise int8: a Linear's NAME.weight is I8 [out, in] and NAME.weight_scale F32 [out, ceil(in/32)]; "
        "weight[j, p] = NAME.weight[j, p] * NAME.weight_scale[j, p / 32]";
  save_safetensors(dir + "/model.safetensors", model.state_dict(), metadata);
  if (!trainer_state_json.empty()) write_file_atomic(dir + "/trainer_state.json", trainer_state_json);
}

}  // namespace qkv
