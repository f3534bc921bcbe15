// The Vision Transformer: forward and every gradient against a plain PyTorch
// reference with the same weights (scripts/make_fixtures.py ->
// tests/fixtures/vit_golden.safetensors); the IDX reader on good, gzipped and
// broken files; batches and augmentation; rollout; the training loop and the
// model folder on a tiny synthetic task.
#include <omp.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "qkv/vit_trainer.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::all_close;

const std::map<std::string, Tensor>& golden() {
  return testing::fixture_tensors("vit_golden.safetensors");
}

class VitGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(VitGolden, ForwardAndGradientsMatchPyTorch) {
  const std::string c = GetParam();
  const bool cls = c == "vit_cls_sin2d";
  ViTConfig config;
  config.image_size = 12, config.patch_size = 4, config.channels = cls ? 3 : 1, config.d_model = 16;
  config.nhead = 4, config.num_layers = 2, config.mlp_ratio = 2, config.num_classes = 5, config.dropout = 0;
  config.pool = cls ? Pool::Cls : Pool::Mean;
  config.positions = cls ? PositionKind::Sinusoidal2d : PositionKind::Learned;
  Rng rng(0);
  VisionTransformer model(config, rng);
  StateDict params;
  const std::string prefix = c + ".param.";
  for (auto& [k, v] : golden())
    if (k.rfind(prefix, 0) == 0) params[k.substr(prefix.size())] = v;
  model.load_state_dict(params);  // every parameter, no extra: load_state_dict checks both ways
  Tensor images = golden().at(c + ".images").clone().set_requires_grad(true);
  // The float32 rounding bound (tests/test_util.h) for 2 layers; the longest
  // sum is a flattened patch or the MLP width.
  const int64_t terms = testing::largest_dim({images}, params);
  const testing::Float32Bound fwd = testing::model_forward(terms, 2), bwd = testing::model_backward(terms, 2);
  Tensor out = model.forward(images);
  EXPECT_TRUE(testing::float32_close(out, golden().at(c + ".out"), fwd)) << c << " forward";
  sum(mul(out, golden().at(c + ".r"))).backward();
  EXPECT_TRUE(testing::float32_close(images.grad(), golden().at(c + ".grad.images"), bwd)) << c << " image gradient";
  int checked = 0;
  for (auto& [name, p] : model.named_parameters()) {
    auto it = golden().find(c + ".pgrad." + name);
    ASSERT_NE(it, golden().end()) << c << ": no reference gradient for " << name;
    EXPECT_TRUE(testing::float32_close(p.grad(), it->second, bwd)) << c << " gradient of " << name;
    ++checked;
  }
  EXPECT_EQ(checked, (int)params.size());
  EXPECT_GT(checked, 20);
}

INSTANTIATE_TEST_SUITE_P(PyTorch, VitGolden, ::testing::Values("vit_mean_learned", "vit_cls_sin2d"));

// IDX bytes: header then data.
std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data, uint8_t type = 0x08) {
  std::string s = {0, 0, (char)type, (char)dims.size()};
  for (uint32_t d : dims) s += {(char)(d >> 24), (char)(d >> 16), (char)(d >> 8), (char)d};
  s.append(data.begin(), data.end());
  return s;
}

std::string gzip(const std::string& raw) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, raw.size()) + 64, '\0');
  z.next_in = (Bytef*)raw.data(), z.avail_in = (uInt)raw.size();
  z.next_out = (Bytef*)out.data(), z.avail_out = (uInt)out.size();
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(Idx, ReadsPlainAndGzippedFilesAndRejectsBrokenOnes) {
  const std::string d = testing::temp_dir("vit");
  std::vector<uint8_t> pixels(2 * 3 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = (uint8_t)(i * 10);
  write(d + "/train-images-idx3-ubyte", idx_bytes({2, 3, 4}, pixels));
  write(d + "/train-labels-idx1-ubyte.gz", gzip(idx_bytes({2}, {7, 1})));
  ImageSet s = load_idx_folder(d, "train");
  EXPECT_EQ(s.count, 2);
  EXPECT_EQ(s.height, 3);
  EXPECT_EQ(s.width, 4);
  EXPECT_EQ(s.pixels, pixels);
  EXPECT_EQ(s.labels, (std::vector<int64_t>{7, 1}));

  auto expect_error = [&](const std::string& images, const std::string& labels, const std::string& message) {
    write(d + "/i", images);
    write(d + "/l", labels);
    try {
      load_idx(d + "/i", d + "/l");
      ADD_FAILURE() << "loaded; expected: " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  const std::string good_labels = idx_bytes({2}, {7, 1});
  expect_error("\x01\x02\x08\x03", good_labels, "/i: not an IDX file");
  expect_error(idx_bytes({2, 3, 4}, pixels, 0x0d), good_labels, "is not unsigned bytes");
  expect_error(idx_bytes({2, 3, 4}, {pixels.begin(), pixels.end() - 1}), good_labels, "/i: truncated");
  expect_error(idx_bytes({2, 12}, pixels), good_labels, "/i: expected an IDX file of 3 dimensions");
  expect_error(idx_bytes({2, 3, 4}, pixels) + "x", good_labels, "/i: 1 bytes after the data");
  expect_error(idx_bytes({2, 3, 4}, pixels), idx_bytes({3}, {1, 2, 3}), "has 2 images but");
  expect_error(idx_bytes({2, 3, 4}, pixels), gzip(good_labels).substr(0, 12), "/l: ");  // truncated gzip
  expect_error(idx_bytes({2, 3, 4}, pixels), gzip(good_labels) + "junk", "/l: bytes after the end of the gzip data");
  // A header of one 46000 x 46000 image is refused before any data is read
  // (it was inflated whole, 4.4 GB, and checked after).
  expect_error(gzip(idx_bytes({1, 46000, 46000}, {})), good_labels, "/i: images of 46000 x 46000 pixels, more than");
  // A header that promises far more than the file holds costs only the file.
  expect_error(gzip(idx_bytes({100000, 1000, 1000}, pixels)), good_labels, "/i: truncated: the header promises");
  expect_error("", good_labels, "/i: too short");
  EXPECT_THROW(load_idx_folder(d + "/nope", "train"), Error);
  EXPECT_THROW(load_idx_folder(d, "t10k"), Error);  // no test files there
  std::filesystem::remove_all(d);
}

ImageSet stripes(int64_t count, uint64_t seed) {
  // Two classes of 8x8 images: a bright row (class 0) or a bright column (class 1), at a random place.
  ImageSet s;
  s.count = count, s.channels = 1, s.height = 8, s.width = 8;
  Rng rng(seed);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t label = (int64_t)rng.next_below(2), at = (int64_t)rng.next_below(8);
    for (int64_t y = 0; y < 8; ++y)
      for (int64_t x = 0; x < 8; ++x) s.pixels.push_back((label == 0 ? y : x) == at ? 255 : 20);
    s.labels.push_back(label);
  }
  return s;
}

float plain_value(const ImageSet& s, int64_t i, int64_t y, int64_t x) {
  return pixel_to_input(s.image(i)[y * s.width + x]);
}

TEST(ImageBatch, NormalizesCropsAndFlipsReproducibly) {
  ImageSet s = stripes(4, 1);
  Tensor plain = image_batch(s, {2, 0});
  EXPECT_EQ(plain.shape(), (Shape{2, 1, 8, 8}));
  EXPECT_FLOAT_EQ(plain.data<float>()[0], pixel_to_input(s.image(2)[0]));
  EXPECT_FLOAT_EQ(pixel_to_input(0), -1.0f);
  EXPECT_FLOAT_EQ(pixel_to_input(255), 1.0f);
  Rng a(5), b(5);
  Tensor x = image_batch(s, {0, 1, 2, 3}, {.pad = 2, .flip = true}, &a);
  Tensor y = image_batch(s, {0, 1, 2, 3}, {.pad = 2, .flip = true}, &b);
  EXPECT_EQ(x.to_vector(), y.to_vector());  // the same draws
  // A flip alone mirrors each image or leaves it, and mirrors some.
  ImageSet many = stripes(16, 1);
  std::vector<int64_t> all(16);
  for (int64_t i = 0; i < 16; ++i) all[i] = i;
  Rng f(9);
  Tensor flipped = image_batch(many, all, {.pad = 0, .flip = true}, &f);
  int mirrored = 0;
  for (int64_t i = 0; i < 16; ++i) {
    bool same = true, mirror = true;
    for (int64_t yy = 0; yy < 8; ++yy)
      for (int64_t xx = 0; xx < 8; ++xx) {
        float v = flipped.data<float>()[(i * 8 + yy) * 8 + xx];
        same &= v == plain_value(many, i, yy, xx);
        mirror &= v == plain_value(many, i, yy, 7 - xx);
      }
    EXPECT_TRUE(same || mirror) << i;
    mirrored += mirror && !same;
  }
  EXPECT_GT(mirrored, 0);
  // A crop shifts the image and fills with zeros (-1 after normalization).
  Rng c(3);
  Tensor cropped = image_batch(s, {0, 1, 2, 3}, {.pad = 3, .flip = false}, &c);
  int padded = 0;
  for (float v : cropped.to_vector()) padded += v == -1.0f;
  EXPECT_GT(padded, 0);
}

ViTConfig tiny_config() {
  ViTConfig c;
  c.image_size = 8, c.patch_size = 2, c.channels = 1, c.d_model = 16, c.nhead = 2, c.num_layers = 2;
  c.mlp_ratio = 2, c.num_classes = 2, c.dropout = 0.1f, c.class_names = {"row", "column"};
  return c;
}

VitTrainOptions tiny_options(int64_t epochs) {
  VitTrainOptions o;
  o.epochs = epochs, o.batch_size = 32, o.lr = 3e-3f, o.warmup_steps = 5;
  o.augment_flip = true, o.augment_pad = 1;
  return o;
}

TEST(VitTraining, LearnsStripesKeepsTheBestAndResumesExactly) {
  omp_set_num_threads(1);
  ImageSet train = stripes(640, 1), test = stripes(200, 2);
  const std::string straight = testing::temp_dir("vit"), halves = testing::temp_dir("vit");
  Rng r1(4);
  VisionTransformer a(tiny_config(), r1);
  std::vector<VitEpochReport> reports;
  train_vit(a, train, test, tiny_options(4), straight, {.epoch_done = [&](const VitEpochReport& r) { reports.push_back(r); }});
  ASSERT_EQ(reports.size(), 4u);
  EXPECT_GT(reports.back().test_accuracy, 0.9) << "a row or a column is easy";
  std::shared_ptr<VisionTransformer> loaded = load_vit_model(straight);
  double best = 0;
  for (auto& r : reports) best = std::max(best, r.test_accuracy);
  EXPECT_DOUBLE_EQ(evaluate_vit(*loaded, test).accuracy, best);  // the folder holds the best epoch
  nlohmann::json state = nlohmann::json::parse(read_file(straight + "/trainer_state.json"));
  EXPECT_EQ(state["history"].size(), 4u);

  // A run killed after two of its four epochs (the callback throws after the
  // checkpoint is written), then resumed: the same weights bit for bit.
  Rng r2(4);
  VisionTransformer b(tiny_config(), r2);
  struct Killed {};
  try {
    train_vit(b, train, test, tiny_options(4), halves, {.epoch_done = [](const VitEpochReport& r) {
                if (r.epoch == 2) throw Killed{};
              }});
    FAIL() << "the run was not stopped";
  } catch (const Killed&) {
  }
  std::shared_ptr<VisionTransformer> resumed = load_vit_model(halves);
  resumed->train();
  VitTrainOptions o = tiny_options(4);
  o.resume = true;
  train_vit(*resumed, train, test, o, halves, {});
  auto sa = load_safetensors(straight + "/trainer_state.safetensors").as_map();
  auto sb = load_safetensors(halves + "/trainer_state.safetensors").as_map();
  ASSERT_EQ(sa.size(), sb.size());
  for (auto& [name, t] : sa) EXPECT_EQ(t.to_vector(), sb.at(name).to_vector()) << name;
  EXPECT_THROW(train_vit(*resumed, train, test, o, halves, {}), Error);  // nothing left to do
  std::filesystem::remove_all(straight);
  std::filesystem::remove_all(halves);
}

TEST(VitRollout, IsADistributionOverPatches) {
  Rng rng(2);
  ViTConfig c = tiny_config();
  VisionTransformer model(c, rng);
  model.eval();
  NoGradGuard no_grad;
  Tensor logits = model.forward(image_batch(stripes(3, 5), {0, 1, 2}), /*need_weights=*/true);
  EXPECT_EQ(logits.shape(), (Shape{3, 2}));
  Tensor r = model.rollout();
  ASSERT_EQ(r.shape(), (Shape{3, 4, 4}));
  for (int64_t b = 0; b < 3; ++b) {
    double total = 0;
    for (int64_t i = 0; i < 16; ++i) {
      float v = r.data<float>()[b * 16 + i];
      EXPECT_GE(v, 0.0f);
      total += v;
    }
    EXPECT_NEAR(total, 1.0, 1e-5);  // rows of a product of row-stochastic matrices, averaged
  }
  // The weights path and the flash path give the same logits.
  Tensor flash = model.forward(image_batch(stripes(3, 5), {0, 1, 2}));
  EXPECT_TRUE(all_close(flash, logits, 1e-5f, 1e-4f));
}

TEST(VitConfig, RejectsNonsense) {
  for (const char* bad : {R"({"arch": "vit", "image_size": 28, "patch_size": 5})", R"({"arch": "vit", "d_model": 30, "nhead": 4})",
                          R"({"arch": "vit", "pool": "max"})", R"({"arch": "vit", "num_classes": 3, "class_names": ["a"]})",
                          R"({"arch": "vit", "patch": 4})", R"({"arch": "vit", "channels": 2})", R"({"arch": "vit", "dropout": 1.5})",
                          R"({"arch": "vit", "image_size": 2147483648, "patch_size": 1})",
                          R"({"arch": "vit", "image_size": 4611686018427387904, "patch_size": 2305843009213693952})"}) {
    EXPECT_THROW(ViTConfig::from_json(bad, "c"), Error) << bad;
  }
  ViTConfig c = ViTConfig::from_json(R"({"arch": "vit", "num_classes": 3})", "c");
  EXPECT_EQ(c.class_names, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(ViTConfig::from_json(c.to_json(), "again").to_json(), c.to_json());
}

}  // namespace
}  // namespace qkv
