// The "decoder" family: the decoder-only language model.
#include "qkv/lm.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family decoder() {
  return family_of<DecoderLM, DecoderConfig>("decoder", "a decoder-only language model",
                                             Domain::Language, {Task::Generate, Task::Eval});
}

}  // namespace qkv::builtin
