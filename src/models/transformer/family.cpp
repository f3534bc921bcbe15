// The "transformer" family: the encoder-decoder Transformer for translation.
#include "qkv/models.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family transformer() {
  return {.arch = "transformer",
          .description = "a translation Transformer",
          .domain = Domain::Translation,
          .tasks = {Task::Translate, Task::Eval},
          .build = [](const std::string& config, const std::string& source,
                      Rng& rng) -> std::shared_ptr<Module> {
            return std::make_shared<TranslationTransformer>(TransformerConfig::from_json(config, source), rng);
          },
          .config_json = [](const Module& m) { return dynamic_cast<const TranslationTransformer&>(m).config_json(); }};
}

}  // namespace qkv::builtin
