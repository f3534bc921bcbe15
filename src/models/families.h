// Internal: the built-in model families, one per folder of src/models/, each
// defined in its folder's family.cpp and listed once in src/models/registry.cpp.
#pragma once

#include <new>

#include "qkv/allocator.h"
#include "qkv/registry.h"

namespace qkv::builtin {

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
            try {
              return std::make_shared<Model>(c, rng);
            } catch (const std::bad_alloc&) {
              fail(source, ": the model this config describes does not fit in memory (qkv may use ",
                   memory_limit() >> 20, " MiB here)");
            }
          },
          .config_json = [](const Module& m) { return dynamic_cast<const Model&>(m).config().to_json(); }};
}

Family transformer();
Family rnn_attention();
Family conv();
Family decoder();
Family vit();

}  // namespace qkv::builtin
