// The "vit" family: the Vision Transformer.
#include "qkv/vit.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family vit() {
  return family_of<VisionTransformer, ViTConfig>("vit", "a Vision Transformer",
                                                 Domain::Vision, {Task::Classify, Task::Eval});
}

}  // namespace qkv::builtin
