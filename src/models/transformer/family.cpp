// The "transformer" family: the encoder-decoder Transformer for translation.
#include "qkv/models.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family transformer() {
  return family_of<TranslationTransformer, TransformerConfig>("transformer", "a translation Transformer",
                                                              Domain::Translation, {Task::Translate, Task::Eval});
}

}  // namespace qkv::builtin
