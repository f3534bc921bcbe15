// The "rnn_attention" family: the GRU encoder-decoder with additive attention.
#include "qkv/models.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family rnn_attention() {
  return family_of<RnnAttention, RnnAttentionConfig>("rnn_attention", "an RNN encoder-decoder with attention",
                                                     Domain::Translation, {Task::Translate, Task::Eval});
}

}  // namespace qkv::builtin
