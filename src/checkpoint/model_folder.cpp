// The model-folder reader and writer (see qkv/checkpoint.h).
#include "qkv/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "src/core/json.h"

namespace qkv {

namespace {

// A Hugging Face folder: the family's import of its config.json, and the
// weights under their qkv names, converted to F32 as they load. Its
// tokenizer.json is not read yet, so m.tokenizer stays null (issue 15).
ModelFolder load_hf(const std::string& dir, const std::string& config_path, const std::string& text, ModelFolder m) {
  const HfImport hf = m.family->from_hf(text, config_path);
  Rng rng(0);
  m.model = m.family->build(hf.config_json, config_path, rng);
  const std::string path = dir + "/model.safetensors";
  QKV_CHECK(std::filesystem::exists(path) || !std::filesystem::exists(dir + "/model.safetensors.index.json"), dir,
            ": weights sharded over several files (model.safetensors.index.json) are not read yet");
  StateDict state;
  for (auto& [name, t] : load_safetensors(path).as_map()) {
    const std::string to = hf.weight_name(name);
    QKV_CHECK(!to.empty(), path, ": tensor '", name, "' has no place in ", m.family->description);
    state[to] = t;
  }
  try {
    m.model->load_state_dict(state);
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
  m.model->eval();
  return m;
}

// config.json is read and parsed once; with a task, the family is checked
// before anything is built.
ModelFolder load(const std::string& dir, const Task* task, const std::string& command) {
  const std::string config_path = folder_config_path(dir);
  const std::string text = read_file(config_path);
  ModelFolder m;
  m.family = &family_of_config(text, config_path);
  if (task) require_task(*m.family, dir, *task, command);
  if (is_hf_config(text, config_path)) return load_hf(dir, config_path, text, std::move(m));
  nlohmann::json config = parse_json(text, config_path);
  if (m.family->domain != Domain::Vision) {
    QKV_CHECK(config.contains("tokenizer"), config_path, ": no \"tokenizer\" field");
    m.tokenizer = load_tokenizer(config["tokenizer"].dump(), dir);
    config.erase("tokenizer");
    const nlohmann::json vocab = config.value("vocab_size", nlohmann::json(-1));
    QKV_CHECK(vocab.is_number_integer() && vocab.get<int64_t>() == m.tokenizer->size(), dir, ": tokenizer has ",
              m.tokenizer->size(), " tokens, config.json says vocab_size ", vocab.dump());
  }
  Rng rng(0);
  m.model = m.family->build(config.dump(), config_path, rng);
  SafetensorsFile weights = load_safetensors(dir + "/model.safetensors");
  try {
    m.model->load_state_dict(weights.as_map());
  } catch (const Error& e) {
    fail(dir, "/model.safetensors: ", e.what());
  }
  m.model->eval();
  return m;
}

}  // namespace

ModelFolder load_model_folder(const std::string& dir) { return load(dir, nullptr, ""); }

ModelFolder load_model_folder(const std::string& dir, Task task, const std::string& command) {
  return load(dir, &task, command);
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
  }
  write_file_atomic(dir + "/config.json", config.dump(2) + "\n");
  save_safetensors(dir + "/model.safetensors", model.state_dict(), {{"format", "qkv"}, {"arch", family.arch}});
  if (!trainer_state_json.empty()) write_file_atomic(dir + "/trainer_state.json", trainer_state_json);
}

}  // namespace qkv
