// The "conv" family: the convolutional sequence-to-sequence model.
#include "qkv/conv_seq2seq.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family conv() {
  return family_of<ConvSeq2Seq, ConvSeq2SeqConfig>("conv", "a convolutional translation model",
                                                   Domain::Translation, {Task::Translate, Task::Eval});
}

}  // namespace qkv::builtin
