// The "transformer" family: the encoder-decoder Transformer for translation.
#include "qkv/models.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family transformer() {
  Family f = family_of<TranslationTransformer, TransformerConfig>("transformer", "a translation Transformer",
                                                                  Domain::Translation, {Task::Translate, Task::Eval});
  f.hf_architectures = {"MarianMTModel"};
  f.from_hf = import_hf_marian;  // hf_import.cpp
  return f;
}

}  // namespace qkv::builtin
