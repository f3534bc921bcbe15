// The "decoder" family: the decoder-only language model.
#include "qkv/lm.h"
#include "src/models/families.h"

namespace qkv::builtin {

Family decoder() {
  Family f = family_of<DecoderLM, DecoderConfig>("decoder", "a decoder-only language model", Domain::Language,
                                                 {Task::Generate, Task::Eval});
  f.hf_architectures = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                        "MixtralForCausalLM", "GPT2LMHeadModel"};
  f.from_hf = import_hf_causal_lm;  // hf_import.cpp
  return f;
}

}  // namespace qkv::builtin
