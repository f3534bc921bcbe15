// config.json and tokenizer.json text: every family's model config, the
// trainers' options, the tokenizer config and the char tokenizer's vocabulary.
// Parsing only: a config that parses is within qkv's size limits, but a model
// at those limits is more than a fuzzer's memory.
#include "qkv/conv_seq2seq.h"
#include "qkv/lm.h"
#include "qkv/lm_trainer.h"
#include "qkv/models.h"
#include "qkv/registry.h"
#include "qkv/tokenizer.h"
#include "qkv/trainer.h"
#include "qkv/vit.h"
#include "qkv/vit_trainer.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = qkv::fuzz::as_string(data, size);
  using qkv::fuzz::expect_clean;
  expect_clean([&] { qkv::family_of_config(text, "config.json"); });
  expect_clean([&] {  // a Hugging Face config.json, as the decoder family imports it, then reads the result
    const qkv::HfImport hf = qkv::find_family("decoder", "c").import_hf(text, "config.json");
    qkv::DecoderConfig::from_json(hf.config_json, "config.json");
  });
  for (const qkv::Family& f : qkv::families())  // every family's import of a Hugging Face config
    if (f.from_hf) expect_clean([&] { f.import_hf(text, "config.json"); });
  expect_clean([&] { qkv::TransformerConfig::from_json(text, "config.json"); });
  expect_clean([&] { qkv::RnnAttentionConfig::from_json(text, "config.json"); });
  expect_clean([&] { qkv::ConvSeq2SeqConfig::from_json(text, "config.json"); });
  expect_clean([&] { qkv::DecoderConfig::from_json(text, "config.json"); });
  expect_clean([&] { qkv::ViTConfig::from_json(text, "config.json"); });
  expect_clean([&] { qkv::TrainOptions::from_json(text, "config.json"); });
  expect_clean([&] { qkv::LmTrainOptions::from_json(text, "config.json"); });
  expect_clean([&] { qkv::VitTrainOptions::from_json(text, "config.json"); });
  expect_clean([&] { qkv::TokenizerConfig::from_json(text, "config.json"); });
  expect_clean([&] {
    qkv::CharTokenizer tok = qkv::CharTokenizer::from_json(text, "tokenizer.json");
    // What loads must save and load again to the same vocabulary.
    qkv::CharTokenizer back = qkv::CharTokenizer::from_json(tok.to_json(), "again");
    if (back.size() != tok.size()) std::abort();
  });
  return 0;
}
