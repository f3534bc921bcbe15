// The qkv program's subcommands. Each registers its flags on the CLI11 app
// and returns the function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace qkv::cli {

using Run = std::function<int()>;

Run add_inspect(CLI::App& app);
Run add_demo(CLI::App& app);
Run add_bench(CLI::App& app);
Run add_data(CLI::App& app);
Run add_train(CLI::App& app);
Run add_translate(CLI::App& app);
Run add_eval(CLI::App& app);

}  // namespace qkv::cli

namespace qkv {
struct TranslationModel;
}

namespace qkv::cli {

// The cross-attention of `source` (last decoder layer, mean of its heads) as an SVG picture at `path`.
void write_attention_map(TranslationModel& m, const std::string& source, const std::string& path, int64_t max_len);

// Sets the OpenMP (and so OpenBLAS) thread count; 0 keeps the default.
void set_threads(int threads);
int thread_count();

}  // namespace qkv::cli
