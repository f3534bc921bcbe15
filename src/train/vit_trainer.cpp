// The training loop for the Vision Transformer, evaluation, the model folder.
#include "qkv/vit_trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "qkv/checkpoint.h"
#include "qkv/io.h"
#include "qkv/optim.h"
#include "src/config/fields.h"
#include "src/train/train_state.h"

namespace qkv {

VitTrainOptions VitTrainOptions::from_json(const std::string& text, const std::string& source) {
  using O = VitTrainOptions;
  static const config::Fields<O> fields = config::Fields<O>("train.")
                                              .add("epochs", &O::epochs).at_least(1)
                                              .add("batch_size", &O::batch_size).at_least(1)
                                              .add("lr", &O::lr).positive()
                                              .add("warmup_steps", &O::warmup_steps).at_least(0)
                                              .add("min_lr_ratio", &O::min_lr_ratio).at_least(0)
                                              .add("weight_decay", &O::weight_decay).at_least(0)
                                              .add("clip_norm", &O::clip_norm).at_least(0)
                                              .add("label_smoothing", &O::label_smoothing).fraction()
                                              .add("seed", &O::seed)
                                              .add("augment_pad", &O::augment_pad).at_least(0)
                                              .add("augment_flip", &O::augment_flip)
                                              .add("max_train_images", &O::max_train_images).at_least(0);
  return config::read_train_section(fields, text, source);
}





namespace {

const std::string kStateFile = "/trainer_state.safetensors";

// The order of epoch e's images: a shuffle seeded by (seed, e), so a resumed
// run needs no saved order.
std::vector<int64_t> epoch_order(int64_t count, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order((size_t)count);
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed * 1000003u + (uint64_t)epoch);
  for (int64_t i = count - 1; i > 0; --i) std::swap(order[i], order[rng.next_below((uint64_t)i + 1)]);
  return order;
}

}  // namespace

static void save_vit_model(VisionTransformer& model, const std::string& dir, const std::string& state) {
  save_model_folder(dir, find_family("vit", dir), model, nullptr, state);
}

void train_vit(VisionTransformer& model, const ImageSet& train_all, const ImageSet& test, const VitTrainOptions& o,
               const std::string& out_dir, const VitCallbacks& cb) {
  const ViTConfig& c = model.config();
  QKV_CHECK(train_all.channels == c.channels && train_all.height == c.image_size && train_all.width == c.image_size,
            "train: images are ", train_all.channels, "x", train_all.height, "x", train_all.width,
            ", the config asks for ", c.channels, "x", c.image_size, "x", c.image_size);
  QKV_CHECK(test.channels == c.channels && test.height == c.image_size && test.width == c.image_size,
            "train: test images are ", test.channels, "x", test.height, "x", test.width, ", the config asks for ",
            c.channels, "x", c.image_size, "x", c.image_size);
  const int64_t count = o.max_train_images > 0 ? std::min(o.max_train_images, train_all.count) : train_all.count;
  for (int64_t i = 0; i < count; ++i)
    QKV_CHECK(train_all.labels[i] >= 0 && train_all.labels[i] < c.num_classes, "train: label ", train_all.labels[i],
              " of image ", i, " is not one of the ", c.num_classes, " classes");
  for (int64_t i = 0; i < test.count; ++i)
    QKV_CHECK(test.labels[i] >= 0 && test.labels[i] < c.num_classes, "train: label ", test.labels[i],
              " of test image ", i, " is not one of the ", c.num_classes, " classes");
  // What fixes the data order: a resume must see the same (epochs may grow,
  // which stretches the cosine from there on).
  const std::string data_key = std::to_string(count) + " images, batch_size " + std::to_string(o.batch_size) +
                               ", seed " + std::to_string(o.seed);
  const int64_t per_epoch = std::max<int64_t>(1, count / o.batch_size), total = per_epoch * o.epochs;
  model.train();
  AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  WarmupCosine schedule{.peak_lr = o.lr, .min_lr = o.lr * o.min_lr_ratio, .warmup_steps = o.warmup_steps,
                        .total_steps = total};
  int64_t step = 0, skipped = 0;
  double best = -1;
  nlohmann::json history = nlohmann::json::array();
  if (o.resume) {
    const std::string path = out_dir + kStateFile;
    SafetensorsFile f = load_safetensors(path);
    QKV_CHECK(f.metadata.count("format") && f.metadata.at("format") == "qkv-vit-trainer-state", path,
              ": not a qkv ViT trainer state");
    restore_training_state(f, path, model, opt);
    step = checkpoint_tensor(f, path, "step").to_ints()[0];
    skipped = checkpoint_tensor(f, path, "skipped").to_ints()[0];
    best = std::stod(f.metadata.count("best_accuracy") ? f.metadata.at("best_accuracy") : "-1");
    if (f.metadata.count("history")) history = nlohmann::json::parse(f.metadata.at("history"));
    QKV_CHECK(step < total, "train --resume: the checkpoint is at step ", step, ", nothing to do for ", total,
              " steps (", o.epochs, " epochs)");
    const std::string saved = f.metadata.count("data") ? f.metadata.at("data") : "(not recorded)";
    QKV_CHECK(saved == data_key, path, ": saved for ", saved, "; this run has ", data_key,
              " (resume with the same images, batch_size and seed)");
    QKV_CHECK(step % per_epoch == 0, path, ": saved mid-epoch at step ", step, " of ", per_epoch, " per epoch");
  }
  const Augment augment{o.augment_pad, o.augment_flip};
  auto start = std::chrono::steady_clock::now();
  const int64_t first_step = step;
  SkipCounter skips{.total = skipped, .max_in_a_row = o.max_skipped_in_a_row};
  for (int64_t epoch = step / per_epoch + 1; epoch <= o.epochs; ++epoch) {
    std::vector<int64_t> order = epoch_order(count, o.seed, epoch);
    double loss_sum = 0;
    int64_t loss_count = 0;
    for (int64_t b = 0; b < per_epoch; ++b) {
      ++step;
      std::vector<int64_t> idx(order.begin() + b * o.batch_size, order.begin() + std::min((b + 1) * o.batch_size, count));
      Rng augment_rng(o.seed ^ (0xa46e0000ull + (uint64_t)step * 0x9e3779b97f4a7c15ull));
      Tensor images = image_batch(train_all, idx, augment, &augment_rng);
      std::vector<int64_t> labels;
      for (int64_t i : idx) labels.push_back(train_all.labels[i]);
      const float lr = schedule.lr_at(step);
      opt.set_lr(lr);
      opt.zero_grad();
      Tensor loss = cross_entropy(model.forward(images), Tensor::from_ints(labels, {(int64_t)labels.size()}),
                                  {.label_smoothing = o.label_smoothing});
      const float value = loss.item();
      if (!step_if_finite(loss, value, model, opt, o.clip_norm, skips, step, out_dir)) continue;
      loss_sum += value, ++loss_count;
      if (cb.progress) {
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        double done = (double)(step - first_step);
        cb.progress({step, total, epoch, o.epochs, value, lr, done * o.batch_size / std::max(secs, 1e-9),
                     secs / done * (total - step), skips.total});
      }
    }
    VitEvaluation e = evaluate_vit(model, test);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    VitEpochReport r{epoch, loss_count ? loss_sum / loss_count : NAN, e.accuracy, seconds, e.accuracy > best};
    history.push_back({{"epoch", epoch}, {"step", step}, {"train_loss", r.train_loss},
                       {"test_accuracy", e.accuracy}, {"seconds", seconds}});
    nlohmann::ordered_json state = {{"epoch", epoch},           {"epochs", o.epochs},
                                    {"step", step},             {"best_accuracy", std::max(best, e.accuracy)},
                                    {"skipped_steps", skips.total}, {"history", history}};
    if (r.best) {
      best = e.accuracy;
      save_vit_model(model, out_dir, state.dump(2) + "\n");
    } else {
      write_file_atomic(out_dir + "/trainer_state.json", state.dump(2) + "\n");
    }
    save_trainer_state(out_dir + kStateFile, model, opt, step, skips.total, {},
                       {{"format", "qkv-vit-trainer-state"},
                        {"best_accuracy", exact_text(best)},
                        {"history", history.dump()},
                        {"data", data_key}});
    if (cb.epoch_done) cb.epoch_done(r);
  }
}

}  // namespace qkv
