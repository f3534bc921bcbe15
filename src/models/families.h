// Internal: the built-in model families, one per folder of src/models/, each
// defined in its folder's family.cpp and listed once in src/models/registry.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>

#include "qkv/allocator.h"
#include "qkv/io.h"
#include "qkv/registry.h"
#include "qkv/rng.h"
#include "src/core/json.h"

namespace qkv::builtin {

// Refuses, in a moment, a model whose parameters alone exceed what qkv may
// allocate here: built first on the meta device (shapes, no memory, no
// values), instead of failing after minutes of allocating and initialising
// the part that fits.
template <class Model, class Config>
void require_fits_in_memory(const Config& c, const std::string& source) {
  uint64_t bytes = 0;
  int64_t count = 0;
  {
    DefaultDeviceGuard meta(Device::Meta);
    Rng rng(0);
    const Model sized(c, rng);
    bytes = sized.parameter_bytes();
    count = sized.parameter_count();
  }
  QKV_CHECK(bytes <= memory_limit(), source, ": the model this config describes has ", count, " parameters (",
            format_bytes(bytes), "), more than qkv may use here (", format_bytes(memory_limit()), ")");
}

// The family of a Model built from a Config (Config::from_json, Model(config, rng),
// model.config().to_json()).
template <class Model, class Config>
Family family_of(std::string arch, std::string description, Domain domain, std::vector<Task> tasks) {
  return {.arch = std::move(arch),
          .description = std::move(description),
          .domain = domain,
          .tasks = std::move(tasks),
          .build = [](const std::string& config, const std::string& source, Rng& rng) -> std::shared_ptr<Module> {
            const Config c = Config::from_json(config, source);
            require_fits_in_memory<Model>(c, source);
            try {
              return std::make_shared<Model>(c, rng);
            } catch (const std::bad_alloc&) {
              fail(source, ": the model this config describes does not fit in memory (qkv may use ",
                   format_bytes(memory_limit()), " here)");
            }
          },
          .config_json = [](const Module& m) { return dynamic_cast<const Model&>(m).config().to_json(); }};
}

// A Hugging Face option qkv does not implement: one error naming it (`what`)
// and the file, never a model that computes something else.
[[noreturn]] inline void unsupported(const std::string& source, const std::string& what) {
  fail(source, ": ", what, " is not supported yet (a different model would run)");
}

// A field of a Hugging Face config the import cannot do without: an error
// naming `key` and the file when it is absent or null.
inline nlohmann::json required(const nlohmann::json& j, const char* key, const std::string& source) {
  QKV_CHECK(j.contains(key) && !j[key].is_null(), source, ": '", key, "' is missing");
  return j[key];
}

// The value of `key` in a Hugging Face config, or `fallback` when it is absent or null.
inline nlohmann::json field(const nlohmann::json& j, const char* key, nlohmann::json fallback) {
  return j.contains(key) && !j[key].is_null() ? j[key] : fallback;
}

// A whole number of a Hugging Face config (`v`, read from `key`): an error
// naming the key and the file unless it is an integer from `low` to `high`
// (high >= 0). A float such as 1e30 is refused here, never cast.
inline int64_t whole(const nlohmann::json& v, const char* key, const std::string& source, int64_t low, int64_t high) {
  bool ok = false;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    ok = u <= (uint64_t)high && (low <= 0 || u >= (uint64_t)low);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    ok = i >= low && i <= high;
  }
  QKV_CHECK(ok, source, ": '", key, "' must be a whole number from ", low, " to ", high, ", got ", v.dump());
  return v.get<int64_t>();
}

// A file beside a Hugging Face config.json (the preprocessor's, the
// sentence-transformers modules') as JSON, or null when it is not there.
inline nlohmann::json folder_json(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return nlohmann::json();
  return parse_json(read_file(path.string()), path.string());
}

// The decoder family's reading of Hugging Face causal LM configs (src/models/decoder/hf_import.cpp).
HfImport import_hf_causal_lm(const std::string& config_text, const std::string& source);

// The transformer family's reading of MarianMTModel configs (src/models/transformer/hf_import.cpp).
HfImport import_hf_marian(const std::string& config_text, const std::string& source);

Family transformer();
Family rnn_attention();
Family conv();
Family decoder();
Family vit();
Family encoder();

}  // namespace qkv::builtin
