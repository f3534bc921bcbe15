// A chat template (tokenizer_config.json's chat_template, chat_template.jinja
// of a model folder): parsed, then rendered for a small conversation with
// tools, as qkv serve renders it. A bad template is one qkv::Error, however
// it is bad; rendering stays within the interpreter's bounds.
#include "qkv/jinja.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = qkv::fuzz::as_string(data, size);
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": " Be brief.\n"}, {"role": "user", "content": "我是中国人"},
                 {"role": "assistant", "content": "私は中国人です"}, {"role": "user", "content": "Why?"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true})");
  qkv::fuzz::expect_clean([&] { qkv::jinja::Template(text).render(context); });
  return 0;
}
