// Every recipe shipped in configs/ is read by the readers `qkv train` uses for
// its arch (model and "train" options, and the tokenizer where one is named),
// so a recipe the docs point to never fails on a typo or a renamed key.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "qkv/lm.h"
#include "qkv/lm_trainer.h"
#include "qkv/models.h"
#include "qkv/tokenizer.h"
#include "qkv/trainer.h"
#include "qkv/vit.h"
#include "qkv/vit_trainer.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

TEST(Configs, EveryShippedRecipeParses) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(QKV_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".json") continue;
    const std::string path = entry.path().string(), text = read_file(path);
    const nlohmann::json j = nlohmann::json::parse(text);
    const std::string arch = j.value("arch", "transformer");
    SCOPED_TRACE(path);
    if (arch == "decoder") {
      EXPECT_NO_THROW(DecoderConfig::from_json(text, path));
      EXPECT_NO_THROW(LmTrainOptions::from_json(text, path));
    } else if (arch == "vit") {
      EXPECT_NO_THROW(ViTConfig::from_json(text, path));
      EXPECT_NO_THROW(VitTrainOptions::from_json(text, path));
    } else {  // the translation archs: the model part as new_translation_model passes it on
      nlohmann::json model = j;
      model.erase("train");
      model.erase("tokenizer");
      Rng rng(1);
      EXPECT_NO_THROW(make_seq2seq(model.dump(), path, 40, rng));
      EXPECT_NO_THROW(TrainOptions::from_json(text, path));
    }
    if (j.contains("tokenizer")) {
      EXPECT_NO_THROW(TokenizerConfig::from_json(j["tokenizer"].dump(), path));
    }
    ++checked;
  }
  EXPECT_GE(checked, 9);  // the recipes of the docs: translation x4, lm x4, vit
}

}  // namespace
}  // namespace qkv
