// Internal: the one training loop every family's trainer runs.
//
//   for step = first .. total:
//     lr = task.lr_at(step); loss = task.step_loss(step)       (the family's batch and loss)
//     backward; with a process group, the gradients summed across processes
//       as backward finishes them (src/train/gradient_reducer.h); clip;
//     AdamW step only when the loss and the gradient norm are finite
//     (too many skips in a row: an error naming the last good checkpoint)
//     progress
//     if task.validate_after(step): validation, best model saved (model folder),
//       trainer_state.json, and trainer_state.safetensors for an exact resume;
//       the run ends early when `patience` validations in a row were not better,
//       or when the task says so (TrainTask::validated); every
//       `plateau_patience` validations without a better one multiply the
//       learning rate by `plateau_factor`; the last `keep_checkpoints`
//       validated models stay in out_dir/checkpoints/step-N (for qkv average)
//
// With a process group (qkv/process_group.h) every process runs this loop:
// each takes its shard of the step's global batch, its loss weighted by its
// share of the batch's tokens or images so that the summed gradients are
// those of the whole batch; rank 0 alone validates, writes files and reports
// progress, and tells the others what the validation decided.
//
// A task owns what differs: the data and its order, the loss, the schedule,
// the validation score and what "better" means, and the names its files use
// (kept as each trainer wrote them, so older folders still resume).
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "qkv/io.h"
#include "qkv/nn.h"
#include "qkv/optim.h"
#include "qkv/process_group.h"
#include "src/config/fields.h"

template <>
struct qkv::config::EnumNames<qkv::Precision> {
  static constexpr std::pair<Precision, const char*> values[] = {{Precision::F32, "f32"}, {Precision::Bf16, "bf16"}};
};

namespace qkv {

struct StepLoss {
  Tensor loss;        // differentiable, auxiliary losses included
  float value = 0;    // what progress and history show (without the auxiliary losses)
  int64_t units = 0;  // tokens or images this step trained on, for the rate
};

struct Validation {
  double score = 0;             // compared with better()
  nlohmann::json history;       // this validation's entry in the history ("step" and the metrics)
  double tiebreak = 0;          // between two equal scores, the higher is better (chrF saturates at 100)
};

// The trainer state file's contents beyond the shared ones, read back with
// every field checked: a file that says something impossible is an error
// naming it, never a crash.
class TrainerStateFile {
public:
  TrainerStateFile(SafetensorsFile file, std::string path) : f_(std::move(file)), path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  const SafetensorsFile& file() const { return f_; }
  // An I64 tensor of exactly `count` elements (any when count < 0).
  std::vector<int64_t> ints(const std::string& name, int64_t count = -1) const;
  // An I64 scalar (shape [1]) within [low, high].
  int64_t integer(const std::string& name, int64_t low, int64_t high) const;
  // Restores `rng` from its saved (seed, counter) pair.
  void rng(const std::string& name, Rng& rng) const;
  const std::string* metadata(const std::string& key) const;

private:
  SafetensorsFile f_;
  std::string path_;
};

class TrainTask {
public:
  virtual ~TrainTask() = default;
  virtual Module& model() = 0;
  virtual int64_t total_steps() const = 0;
  virtual float lr_at(int64_t step) = 0;
  // The loss of this process's shard of the step's batch, averaged over the
  // shard's units; an empty shard gives an undefined loss and 0 units.
  virtual StepLoss step_loss(int64_t step, Shard shard) = 0;
  // Called after a step that was taken (its loss and gradient were finite).
  virtual void stepped(int64_t step, const StepLoss& loss) { (void)step, (void)loss; }
  virtual void progress(int64_t step, float loss, float lr, double units_per_second, double eta_seconds,
                        int64_t skipped) = 0;
  virtual bool validate_after(int64_t step) const = 0;
  virtual Validation validate(int64_t step, float last_loss) = 0;
  // The trainer_state.json of the folder after a validation.
  virtual nlohmann::ordered_json summary(int64_t step, double best, int64_t skipped,
                                         const nlohmann::json& history) const = 0;
  // After a validation and its saves; true ends the run there.
  virtual bool validated(const Validation& v, bool best) { return (void)v, (void)best, false; }
  virtual void save_best(const std::string& dir, const std::string& trainer_state_json) = 0;

  // The trainer state file: its "format", the metadata key of the best score,
  // the score before any validation, and which of two scores is better.
  virtual const char* state_format() const = 0;
  virtual const char* best_key() const = 0;
  virtual double worst_score() const = 0;
  virtual bool better(double score, double best) const = 0;
  // What else an exact resume needs (the data order), saved with the state
  // and checked on the way back.
  virtual void save_extra(std::vector<std::pair<std::string, Tensor>>& tensors,
                          std::map<std::string, std::string>& metadata) const {
    (void)tensors, (void)metadata;
  }
  virtual void restore_extra(const TrainerStateFile& state, int64_t step) { (void)state, (void)step; }
};

struct LoopOptions {
  float lr = 1e-3f, weight_decay = 0.01f, clip_norm = 1.0f;
  float adam_eps = 1e-8f;  // AdamW's eps: the denominator's floor, sqrt(v) + eps
  int64_t max_skipped_in_a_row = 20;
  int64_t patience = 0;  // end after this many validations in a row without a better score (0: never)
  float plateau_factor = 0;      // multiply the lr by this after plateau_patience validations without a better one
  int64_t plateau_patience = 2;  //   (0: never; as torch.optim.lr_scheduler.ReduceLROnPlateau)
  int64_t keep_checkpoints = 0;  // model folders of the last this many validations, checkpoints/step-N
  Precision precision = Precision::F32;  // Bf16: each step's forward under Bf16AutocastGuard (qkv/ops.h)
  bool resume = false;
  ProcessGroup* group = nullptr;  // the processes training this model together; none: this one alone
};

// The loop's part of a trainer's options (TrainOptions, LmTrainOptions, VitTrainOptions).
template <class Options>
LoopOptions loop_options(const Options& o, ProcessGroup* group) {
  return {.lr = o.lr, .weight_decay = o.weight_decay, .clip_norm = o.clip_norm, .adam_eps = o.adam_eps,
          .max_skipped_in_a_row = o.max_skipped_in_a_row, .patience = o.patience,
          .plateau_factor = o.plateau_factor, .plateau_patience = o.plateau_patience,
          .keep_checkpoints = o.keep_checkpoints, .precision = o.precision, .resume = o.resume, .group = group};
}

// FNV-1a, 64 bits: continues `h` over `n` bytes at `data`.
constexpr uint64_t kFnvStart = 1469598103934665603ull;
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvStart) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

// Fails on every process of `group` when `hash` (of what each process read
// or holds) is not the same on all: `what` says what differs.
void require_same_everywhere(ProcessGroup* group, uint64_t hash, const std::string& what);

// The "train" keys of the loop's stopping, saving, precision and optimizer
// options, shared by every trainer's section (TrainOptions, LmTrainOptions,
// VitTrainOptions), so their names and ranges are written once.
template <class Options>
config::Fields<Options>& add_loop_fields(config::Fields<Options>& f) {
  using O = Options;
  return f.add("patience", &O::patience).at_least(0)
      .add("plateau_factor", &O::plateau_factor).fraction()
      .add("plateau_patience", &O::plateau_patience).at_least(1)
      .add("keep_checkpoints", &O::keep_checkpoints).at_least(0)
      .add("precision", &O::precision)
      .add("adam_eps", &O::adam_eps).positive();
}

// Trains `task` into the model folder `out_dir`; with options.resume, from
// out_dir/trainer_state.safetensors.
TrainOutcome run_training(TrainTask& task, const LoopOptions& options, const std::string& out_dir);

// The trainer state file of a folder.
inline std::string trainer_state_path(const std::string& dir) { return dir + "/trainer_state.safetensors"; }

}  // namespace qkv
