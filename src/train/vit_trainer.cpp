// Vision Transformer training: the "train" options, and image classification as
// a task of the one training loop (src/train/loop.h).
#include "qkv/vit_trainer.h"

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "qkv/checkpoint.h"
#include "qkv/optim.h"
#include "src/config/fields.h"
#include "src/core/json.h"
#include "src/train/loop.h"

namespace qkv {

VitTrainOptions VitTrainOptions::from_json(const std::string& text, const std::string& source) {
  using O = VitTrainOptions;
  static const config::Fields<O> fields =
      add_loop_fields(config::Fields<O>("train.")
          .add("epochs", &O::epochs).at_least(1)
          .add("batch_size", &O::batch_size).at_least(1).at_most(config::limits::kBatch)
          .add("lr", &O::lr).positive()
          .add("warmup_steps", &O::warmup_steps).at_least(0)
          .add("min_lr_ratio", &O::min_lr_ratio).at_least(0)
          .add("weight_decay", &O::weight_decay).at_least(0)
          .add("clip_norm", &O::clip_norm).at_least(0)
          .add("label_smoothing", &O::label_smoothing).fraction()
          .add("seed", &O::seed)
          .add("augment_pad", &O::augment_pad).at_least(0)
          .add("augment_flip", &O::augment_flip)
          .add("max_train_images", &O::max_train_images).at_least(0));
  return config::read_train_section(fields, text, source);
}





namespace {

// The order of epoch e's images: a shuffle seeded by (seed, e), so a resumed
// run needs no saved order.
std::vector<int64_t> epoch_order(int64_t count, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order((size_t)count);
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed * 1000003u + (uint64_t)epoch);
  for (int64_t i = count - 1; i > 0; --i) std::swap(order[i], order[rng.next_below((uint64_t)i + 1)]);
  return order;
}

// Image classification as a task of the one loop: epochs of shuffled batches
// (the order of epoch e depends only on the seed and e), augmentation seeded
// by the step, warmup then cosine over all epochs, test accuracy after each
// epoch, best model by it.
class VisionTask final : public TrainTask {
public:
  VisionTask(VisionTransformer& model, const ImageSet& train, const ImageSet& test, const VitTrainOptions& o,
             const VitCallbacks& cb, int64_t count)
      : model_(model), train_(train), test_(test), o_(o), cb_(cb), count_(count),
        per_epoch_(std::max<int64_t>(1, count / o.batch_size)), total_(per_epoch_ * o.epochs),
        data_key_(std::to_string(count) + " images, batch_size " + std::to_string(o.batch_size) + ", seed " +
                  std::to_string(o.seed)),
        schedule_{.peak_lr = o.lr, .min_lr = o.lr * o.min_lr_ratio, .warmup_steps = o.warmup_steps,
                  .total_steps = total_},
        start_(std::chrono::steady_clock::now()) {}

  Module& model() override { return model_; }
  int64_t total_steps() const override { return total_; }
  float lr_at(int64_t step) override { return schedule_.lr_at(step); }
  StepLoss step_loss(int64_t step, Shard shard) override {
    const int64_t epoch = epoch_of(step), b = (step - 1) % per_epoch_;
    if (epoch != order_epoch_) order_ = epoch_order(count_, o_.seed, epoch), order_epoch_ = epoch;
    if (b == 0) loss_sum_ = 0, loss_count_ = 0;
    std::vector<int64_t> idx(order_.begin() + b * o_.batch_size,
                             order_.begin() + std::min((b + 1) * o_.batch_size, count_));
    const auto [first, last] = shard.range((int64_t)idx.size());  // this process's images of the batch
    if (first == last) return {};
    // The whole batch is augmented, so that each image gets the same draws
    // however many processes share it, and this process's rows are kept.
    Rng augment_rng(o_.seed ^ (0xa46e0000ull + (uint64_t)step * 0x9e3779b97f4a7c15ull));
    Tensor images = image_batch(train_, idx, {o_.augment_pad, o_.augment_flip}, &augment_rng);
    if (last - first < (int64_t)idx.size()) images = images.slice(0, first, last).contiguous();
    std::vector<int64_t> labels;
    for (int64_t i = first; i < last; ++i) labels.push_back(train_.labels[idx[i]]);
    StepLoss l{cross_entropy(model_.forward(images), Tensor::from_ints(labels, {(int64_t)labels.size()}),
                             {.label_smoothing = o_.label_smoothing}),
               0, (int64_t)labels.size()};
    l.value = l.loss.item();
    return l;
  }
  void stepped(int64_t, const StepLoss& l) override { loss_sum_ += l.value, ++loss_count_; }
  void progress(int64_t step, float loss, float lr, double rate, double eta, int64_t skipped) override {
    if (cb_.progress) cb_.progress({step, total_, epoch_of(step), o_.epochs, loss, lr, rate, eta, skipped});
  }
  bool validate_after(int64_t step) const override { return step % per_epoch_ == 0; }
  Validation validate(int64_t step, float) override {
    const VitEvaluation e = evaluate_vit(model_, test_);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    report_ = {epoch_of(step), loss_count_ ? loss_sum_ / loss_count_ : NAN, e.accuracy, seconds, false};
    return {e.accuracy, {{"epoch", report_.epoch}, {"step", step}, {"train_loss", report_.train_loss},
                         {"test_accuracy", e.accuracy}, {"seconds", seconds}}};
  }
  nlohmann::ordered_json summary(int64_t step, double best, int64_t skipped,
                                 const nlohmann::json& history) const override {
    return {{"epoch", epoch_of(step)}, {"epochs", o_.epochs}, {"step", step}, {"best_accuracy", best},
            {"skipped_steps", skipped}, {"history", history}};
  }
  bool validated(const Validation&, bool best) override {
    report_.best = best;
    if (cb_.epoch_done) cb_.epoch_done(report_);
    return false;
  }
  void save_best(const std::string& dir, const std::string& state) override {
    save_model_folder(dir, find_family("vit", dir), model_, nullptr, state);
  }

  const char* state_format() const override { return "qkv-vit-trainer-state"; }
  const char* best_key() const override { return "best_accuracy"; }
  double worst_score() const override { return -1; }
  bool better(double score, double best) const override { return score > best; }
  void save_extra(std::vector<std::pair<std::string, Tensor>>&, std::map<std::string, std::string>& m) const override {
    m["data"] = data_key_;  // what fixes the data order
  }
  void restore_extra(const TrainerStateFile& state, int64_t step) override {
    // Epochs may grow (the cosine then stretches from there on); the data order may not change.
    const std::string* saved = state.metadata("data");
    QKV_CHECK(saved && *saved == data_key_, state.path(), ": saved for ", saved ? *saved : "(not recorded)",
              "; this run has ", data_key_, " (resume with the same images, batch_size and seed)");
    QKV_CHECK(step % per_epoch_ == 0, state.path(), ": saved mid-epoch at step ", step, " of ", per_epoch_,
              " per epoch");
  }

private:
  int64_t epoch_of(int64_t step) const { return (step - 1) / per_epoch_ + 1; }

  VisionTransformer& model_;
  const ImageSet& train_;
  const ImageSet& test_;
  const VitTrainOptions& o_;
  const VitCallbacks& cb_;
  int64_t count_, per_epoch_, total_;
  std::string data_key_;
  WarmupCosine schedule_;
  std::chrono::steady_clock::time_point start_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = 0;
  double loss_sum_ = 0;
  int64_t loss_count_ = 0;
  VitEpochReport report_{};
};

}  // namespace

std::shared_ptr<VisionTransformer> new_vit_model(const std::string& config_text, const std::string& source,
                                                 uint64_t seed) {
  nlohmann::json j = parse_json(config_text, source);
  QKV_CHECK(j.is_object(), source, ": expected a JSON object");
  j.erase("train");
  Rng rng(seed);
  return std::dynamic_pointer_cast<VisionTransformer>(find_family("vit", source).build(j.dump(), source, rng));
}

TrainOutcome train_vit(VisionTransformer& model, const ImageSet& train_all, const ImageSet& test, const VitTrainOptions& o,
               const std::string& out_dir, const VitCallbacks& cb, ProcessGroup* group) {
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
  VisionTask task(model, train_all, test, o, cb, count);
  return run_training(task, loop_options(o, group), out_dir);
}

}  // namespace qkv
