// A program that runs trained models and links qkv_models only, not the
// trainers (tests/CMakeLists.txt): it would fail to link if inference
// (src/infer, src/checkpoint, src/models) came to need src/train. It loads
// each old-layout folder of tests/fixtures/folders and runs it once.
#include <cstdio>

#include "qkv/checkpoint.h"
#include "qkv/infer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FIXTURES/folders\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  try {
    qkv::TranslationModel t = qkv::load_translation_model(root + "/transformer");
    const std::vector<std::string> out = qkv::translate_texts(t, {"我是中国人"}, 8);
    qkv::LanguageModel lm = qkv::load_language_model(root + "/decoder");
    const std::vector<int64_t> ids = qkv::generate(lm, "私は", {.max_new_tokens = 4, .temperature = 0});
    auto vit = qkv::load_vit_model(root + "/vit");
    qkv::Rng rng(1);
    qkv::Tensor p = qkv::classify_images(*vit, qkv::Tensor::uniform({1, 1, 8, 8}, rng, 0.0f, 1.0f));
    std::printf("translated %zu, generated %zu tokens, %lld class probabilities\n", out.size(), ids.size(),
                (long long)p.numel());
    return out.size() == 1 && p.numel() == 2 ? 0 : 1;
  } catch (const qkv::Error& e) {
    std::fprintf(stderr, "infer_only: %s\n", e.what());
    return 1;
  }
}
