// qkv inspect FILE.safetensors|MODEL_DIR: names, dtypes, shapes, parameter
// count and metadata. A broken file prints the loader's error.
#include <sys/stat.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "qkv/checkpoint.h"
#include "qkv/io.h"
#include "qkv/registry.h"
#include "src/core/json.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {
namespace {

struct InspectArgs {
  std::string path;
  bool json = false;
};

bool is_dir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int run_inspect(const InspectArgs& a) {
  std::string weights = a.path;
  std::vector<std::string> files = {a.path};
  nlohmann::json config;
  const Family* family = nullptr;
  if (is_dir(a.path)) {
    files = weight_files(a.path);  // model.safetensors, or the shards its index lists
    weights = files.size() == 1 ? files[0] : a.path + "/model.safetensors.index.json";
    std::string cfg = a.path + "/config.json";
    struct stat st;
    if (stat(cfg.c_str(), &st) == 0) {
      config = parse_json(read_file(cfg), cfg);
      try {  // the tensors are worth showing even when the config names no family qkv knows
        family = &family_of_folder(a.path);
      } catch (const Error&) {
      }
    }
  }
  SafetensorsFile f = load_safetensors(files[0]);
  for (size_t i = 1; i < files.size(); ++i) {  // the shards' tensors after the first's; metadata of the first
    SafetensorsFile shard = load_safetensors(files[i]);
    f.tensors.insert(f.tensors.end(), shard.tensors.begin(), shard.tensors.end());
  }
  int64_t total = 0;
  for (auto& [name, t] : f.tensors) total += t.numel();
  if (a.json) {
    nlohmann::ordered_json out;
    out["file"] = weights;
    if (files.size() > 1) out["shards"] = files;
    out["parameter_count"] = total;
    out["tensors"] = nlohmann::ordered_json::array();
    for (auto& [name, t] : f.tensors)
      out["tensors"].push_back({{"name", name}, {"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}});
    out["metadata"] = f.metadata;
    if (!config.is_null()) out["config"] = config;
    if (family) out["model"] = {{"arch", family->arch}, {"description", family->description}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  size_t width = 4;
  for (auto& [name, t] : f.tensors) width = std::max(width, name.size());
  std::printf("%s\n", weights.c_str());
  if (files.size() > 1) std::printf("%zu shards\n", files.size());
  if (family) std::printf("model: %s (arch %s)\n", family->description.c_str(), family->arch.c_str());
  if (!config.is_null()) std::printf("config: %s\n", config.dump().c_str());
  std::printf("%-*s  %-5s  %-16s  %s\n", (int)width, "name", "dtype", "shape", "elements");
  for (auto& [name, t] : f.tensors)
    std::printf("%-*s  %-5s  %-16s  %lld\n", (int)width, name.c_str(), dtype_name(t.dtype()),
                shape_str(t.shape()).c_str(), (long long)t.numel());
  std::printf("%zu tensors, %lld parameters\n", f.tensors.size(), (long long)total);
  for (auto& [k, v] : f.metadata) std::printf("metadata %s = %s\n", k.c_str(), v.c_str());
  return 0;
}

}  // namespace

Run add_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* sub = app.add_subcommand("inspect", "Show the tensors of a .safetensors file or a model folder");
  sub->add_option("path", args->path, "FILE.safetensors or MODEL_DIR")->required();
  sub->add_flag("--json", args->json, "Print one JSON object instead of a table");
  return [args] { return run_inspect(*args); };
}

}  // namespace qkv::cli
