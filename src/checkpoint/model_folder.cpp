// The model-folder reader and writer (see qkv/checkpoint.h).
#include "qkv/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "src/core/json.h"

namespace qkv {

namespace {

// config.json is read and parsed once; with a task, the family is checked
// before anything is built.
ModelFolder load(const std::string& dir, const Task* task, const std::string& command) {
  const std::string config_path = folder_config_path(dir);
  const std::string text = read_file(config_path);
  ModelFolder m;
  m.family = &family_of_config(text, config_path);
  if (task) require_task(*m.family, dir, *task, command);
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
