// The family registry: the one list of built-in families, and the lookups
// that the CLI, the model-folder reader and the trainers share.
#include "qkv/registry.h"

#include <deque>
#include <filesystem>

#include "qkv/io.h"
#include "src/core/json.h"
#include "src/models/families.h"

namespace qkv {

namespace {

std::deque<Family>& registry() {
  // Adding a family: its folder under src/models/ and one line here.
  static std::deque<Family> all = {  // a deque: references stay valid as families are added
      builtin::transformer(), builtin::rnn_attention(), builtin::conv(), builtin::decoder(), builtin::vit(),
      builtin::encoder(),
  };
  return all;
}

std::string list(const std::vector<std::string>& names, const char* last) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? last : ", ") + names[i];
  return out;
}

std::string tasks_of(const Family& f) {
  std::vector<std::string> names;
  for (Task t : f.tasks) names.push_back(task_name(t));
  return list(names, " and ");
}

}  // namespace

const char* task_name(Task task) {
  switch (task) {
    case Task::Translate: return "translate";
    case Task::Generate: return "generate";
    case Task::Classify: return "classify";
    case Task::Eval: return "eval";
    case Task::Embed: return "embed";
  }
  return "?";
}

bool Family::serves(Task task) const {
  for (Task t : tasks)
    if (t == task) return true;
  return false;
}

HfImport Family::import_hf(const std::string& hf_config, const std::string& source) const {
  QKV_CHECK(from_hf, source, ": ", description, " does not read Hugging Face configs");
  try {
    return from_hf(hf_config, source);
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": a field has the wrong type (", e.what(), ")");
  }
}

const std::deque<Family>& families() { return registry(); }

const Family& find_family(const std::string& arch, const std::string& source) {
  std::vector<std::string> known;
  for (const Family& f : registry()) {
    if (f.arch == arch) return f;
    known.push_back(f.arch);
  }
  fail(source, ": 'arch' is '", arch, "', expected one of: ", list(known, ", "));
}

namespace {

// The first name of a Hugging Face config's "architectures", or "" when the
// config is not one (it has an "arch", or no "architectures").
std::string hf_architecture(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object() || j.contains("arch") || !j.contains("architectures")) return "";
  const nlohmann::json& a = j["architectures"];
  QKV_CHECK(a.is_array() && !a.empty() && a[0].is_string(), source,
            ": 'architectures' should be a list of class names, found ", a.dump());
  return a[0].get<std::string>();
}

}  // namespace

bool is_hf_config(const std::string& config_text, const std::string& source) {
  return !hf_architecture(parse_json(config_text, source), source).empty();
}

const Family& family_of_config(const std::string& config_text, const std::string& source) {
  nlohmann::json j = parse_json(config_text, source);
  QKV_CHECK(j.is_object(), source, ": expected a JSON object");
  if (const std::string hf = hf_architecture(j, source); !hf.empty()) {
    std::vector<std::string> known;
    for (const Family& f : registry()) {
      for (const std::string& a : f.hf_architectures) {
        if (a == hf) return f;
        known.push_back(a);
      }
    }
    fail(source, ": a Hugging Face model of architecture ", hf, "; qkv reads ", list(known, ", "));
  }
  const nlohmann::json arch = j.value("arch", nlohmann::json("transformer"));
  QKV_CHECK(arch.is_string(), source, ": 'arch' has the wrong type (", arch.dump(), ")");
  return find_family(arch.get<std::string>(), source);
}

std::string folder_config_path(const std::string& dir) {
  QKV_CHECK(std::filesystem::is_directory(dir), "model folder ", dir, " does not exist");
  const std::string path = dir + "/config.json";
  QKV_CHECK(std::filesystem::exists(path), dir, " is not a model folder: it has no config.json");
  return path;
}

const Family& family_of_folder(const std::string& dir) {
  const std::string path = folder_config_path(dir);
  return family_of_config(read_file(path), path);
}

const Family& family_for_task(const std::string& dir, Task task, const std::string& command) {
  const Family& f = family_of_folder(dir);
  require_task(f, dir, task, command);
  return f;
}

void require_task(const Family& f, const std::string& dir, Task task, const std::string& command) {
  if (f.serves(task)) return;
  std::vector<std::string> serving;
  for (const Family& other : registry())
    if (other.serves(task)) serving.push_back(other.arch);
  fail(command, ": ", dir, " holds ", f.description, " (arch '", f.arch, "'), which serves ", tasks_of(f), "; ",
       task_name(task), " needs a model that does (arch ", list(serving, " or "), ")");
}

void register_family(Family family) {
  QKV_CHECK(!family.arch.empty() && family.build && family.config_json, "register_family: a family needs an arch, ",
            "a build function and a config_json function");
  for (const Family& f : registry())
    QKV_CHECK(f.arch != family.arch, "register_family: arch '", family.arch, "' is already registered");
  registry().push_back(std::move(family));
}

}  // namespace qkv
