// qkv/vit_trainer.h — training Vision Transformers.
//
// It writes a model folder (qkv/checkpoint.h): the best weights by test
// accuracy, trainer_state.json (epoch, accuracy history) and
// trainer_state.safetensors (the latest weights, AdamW moments, step and RNG
// streams: what --resume needs). Classifying and evaluating are in qkv/infer.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qkv/infer.h"
#include "qkv/optim.h"
#include "qkv/process_group.h"
#include "qkv/vit.h"

namespace qkv {

struct VitTrainOptions {
  int64_t epochs = 5;
  int64_t batch_size = 128;
  float lr = 1e-3f;  // peak
  int64_t warmup_steps = 200;
  float min_lr_ratio = 0.01f;  // the cosine ends at lr * min_lr_ratio
  float weight_decay = 0.05f;
  float adam_eps = 1e-8f;  // AdamW's eps (as torch.optim.AdamW's)
  float clip_norm = 1.0f;
  float label_smoothing = 0.0f;
  uint64_t seed = 1;
  int64_t augment_pad = 0;      // random crop of the image padded by this many pixels
  bool augment_flip = false;    // random horizontal flip
  int64_t max_train_images = 0; // use only the first N training images (0: all)
  int64_t max_skipped_in_a_row = 20;
  int64_t patience = 0;  // early stopping: end after this many epochs without a better accuracy (0: never)
  float plateau_factor = 0;      // lr x this after plateau_patience validations without a better one (0: off)
  int64_t plateau_patience = 2;
  int64_t keep_checkpoints = 0;  // keep the model folders of the last N validations in checkpoints/step-N
  Precision precision = Precision::F32;  // "bf16": mixed precision (bfloat16 products, float32 weights and state)
  bool resume = false;
  // The "train" object of a config file; unknown keys are an error.
  static VitTrainOptions from_json(const std::string& text, const std::string& source);
};

struct VitProgress {
  int64_t step, total_steps, epoch, epochs;
  float loss, lr;
  double images_per_second, eta_seconds;
  int64_t skipped_steps;
};

struct VitEpochReport {
  int64_t epoch;
  double train_loss, test_accuracy, seconds;  // accuracy in 0..1; seconds of training so far
  bool best;
};

struct VitCallbacks {
  std::function<void(const VitProgress&)> progress;
  std::function<void(const VitEpochReport&)> epoch_done;
};

// A fresh model from a vit config's text (its "train" object ignored),
// initialised from `seed`.
std::shared_ptr<VisionTransformer> new_vit_model(const std::string& config_text, const std::string& source,
                                                 uint64_t seed);

// Trains with AdamW and warmup + cosine over epochs x (train.count / batch_size)
// steps; after each epoch measures test accuracy and keeps the best model in out_dir.
TrainOutcome train_vit(VisionTransformer& model, const ImageSet& train, const ImageSet& test, const VitTrainOptions& options,
               const std::string& out_dir, const VitCallbacks& callbacks, ProcessGroup* group = nullptr);




}  // namespace qkv
