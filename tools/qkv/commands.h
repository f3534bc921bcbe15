// The qkv program's subcommands. Each registers its flags on the CLI11 app
// and returns the function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace qkv::cli {

using Run = std::function<int()>;

Run add_inspect(CLI::App& app);
Run add_demo(CLI::App& app);
Run add_bench(CLI::App& app);
Run add_data(CLI::App& app);
Run add_train(CLI::App& app);
Run add_translate(CLI::App& app);
Run add_eval(CLI::App& app);
Run add_classify(CLI::App& app);
Run add_generate(CLI::App& app);
Run add_chat(CLI::App& app);
Run add_embed(CLI::App& app);
Run add_serve(CLI::App& app);
Run add_info(CLI::App& app);
Run add_average(CLI::App& app);
Run add_convert(CLI::App& app);

// What runs the figures (cmd_info.cpp): the CPU, its features, the kernel
// level, the GEMM library and its kernel, the threads. `qkv info --json` and
// every `qkv bench --json` carry it.
nlohmann::ordered_json runtime_json();

}  // namespace qkv::cli

namespace qkv {
class ProcessGroup;
struct TranslationModel;
struct LmCallbacks;
struct VitCallbacks;
class Module;
}

namespace qkv::cli {

// The processes of an MPI launch (mpirun -np N qkv train; main.cpp), or
// null for a process alone; and how many of them share this machine.
ProcessGroup* process_group();
int local_processes();

// The cross-attention of `source` (its ids `src`; last decoder layer, mean of
// its heads) as an SVG picture at `path`.
void write_attention_map(TranslationModel& m, const std::string& source, const std::vector<int64_t>& src,
                         const std::string& path, int64_t max_len);

// The flags of qkv train (cmd_translate.cpp), for every domain. A flag given
// is checked when parsed (a step count of at least 1, a positive finite lr);
// one not given stays 0 (-1 for the seed, empty for the precision) and keeps
// the config's value.
struct TrainArgs {
  std::string config, train, valid, out;  // for vit, train and valid are IDX folders
  std::string init;                       // a model folder to fine-tune (empty: a new model from the config)
  int64_t steps = 0, batch_tokens = 0, epochs = 0;
  double lr = 0;
  int64_t seed = -1;
  std::string precision;
  int threads = 0;
  bool replace_invalid = false;
  bool resume = false;
};

// The last lines of qkv train: why the run ended early, if it did, and the folder.
template <class Outcome>
void print_train_end(const Outcome& outcome, const std::string& out_dir) {
  if (!outcome.stopped_early.empty())
    std::printf("stopped at step %lld: %s\n", (long long)outcome.last_step, outcome.stopped_early.c_str());
  if (outcome.wait_seconds > 0)
    std::printf("all-reduce: %.1f%% of the step time waiting for the other processes (%.2f s of %.2f s)\n",
                100 * outcome.wait_seconds / std::max(outcome.step_seconds, 1e-9), outcome.wait_seconds,
                outcome.step_seconds);
  std::printf("model: %s\n", out_dir.c_str());
}

// The Vision Transformer behind qkv train and qkv eval (cmd_vit.cpp), for
// configs and folders of the Vision domain (qkv/registry.h): what qkv train
// prints of a vit's training, and its evaluation.
VitCallbacks vit_train_printers();
int run_vit_eval(const std::string& model_dir, const std::string& test_dir, bool json, const std::string& dtype);

// Decoder-only language models behind qkv train and qkv eval (cmd_lm.cpp),
// for the Language domain: what qkv train prints, and perplexity on a text file.
LmCallbacks lm_train_printers();
int run_lm_eval(const std::string& model_dir, const std::string& test, bool json, const std::string& dtype);

// A one-line progress bar: "[####....] <position>  <stats>  ETA 1m05s", redrawn
// in place on a terminal; otherwise a line every total/lines steps.
void print_progress(int64_t step, int64_t total, const std::string& position, const std::string& stats,
                    double eta_seconds, int64_t skipped, int64_t lines = 10);

// --dtype f32|bf16|f16|int8 of the commands that run a model (generate,
// translate, classify, embed, eval, serve): the loaders build every Linear
// weight in it and fill it from the files (LoadOptions::dtype); without the
// flag they stay as the folder stores them.
void add_dtype_option(CLI::App* sub, std::string& dtype);

// Sets the OpenMP (and so OpenBLAS) thread count; 0 keeps the default; a
// negative count or one above 1024 is a qkv::Error.
void set_threads(int threads);
int thread_count();

}  // namespace qkv::cli
