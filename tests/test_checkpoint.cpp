// Model folders written before the redesign of issue 14 (tests/fixtures/folders,
// one per family, written by qkv at commit 0d3f9a4) still load, and compute the
// logits that the code of that commit computed from them (expected.safetensors
// in each folder; tests/fixtures/folders/README.md says how they were made).
#include <filesystem>

#include "qkv/io.h"
#include "qkv/lm_trainer.h"
#include "qkv/trainer.h"
#include "qkv/vit_trainer.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

std::string folder(const std::string& family) { return std::string(QKV_FIXTURES_DIR) + "/folders/" + family; }

std::map<std::string, Tensor> expected(const std::string& family) {
  return load_safetensors(folder(family) + "/expected.safetensors").as_map();
}

// Same weights, same inputs, perhaps another CPU's kernels: float32 rounding
// apart. A misread config (another norm, position or MLP kind) moves these
// logits by 1e-2 or more.
constexpr float kAtol = 2e-5f, kRtol = 2e-4f;

class LegacyTranslationFolder : public ::testing::TestWithParam<std::string> {};

TEST_P(LegacyTranslationFolder, LoadsAndComputesTheSameLogits) {
  const std::string family = GetParam();
  TranslationModel m = load_translation_model(folder(family));
  m.model->eval();
  auto e = expected(family);
  NoGradGuard no_grad;
  Tensor logits = m.model->forward(e.at("src"), e.at("src_lengths"), e.at("tgt_in"));
  EXPECT_TRUE(testing::all_close(logits, e.at("logits"), kAtol, kRtol)) << family;
}

INSTANTIATE_TEST_SUITE_P(Families, LegacyTranslationFolder, ::testing::Values("transformer", "rnn_attention", "conv"));

TEST(LegacyFolder, DecoderLoadsAndComputesTheSameLogits) {
  LanguageModel m = load_language_model(folder("decoder"));
  m.model->eval();
  auto e = expected("decoder");
  NoGradGuard no_grad;
  EXPECT_TRUE(testing::all_close(m.model->forward(e.at("ids")), e.at("logits"), kAtol, kRtol));
}

TEST(LegacyFolder, VitLoadsAndComputesTheSameLogits) {
  auto model = load_vit_model(folder("vit"));
  model->eval();
  auto e = expected("vit");
  NoGradGuard no_grad;
  EXPECT_TRUE(testing::all_close(model->forward(e.at("images")), e.at("logits"), kAtol, kRtol));
  EXPECT_EQ(model->config().class_names, (std::vector<std::string>{"dark", "light"}));
}

}  // namespace
}  // namespace qkv
