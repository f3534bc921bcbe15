// The "rnn_attention" family: the GRU encoder-decoder with additive attention.
#include "qkv/models.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family rnn_attention() {
  return {.arch = "rnn_attention",
          .description = "an RNN encoder-decoder with attention",
          .domain = Domain::Translation,
          .tasks = {Task::Translate, Task::Eval},
          .build = [](const std::string& config, const std::string& source,
                      Rng& rng) -> std::shared_ptr<Module> {
            return std::make_shared<RnnAttention>(RnnAttentionConfig::from_json(config, source), rng);
          },
          .config_json = [](const Module& m) { return dynamic_cast<const RnnAttention&>(m).config_json(); }};
}

}  // namespace qkv::builtin
