// The one training loop (see src/train/loop.h) and the checked reader of its
// state file.
#include "src/train/loop.h"

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include "qkv/allocator.h"
#include "src/core/json.h"
#include "src/train/gradient_reducer.h"
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
  int64_t processes = 1;   // that trained the run so far
  // With processes > 1: each model RNG's counter on every process, by name.
  std::map<std::string, std::vector<int64_t>> rank_counters;
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
    QKV_CHECK(!json_text_nested_deeper_than(*history, kMaxFileJsonDepth), path,
              ": metadata 'history' is nested deeper than ", kMaxFileJsonDepth, " levels; cannot resume");
    r.history = nlohmann::json::parse(*history, nullptr, /*allow_exceptions=*/false);
    QKV_CHECK(r.history.is_array(), path, ": metadata 'history' is not a JSON list; cannot resume");
  }
  r.processes = (int64_t)metadata_number(state, "processes", 1);
  QKV_CHECK(r.processes >= 1 && r.processes <= (1 << 20), path, ": metadata 'processes' is ", r.processes,
            "; cannot resume");
  if (r.processes > 1)
    for (auto& [name, rng] : task.model().named_rngs())
      r.rank_counters[name] = state.ints("rng.ranks.model." + name, r.processes);
  task.restore_extra(state, r.step);
  return r;
}

// Each process of a group draws its own dropout masks: process r's stream of
// each model RNG has its own seed (process 0's is the run's), and on a resume
// each takes back its own counter, so that the run goes on exactly.
void own_rng_streams(Module& model, const ProcessGroup& group, const Resumed& s, bool resumed) {
  for (auto& [name, rng] : model.named_rngs()) {
    const uint64_t seed = rng->seed_state() ^ (0x9e3779b97f4a7c15ull * (uint64_t)group.rank());
    const uint64_t counter = resumed ? (uint64_t)s.rank_counters.at(name)[(size_t)group.rank()] : rng->counter();
    rng->restore(seed, counter);
  }
}

// Every process's counter of each model RNG, gathered on all (for rank 0 to save).
std::vector<std::pair<std::string, Tensor>> rank_counters(Module& model, ProcessGroup& group) {
  std::vector<std::pair<std::string, Rng*>> rngs = model.named_rngs();
  const size_t n = (size_t)group.size();
  std::vector<double> all(rngs.size() * n, 0.0);  // exact: counters stay far below 2^53
  for (size_t i = 0; i < rngs.size(); ++i) all[i * n + (size_t)group.rank()] = (double)rngs[i].second->counter();
  group.sum(all.data(), (int64_t)all.size());
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < rngs.size(); ++i) {
    std::vector<int64_t> counters(all.begin() + (ptrdiff_t)(i * n), all.begin() + (ptrdiff_t)((i + 1) * n));
    out.emplace_back("rng.ranks.model." + rngs[i].first, Tensor::from_ints(counters, {(int64_t)n}));
  }
  return out;
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

// Rank 0's part of a validation: its entry in the history, then
// trainer_state.json, the best model, the kept checkpoints and the trainer
// state file; returns the task's verdict (true ends the run here).
bool save_validation(TrainTask& task, const LoopOptions& o, Resumed& s, const Validation& v, bool best, int64_t step,
                     int64_t skipped, Module& model, const AdamW& opt, const std::string& out_dir,
                     std::vector<std::pair<std::string, Tensor>> extra) {
  s.history.push_back(v.history);
  const std::string summary = task.summary(step, s.best, skipped, s.history).dump(2) + "\n";
  if (best) {
    task.save_best(out_dir, summary);
  } else {
    write_file_atomic(out_dir + "/trainer_state.json", summary);
  }
  if (o.keep_checkpoints > 0) {
    task.save_best(out_dir + "/checkpoints/step-" + std::to_string(step), summary);
    keep_newest_checkpoints(out_dir, o.keep_checkpoints);
  }
  std::map<std::string, std::string> metadata = {{"format", task.state_format()},
                                                 {task.best_key(), exact_text(s.best)},
                                                 {tiebreak_key(task), exact_text(s.tiebreak)},
                                                 {"validations_since_best", std::to_string(s.since_best)},
                                                 {"lr_scale", exact_text(s.lr_scale)},
                                                 {"history", s.history.dump()}};
  if (!extra.empty()) metadata["processes"] = std::to_string(s.processes);  // with the per-process RNG counters
  task.save_extra(extra, metadata);
  save_trainer_state(trainer_state_path(out_dir), model, opt, step, skipped, std::move(extra), metadata);
  return task.validated(v, best);
}

// FNV-1a over the weights' bytes: the same model on every process, or not.
uint64_t weights_hash(Module& model) {
  uint64_t h = kFnvStart;
  for (auto& [name, p] : model.named_parameters()) {
    const Tensor c = p.contiguous();
    h = fnv1a(c.data<float>(), (size_t)c.numel() * sizeof(float), h);
  }
  return h;
}

// This process's shard of the step's loss made part of the global one: the
// units summed, the loss value averaged over all of them, and the
// differentiable loss weighted by this shard's share, so that the gradients
// summed across processes are those of the whole batch's mean.
void combine_shards(ProcessGroup& group, StepLoss& loss, double& wait_seconds) {
  double totals[2] = {(double)loss.units, loss.units ? (double)loss.value * (double)loss.units : 0.0};
  const auto t0 = std::chrono::steady_clock::now();
  group.sum(totals, 2);
  wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (loss.loss.defined()) loss.loss = scale(loss.loss, totals[0] > 0 ? (float)(loss.units / totals[0]) : 0.f);
  loss.value = totals[0] > 0 ? (float)(totals[1] / totals[0]) : 0.f;
  loss.units = (int64_t)totals[0];
}

}  // namespace

void require_same_everywhere(ProcessGroup* group, uint64_t hash, const std::string& what) {
  if (!group || group->size() == 1) return;
  uint64_t first = hash;
  group->broadcast(&first, sizeof first, 0);
  double differ = first != hash ? 1 : 0;
  group->sum(&differ, 1);
  QKV_CHECK(differ == 0, "train: ", (int64_t)differ, " of the ", group->size(), " processes ",
            differ == 1 ? "has" : "have", " ", what, " other than process 0's", first != hash ? " (this one, rank " +
            std::to_string(group->rank()) + ")" : std::string(), "; every process must run the same command on the "
            "same files");
}

TrainOutcome run_training(TrainTask& task, const LoopOptions& o, const std::string& out_dir) {
  Module& model = task.model();
  require_training_fits(model);
  model.train();
  AdamW opt(model.parameters(), {.lr = o.lr, .eps = o.adam_eps, .weight_decay = o.weight_decay});
  const int64_t total = task.total_steps();
  Resumed s;
  s.best = task.worst_score();
  if (o.resume) s = resume_from(task, opt, out_dir);
  ProcessGroup* group = o.group && o.group->size() > 1 ? o.group : nullptr;
  const bool writer = !group || group->rank() == 0;  // validates, saves and reports
  const int64_t processes = group ? group->size() : 1;
  QKV_CHECK(!o.resume || s.processes == processes, "train --resume: this run was saved by ", s.processes,
            s.processes == 1 ? " process" : " processes", ", not ", processes, "; resume it with as many",
            s.processes > 1 ? " (mpirun -np " + std::to_string(s.processes) + ")" : std::string(),
            ", so that each process continues its own random stream exactly");
  std::unique_ptr<GradientReducer> reducer;
  if (group) {
    require_same_everywhere(group, weights_hash(model), o.resume ? "resumed weights" : "initial weights");
    own_rng_streams(model, *group, s, o.resume);
    s.processes = group->size();
    reducer = std::make_unique<GradientReducer>(model.parameters(), *group);
  }
  const Shard shard = shard_of(group);
  TrainOutcome timing;  // its seconds, for every return
  auto outcome = [&](int64_t last_step, std::string why) {
    const double waited = timing.wait_seconds + (reducer ? reducer->waited_seconds() : 0.0);
    return TrainOutcome{last_step, std::move(why), timing.step_seconds, waited};
  };
  SkipCounter skips{.total = s.skipped, .max_in_a_row = o.max_skipped_in_a_row};
  const int64_t first_step = s.step + 1;
  int64_t units = 0;
  auto start = std::chrono::steady_clock::now();
  for (int64_t step = first_step; step <= total; ++step) {
    const float lr = task.lr_at(step) * (float)s.lr_scale;
    opt.set_lr(lr);
    opt.zero_grad();
    const auto step_start = std::chrono::steady_clock::now();
    StepLoss loss;
    {  // the forward under the run's precision; each op's backward keeps the one it recorded
      Bf16AutocastGuard mixed(o.precision == Precision::Bf16);
      loss = task.step_loss(step, shard);
    }
    if (group) combine_shards(*group, loss, timing.wait_seconds);
    const bool taken = step_if_finite(loss.loss, loss.value, model, opt, o.clip_norm, skips, step, out_dir, reducer.get());
    timing.step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    if (taken) {
      task.stepped(step, loss);
      units += loss.units;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double done = (double)(step - first_step + 1);
      if (writer)
        task.progress(step, loss.value, lr, units / std::max(secs, 1e-9), secs / done * (double)(total - step),
                      skips.total);
    }
    if (!task.validate_after(step)) continue;
    // With a group, rank 0 validates and saves, and the others learn its
    // score, so that every process keeps the same best, patience and lr.
    if (group) require_same_everywhere(group, weights_hash(model), "weights after step " + std::to_string(step));
    Validation v;
    int stopped = 0;
    if (writer) v = task.validate(step, loss.value);
    if (group) {
      double score[2] = {v.score, v.tiebreak};
      group->broadcast(score, sizeof score, 0);
      v.score = score[0], v.tiebreak = score[1];
    }
    const bool best =
        task.better(v.score, s.best) || (!task.better(s.best, v.score) && v.tiebreak > s.tiebreak);
    if (best) {
      s.best = v.score, s.tiebreak = v.tiebreak, s.since_best = 0;
    } else {
      ++s.since_best;
      if (o.plateau_factor > 0 && o.plateau_patience > 0 && s.since_best % o.plateau_patience == 0)
        s.lr_scale *= o.plateau_factor;
    }
    std::vector<std::pair<std::string, Tensor>> counters;
    if (group) counters = rank_counters(model, *group);  // a collective: every process takes part
    if (writer && save_validation(task, o, s, v, best, step, skips.total, model, opt, out_dir, std::move(counters)))
      stopped = 1;
    if (group) group->broadcast(&stopped, sizeof stopped, 0);
    if (stopped && step < total) return outcome(step, "stopped after the validation at step " + std::to_string(step));
    if (o.patience > 0 && s.since_best >= o.patience && step < total)
      return outcome(step, "early stopping: " + std::to_string(s.since_best) + " validations in a row without a better "
                   "score (patience " + std::to_string(o.patience) + ")");
  }
  return outcome(total, "");
}

}  // namespace qkv
