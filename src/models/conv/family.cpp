// The "conv" family: the convolutional sequence-to-sequence model.
#include "qkv/conv_seq2seq.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family conv() {
  return {.arch = "conv",
          .description = "a convolutional translation model",
          .domain = Domain::Translation,
          .tasks = {Task::Translate, Task::Eval},
          .build = [](const std::string& config, const std::string& source,
                      Rng& rng) -> std::shared_ptr<Module> {
            return std::make_shared<ConvSeq2Seq>(ConvSeq2SeqConfig::from_json(config, source), rng);
          },
          .config_json = [](const Module& m) { return dynamic_cast<const ConvSeq2Seq&>(m).config_json(); }};
}

}  // namespace qkv::builtin
