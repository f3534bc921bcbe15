// The Vision Transformer from the command line: qkv train and qkv eval for
// the vit family, and qkv classify.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "qkv/registry.h"
#include "qkv/vit_trainer.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {

namespace {

void show_vit_progress(const VitProgress& p) {
  char stats[128];
  std::snprintf(stats, sizeof stats, "loss %.3f  %.0f img/s  lr %.2e", p.loss, p.images_per_second, p.lr);
  print_progress(p.step, p.total_steps,
                 "epoch " + std::to_string(p.epoch) + "/" + std::to_string(p.epochs) + " step " +
                     std::to_string(p.step) + "/" + std::to_string(p.total_steps),
                 stats, p.eta_seconds, p.skipped_steps, 20);
}

}  // namespace

VitCallbacks vit_train_printers() {
  VitCallbacks cb;
  cb.progress = show_vit_progress;
  cb.epoch_done = [](const VitEpochReport& r) {
    std::printf("%sepoch %lld: train loss %.4f  test accuracy %.4f  (%.0f s)%s\n", isatty(STDOUT_FILENO) ? "\n" : "",
                (long long)r.epoch, r.train_loss, r.test_accuracy, r.seconds, r.best ? "  (best, saved)" : "");
    std::fflush(stdout);
  };
  return cb;
}

int run_vit_eval(const std::string& model_dir, const std::string& test_dir, bool json, const std::string& dtype) {
  std::shared_ptr<VisionTransformer> model = load_vit_model(model_dir, "eval", dtype);
  ImageSet test = load_idx_folder(test_dir, "t10k");
  VitEvaluation e = evaluate_vit(*model, test);
  const ViTConfig& c = model->config();
  const int64_t C = c.num_classes;
  if (json) {
    nlohmann::json confusion = nlohmann::json::array();
    for (int64_t t = 0; t < C; ++t)
      confusion.push_back(std::vector<int64_t>(e.confusion.begin() + t * C, e.confusion.begin() + (t + 1) * C));
    nlohmann::ordered_json r = {{"accuracy", e.accuracy},
                                {"images", e.images},
                                {"classes", c.class_names},
                                {"confusion", confusion}};  // rows: true class, columns: predicted
    std::cout << r.dump() << "\n";
    return 0;
  }
  std::printf("%s on %s (%lld images)\n  accuracy %.4f\n\nconfusion matrix (rows: true class, columns: predicted)\n",
              model_dir.c_str(), test_dir.c_str(), (long long)e.images, e.accuracy);
  std::printf("%14s", "");
  for (int64_t p = 0; p < C; ++p) std::printf(" %5lld", (long long)p);
  std::printf("  recall\n");
  for (int64_t t = 0; t < C; ++t) {
    int64_t row = 0;
    for (int64_t p = 0; p < C; ++p) row += e.confusion[t * C + p];
    std::printf("%2lld %-11.11s", (long long)t, c.class_names[t].c_str());
    for (int64_t p = 0; p < C; ++p) std::printf(" %5lld", (long long)e.confusion[t * C + p]);
    std::printf("  %.3f\n", row ? (double)e.confusion[t * C + t] / row : 0.0);
  }
  return 0;
}

namespace {

struct ClassifyArgs {
  std::string model;
  std::vector<std::string> images;
  std::string test;              // an IDX folder, with --index
  std::vector<int64_t> indices;  // t10k images to classify
  int64_t top_k = 3;
  std::string attention_map;
  bool json = false;
  std::string dtype;
};

int run_classify(const ClassifyArgs& a) {
  std::shared_ptr<VisionTransformer> model = load_vit_model(a.model, "classify", a.dtype);
  const ViTConfig& c = model->config();
  const int64_t size = c.image_size, pixels = c.channels * size * size;
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> images;
  for (auto& path : a.images) names.push_back(path), images.push_back(read_image(path, c.channels, c.image_resize()));
  if (!a.indices.empty()) {
    QKV_CHECK(!a.test.empty(), "classify: --index needs --test FOLDER");
    ImageSet test = load_idx_folder(a.test, "t10k");
    QKV_CHECK(test.channels == c.channels && test.height == size && test.width == size, a.test, ": images are ",
              test.channels, "x", test.height, "x", test.width, ", the model takes ", c.channels, "x", size, "x", size);
    for (int64_t i : a.indices) {
      QKV_CHECK(i >= 0 && i < test.count, "classify: --index ", i, " outside [0, ", test.count, ")");
      QKV_CHECK(test.labels[i] >= 0 && test.labels[i] < c.num_classes, a.test, ": label ", test.labels[i],
                " of image ", i, " is not one of the model's ", c.num_classes, " classes");
      names.push_back(a.test + " #" + std::to_string(i) + " (" + c.class_names[test.labels[i]] + ")");
      images.emplace_back(test.image(i), test.image(i) + pixels);
    }
  }
  QKV_CHECK(!images.empty(), "classify: no images (give IMAGE files, or --test FOLDER --index N)");
  ImageSet set;
  set.count = (int64_t)images.size(), set.channels = c.channels, set.height = size, set.width = size;
  for (auto& im : images) set.pixels.insert(set.pixels.end(), im.begin(), im.end());
  std::vector<int64_t> all(images.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = (int64_t)i;
  NoGradGuard no_grad;
  Tensor logits = model->forward(image_batch(set, all), /*need_weights=*/!a.attention_map.empty());
  Tensor probs = softmax(logits);
  const int64_t C = c.num_classes, k = std::min(a.top_k, C);
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < images.size(); ++i) {
    const float* p = probs.data<float>() + i * C;
    const std::vector<int64_t> order = top_classes(p, C, k);
    if (!a.json) std::printf("%s\n", names[i].c_str());
    nlohmann::json top = nlohmann::json::array();
    for (int64_t j = 0; j < k; ++j) {
      if (!a.json) std::printf("  %-12s %.4f\n", c.class_names[order[j]].c_str(), p[order[j]]);
      top.push_back({{"label", c.class_names[order[j]]}, {"probability", p[order[j]]}});
    }
    out.push_back({{"image", names[i]}, {"top", top}});
  }
  if (a.json) std::cout << out.dump() << "\n";
  if (!a.attention_map.empty()) {
    Tensor r = model->rollout();  // [B, grid, grid]
    const int64_t g = c.grid();
    std::vector<std::vector<float>> heats;
    for (size_t i = 0; i < images.size(); ++i) {
      const float* h = r.data<float>() + i * g * g;
      heats.emplace_back(h, h + g * g);
    }
    write_heatmap_png(a.attention_map, images, c.channels, size, heats, g, g);
    std::fprintf(stderr, "attention rollout of %zu image%s written to %s (a row per image: the image, then the "
                 "rollout over it)\n", images.size(), images.size() == 1 ? "" : "s", a.attention_map.c_str());
  }
  return 0;
}

}  // namespace

Run add_classify(CLI::App& app) {
  auto args = std::make_shared<ClassifyArgs>();
  CLI::App* sub = app.add_subcommand("classify", "Classify images with a vit model: top-k labels with probabilities");
  sub->add_option("--model", args->model, "vit model folder")->required();
  sub->add_option("images", args->images, "PNG or JPEG files (converted to the model's size and channels)");
  sub->add_option("--test", args->test, "A folder of t10k IDX files, with --index");
  sub->add_option("--index", args->indices, "Test images to classify by number (repeatable)");
  sub->add_option("--top-k", args->top_k, "Labels to show per image")->capture_default_str()->check(CLI::Range(1, 1000));
  sub->add_option("--attention-map", args->attention_map,
                  "Write the attention rollout over each image as a PNG (a row per image: the image, then the rollout)");
  sub->add_flag("--json", args->json, "Print one JSON array instead of text");
  add_dtype_option(sub, args->dtype);
  return [args] { return run_classify(*args); };
}

}  // namespace qkv::cli
