// The one training loop (see src/train/loop.h) and the checked reader of its
// state file.
#include "src/train/loop.h"

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>

#include "qkv/allocator.h"
#include "src/train/train_state.h"

namespace qkv {

std::vector<int64_t> TrainerStateFile::ints(const std::string& name, int64_t count) const {
  const Tensor& t = checkpoint_tensor(f_, path_, name);
  QKV_CHECK(t.dtype() == DType::I64 && t.dim() == 1 && (count < 0 || t.numel() == count), path_, ": '", name,
            "' must be ", count < 0 ? std::string("a list of") : std::to_string(count), " I64 values, it is ",
            dtype_name(t.dtype()), " ", shape_str(t.shape()), "; cannot resume");
  return t.to_ints();
}

int64_t TrainerStateFile::integer(const std::string& name, int64_t low, int64_t high) const {
  const int64_t v = ints(name, 1)[0];
  QKV_CHECK(v >= low && v <= high, path_, ": '", name, "' is ", v, ", outside [", low, ", ", high, "]; cannot resume");
  return v;
}

void TrainerStateFile::rng(const std::string& name, Rng& rng) const {
  ints(name, 2);
  restore_rng(rng, checkpoint_tensor(f_, path_, name));
}

const std::string* TrainerStateFile::metadata(const std::string& key) const {
  auto it = f_.metadata.find(key);
  return it == f_.metadata.end() ? nullptr : &it->second;
}

namespace {

struct Resumed {
  int64_t step = 0, skipped = 0;
  double best = 0, tiebreak = -INFINITY;
  int64_t since_best = 0;  // validations since the best one
  double lr_scale = 1;     // what plateaus have made of the schedule's learning rate
  nlohmann::json history = nlohmann::json::array();
};

double metadata_number(const TrainerStateFile& state, const std::string& key, double otherwise) {
  const std::string* text = state.metadata(key);
  if (!text) return otherwise;
  char* end = nullptr;
  const double v = std::strtod(text->c_str(), &end);
  QKV_CHECK(!text->empty() && end && *end == '\0', state.path(), ": metadata '", key, "' is '", *text,
            "', not a number; cannot resume");
  return v;
}

std::string tiebreak_key(const TrainTask& task) { return std::string(task.best_key()) + "_tiebreak"; }

Resumed resume_from(TrainTask& task, AdamW& opt, const std::string& out_dir) {
  const std::string path = trainer_state_path(out_dir);
  TrainerStateFile state(load_safetensors(path), path);
  const std::string* format = state.metadata("format");
  QKV_CHECK(format && *format == task.state_format(), path, ": not a ", task.state_format(), " file (format ",
            format ? "'" + *format + "'" : std::string("missing"), "); cannot resume");
  const int64_t total = task.total_steps();
  Resumed r;
  r.step = state.integer("step", 0, std::numeric_limits<int64_t>::max());
  QKV_CHECK(r.step < total, "train --resume: the checkpoint is at step ", r.step, ", nothing to do for ", total,
            " steps");
  r.skipped = state.integer("skipped", 0, r.step);
  state.integer("optimizer.steps", 0, r.step);
  for (auto& [name, rng] : task.model().named_rngs()) state.ints("rng.model." + name, 2);
  restore_training_state(state.file(), path, task.model(), opt);
  r.best = metadata_number(state, task.best_key(), task.worst_score());
  r.tiebreak = metadata_number(state, tiebreak_key(task), -INFINITY);
  const double since = metadata_number(state, "validations_since_best", 0);
  QKV_CHECK(since >= 0 && since <= (double)r.step && since == std::floor(since), path,
            ": metadata 'validations_since_best' is ", since, "; cannot resume");
  r.since_best = (int64_t)since;
  r.lr_scale = metadata_number(state, "lr_scale", 1);
  QKV_CHECK(r.lr_scale > 0 && r.lr_scale <= 1, path, ": metadata 'lr_scale' is ", r.lr_scale, "; cannot resume");
  if (const std::string* history = state.metadata("history")) {
    r.history = nlohmann::json::parse(*history, nullptr, /*allow_exceptions=*/false);
    QKV_CHECK(r.history.is_array(), path, ": metadata 'history' is not a JSON list; cannot resume");
  }
  task.restore_extra(state, r.step);
  return r;
}

// The model folders of validations, out_dir/checkpoints/step-N: the newest
// `keep` stay (sorted by N, whatever else the folder holds).
void keep_newest_checkpoints(const std::string& out_dir, int64_t keep) {
  namespace fs = std::filesystem;
  std::vector<std::pair<int64_t, fs::path>> saved;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_dir + "/checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 20) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    saved.emplace_back(std::stoll(name.substr(5)), e.path());
  }
  std::sort(saved.begin(), saved.end());
  for (size_t i = 0; i + keep < saved.size(); ++i) fs::remove_all(saved[i].second, ec);
}

// Weights, their gradients and AdamW's two moments are four copies of the
// parameters before any activation: a model that fits but cannot train here
// is refused before the first step rather than part-way through it.
void require_training_fits(const Module& model) {
  const uint64_t weights = model.parameter_bytes(), need = 4 * weights;
  QKV_CHECK(need <= memory_limit(), "training this model needs at least ", format_bytes(need), " (",
            format_bytes(weights), " of weights, as much again for their gradients and twice that for AdamW's "
            "moments), more than qkv may use here (", format_bytes(memory_limit()), ")");
}

}  // namespace

TrainOutcome run_training(TrainTask& task, const LoopOptions& o, const std::string& out_dir) {
  Module& model = task.model();
  require_training_fits(model);
  model.train();
  AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  const int64_t total = task.total_steps();
  Resumed s;
  s.best = task.worst_score();
  if (o.resume) s = resume_from(task, opt, out_dir);
  SkipCounter skips{.total = s.skipped, .max_in_a_row = o.max_skipped_in_a_row};
  const int64_t first_step = s.step + 1;
  int64_t units = 0;
  auto start = std::chrono::steady_clock::now();
  for (int64_t step = first_step; step <= total; ++step) {
    const float lr = task.lr_at(step) * (float)s.lr_scale;
    opt.set_lr(lr);
    opt.zero_grad();
    StepLoss loss = task.step_loss(step);
    if (step_if_finite(loss.loss, loss.value, model, opt, o.clip_norm, skips, step, out_dir, o.gradient_hook)) {
      task.stepped(step, loss);
      units += loss.units;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double done = (double)(step - first_step + 1);
      task.progress(step, loss.value, lr, units / std::max(secs, 1e-9), secs / done * (double)(total - step),
                    skips.total);
    }
    if (!task.validate_after(step)) continue;
    Validation v = task.validate(step, loss.value);
    const bool best =
        task.better(v.score, s.best) || (!task.better(s.best, v.score) && v.tiebreak > s.tiebreak);
    if (best) {
      s.best = v.score, s.tiebreak = v.tiebreak, s.since_best = 0;
    } else {
      ++s.since_best;
      if (o.plateau_factor > 0 && o.plateau_patience > 0 && s.since_best % o.plateau_patience == 0)
        s.lr_scale *= o.plateau_factor;
    }
    s.history.push_back(v.history);
    const std::string summary = task.summary(step, s.best, skips.total, s.history).dump(2) + "\n";
    if (best) {
      task.save_best(out_dir, summary);
    } else {
      write_file_atomic(out_dir + "/trainer_state.json", summary);
    }
    if (o.keep_checkpoints > 0) {
      task.save_best(out_dir + "/checkpoints/step-" + std::to_string(step), summary);
      keep_newest_checkpoints(out_dir, o.keep_checkpoints);
    }
    std::vector<std::pair<std::string, Tensor>> extra;
    std::map<std::string, std::string> metadata = {{"format", task.state_format()},
                                                   {task.best_key(), exact_text(s.best)},
                                                   {tiebreak_key(task), exact_text(s.tiebreak)},
                                                   {"validations_since_best", std::to_string(s.since_best)},
                                                   {"lr_scale", exact_text(s.lr_scale)},
                                                   {"history", s.history.dump()}};
    task.save_extra(extra, metadata);
    save_trainer_state(trainer_state_path(out_dir), model, opt, step, skips.total, std::move(extra), metadata);
    if (task.validated(v, best) && step < total)
      return {step, "stopped after the validation at step " + std::to_string(step)};
    if (o.patience > 0 && s.since_best >= o.patience && step < total)
      return {step, "early stopping: " + std::to_string(s.since_best) + " validations in a row without a better "
                    "score (patience " + std::to_string(o.patience) + ")"};
  }
  return {total, ""};
}

}  // namespace qkv
