// The "decoder" family: the decoder-only language model.
#include "qkv/lm.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family decoder() {
  return {.arch = "decoder",
          .description = "a decoder-only language model",
          .domain = Domain::Language,
          .tasks = {Task::Generate, Task::Eval},
          .build = [](const std::string& config, const std::string& source,
                      Rng& rng) -> std::shared_ptr<Module> {
            return std::make_shared<DecoderLM>(DecoderConfig::from_json(config, source), rng);
          },
          .config_json = [](const Module& m) { return dynamic_cast<const DecoderLM&>(m).config().to_json(); }};
}

}  // namespace qkv::builtin
