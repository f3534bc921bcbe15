// A Hugging Face ViTForImageClassification folder (tests/fixtures/hf/vit,
// from scripts/make_hf_fixtures.py) as a qkv vit: the logits of the pixels
// ViTImageProcessor made match transformers' to 1e-4, and so do those of the
// same two PNG files read and normalized by qkv; the top classes are the same,
// named by id2label; other processor normalizations fold into the patch
// embedding; pictures of other sizes are resized and centre-cropped as the
// processor (Pillow) does it, to the byte; a preprocessing or option qkv does
// not implement is one error naming the field.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "qkv/infer.h"
#include "qkv/io.h"
#include "qkv/vision.h"
#include "qkv/vit.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::error_of;

std::string vit_fixture(const std::string& name) { return std::string(QKV_FIXTURES_DIR) + "/hf/" + name; }

// The fixture's two 16x16 PNG files, read by qkv.
ImageSet fixture_images() {
  ImageSet set;
  set.channels = 3, set.height = 16, set.width = 16;
  for (const char* f : {"vit.image0.png", "vit.image1.png"}) {
    const std::vector<uint8_t> im = read_image(vit_fixture(f), 3, 16);
    set.pixels.insert(set.pixels.end(), im.begin(), im.end());
    ++set.count;
  }
  return set;
}

TEST(HfVit, LogitsMatchTransformersFromItsPixelsAndFromTheFiles) {
  std::shared_ptr<VisionTransformer> m = load_vit_model(vit_fixture("vit"));
  const ViTConfig& c = m->config();
  EXPECT_EQ(c.class_names, (std::vector<std::string>{"cat", "dog", "bird", "fish", "frog"}));
  EXPECT_EQ(c.pool, Pool::Cls);
  EXPECT_EQ(c.qkv_layout, QkvLayout::Separate);
  SafetensorsFile expected = load_safetensors(vit_fixture("vit.expected.safetensors"));
  const Tensor& logits = *expected.find("logits");
  NoGradGuard no_grad;
  EXPECT_TRUE(testing::all_close(m->forward(*expected.find("pixels")), logits, 1e-4f, 1e-4f));
  const Tensor ours = m->forward(image_batch(fixture_images(), {0, 1}));
  EXPECT_TRUE(testing::all_close(ours, logits, 1e-4f, 1e-4f));
  for (int64_t b = 0; b < 2; ++b) {  // the same classes in the same order
    std::vector<int64_t> a(5), t(5);
    for (int64_t k = 0; k < 5; ++k) a[k] = k, t[k] = k;
    const float *x = ours.data<float>() + b * 5, *y = logits.contiguous().data<float>() + b * 5;
    std::sort(a.begin(), a.end(), [&](int64_t i, int64_t j) { return x[i] > x[j]; });
    std::sort(t.begin(), t.end(), [&](int64_t i, int64_t j) { return y[i] > y[j]; });
    EXPECT_EQ(a, t) << "image " << b;
  }
}

// The same folder under other processors: ImageNet's mean and std per
// channel, and no normalization. qkv folds the processor's normalization
// into the patch embedding as it loads (its inputs stay (p/255 - 0.5)/0.5);
// the logits of the PNG files are transformers' to 1e-4, and are not those of
// the 0.5 processor.
TEST(HfVit, OtherPixelNormalizationsFoldIntoThePatchEmbedding) {
  const std::string dir = testing::temp_dir("hfvit");
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(vit_fixture(std::string("vit/") + f), dir + "/" + f);
  const ImageSet set = fixture_images();
  SafetensorsFile expected = load_safetensors(vit_fixture("vit.processors.expected.safetensors"));
  const Tensor plain_logits = *load_safetensors(vit_fixture("vit.expected.safetensors")).find("logits");
  NoGradGuard no_grad;
  for (const auto& [processor, name] :
       {std::pair{nlohmann::json{{"image_mean", {0.485, 0.456, 0.406}}, {"image_std", {0.229, 0.224, 0.225}}},
                  "logits_imagenet"},
        std::pair{nlohmann::json{{"do_normalize", false}}, "logits_unnormalized"}}) {
    nlohmann::json p = nlohmann::json::parse(read_file(vit_fixture("vit/preprocessor_config.json")));
    p.merge_patch(processor);
    write_file_atomic(dir + "/preprocessor_config.json", p.dump());
    const Tensor ours = load_vit_model(dir)->forward(image_batch(set, {0, 1}));
    EXPECT_TRUE(testing::all_close(ours, *expected.find(name), 1e-4f, 1e-4f)) << name;
    EXPECT_FALSE(testing::all_close(ours, plain_logits, 1e-4f, 1e-4f)) << name;
  }
}

TEST(HfVit, WhatQkvDoesNotImplementIsOneErrorNamingTheField) {
  const std::string dir = testing::temp_dir("hfvit");
  for (const char* f : {"config.json", "model.safetensors", "preprocessor_config.json"})
    std::filesystem::copy_file(vit_fixture(std::string("vit/") + f), dir + "/" + f);
  auto with = [&](const char* file, const nlohmann::json& changes) {
    nlohmann::json j = nlohmann::json::parse(read_file(vit_fixture(std::string("vit/") + file)));
    j.merge_patch(changes);
    write_file_atomic(dir + "/" + file, j.dump());
    const std::string e = error_of([&] { load_vit_model(dir); });
    write_file_atomic(dir + "/" + file, read_file(vit_fixture(std::string("vit/") + file)));
    return e;
  };
  EXPECT_EQ(with("preprocessor_config.json", {{"do_center_crop", true}, {"crop_size", {{"height", 12}, {"width", 12}}}}),
            dir + "/preprocessor_config.json: \"crop_size\" 12 differs from the model's image_size 16");
  EXPECT_EQ(with("preprocessor_config.json", {{"resample", 1}}),
            dir + "/preprocessor_config.json: \"resample\": 1 is not supported yet (a different model would run)");
  EXPECT_EQ(with("preprocessor_config.json", {{"size", {{"height", 20}, {"width", 24}}}}),
            dir + "/preprocessor_config.json: \"size\" {\"height\":20,\"width\":24} is not square");
  EXPECT_EQ(with("preprocessor_config.json", {{"image_std", {0.5, 0.5}}}),
            dir + "/preprocessor_config.json: \"image_std\" [0.5,0.5] must be one number or one per channel (3)");
  EXPECT_EQ(with("preprocessor_config.json", {{"size", {{"height", 32}, {"width", 32}}}}),
            dir + "/preprocessor_config.json: \"size\" {\"height\":32,\"width\":32} differs from the model's "
                  "image_size 16");
  EXPECT_EQ(with("config.json", {{"hidden_act", "gelu_new"}}),
            dir + "/config.json: \"hidden_act\": \"gelu_new\" is not supported yet (a different model would run)");
  EXPECT_EQ(with("config.json", {{"id2label", {{"7", "newt"}}}}),  // six names, one of them numbered 7
            dir + "/config.json: id2label: '7' is not one of the ids 0 to 5 with a name");
  EXPECT_NO_THROW(load_vit_model(dir));  // the files are back as they were
}

// A picture of another size (45x31) resized as Pillow resizes it, to the
// byte: bilinear and bicubic, shrinking (to 16, the filter widened by the
// scale) and enlarging (to 80, where bicubic overshoots at the white band and
// clips); and as a DeiT processor makes it (bicubic to 20, the centre 16),
// which a folder's preprocessor_config.json with a centre crop now asks for.
// Without the filter widened when shrinking, the 16-pixel cases and the DeiT
// one fail (mutation tried).
TEST(HfVit, PicturesAreResizedAndCroppedAsPillowAndTheProcessorDoThem) {
  const std::string png = read_file(vit_fixture("vit.resize.png"));
  SafetensorsFile expected = load_safetensors(vit_fixture("vit.resize.expected.safetensors"));
  auto as_hwc = [](const std::vector<uint8_t>& chw, int64_t size) {  // qkv's C x H x W as Pillow's H x W x C
    std::vector<int64_t> out((size_t)(3 * size * size));
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < size * size; ++i) out[(size_t)(i * 3 + c)] = chw[(size_t)(c * size * size + i)];
    return out;
  };
  for (const auto& [name, resample] : {std::pair<std::string, Resample>{"bilinear", Resample::Bilinear},
                                       {"bicubic", Resample::Bicubic}})
    for (int64_t size : {16, 80}) {
      const std::string key = name + "_" + std::to_string(size);
      const std::vector<uint8_t> ours = decode_image(png, "vit.resize.png", 3, {.size = size, .resample = resample});
      EXPECT_EQ(as_hwc(ours, size), expected.find(key)->to(DType::I64).to_ints()) << key;
    }
  // The fixture model read under a DeiT processor.
  const std::string dir = testing::temp_dir("hfvit");
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(vit_fixture(std::string("vit/") + f), dir + "/" + f);
  nlohmann::json p = nlohmann::json::parse(read_file(vit_fixture("vit/preprocessor_config.json")));
  p.merge_patch({{"do_center_crop", true}, {"crop_size", {{"height", 16}, {"width", 16}}},
                 {"size", {{"height", 20}, {"width", 20}}}, {"resample", 3}});
  write_file_atomic(dir + "/preprocessor_config.json", p.dump());
  const ViTConfig c = load_vit_model(dir)->config();
  EXPECT_EQ(c.resize_to, 20);
  EXPECT_EQ(c.resample, Resample::Bicubic);
  EXPECT_EQ(as_hwc(decode_image(png, "vit.resize.png", 3, c.image_resize()), 16),
            expected.find("deit")->to(DType::I64).to_ints());
  const ViTConfig back = ViTConfig::from_json(c.to_json(), "config.json");  // a qkv folder keeps them
  EXPECT_EQ(back.resize_to, 20);
  EXPECT_EQ(back.resample, Resample::Bicubic);
}

}  // namespace
}  // namespace qkv
