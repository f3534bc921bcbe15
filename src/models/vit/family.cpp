// The "vit" family: the Vision Transformer.
#include "qkv/vit.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family vit() {
  return {.arch = "vit",
          .description = "a Vision Transformer",
          .domain = Domain::Vision,
          .tasks = {Task::Classify, Task::Eval},
          .build = [](const std::string& config, const std::string& source,
                      Rng& rng) -> std::shared_ptr<Module> {
            return std::make_shared<VisionTransformer>(ViTConfig::from_json(config, source), rng);
          },
          .config_json = [](const Module& m) { return dynamic_cast<const VisionTransformer&>(m).config().to_json(); }};
}

}  // namespace qkv::builtin
