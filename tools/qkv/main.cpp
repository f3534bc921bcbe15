// qkv — attention and Transformers, trained, run and shown from C++.
//
// Errors are one line on stderr starting with "qkv: " and a non-zero exit.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <iostream>
#include <map>

#include "qkv/cpu.h"
#include "qkv/error.h"
#include "qkv/nn.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {

// OpenMP starts every thread asked for; libgomp overflowed its stack at
// --threads 100000. A thousand is far past any useful count on one machine.
constexpr int kMaxThreads = 1024;

void set_threads(int threads) {
  QKV_CHECK(threads >= 0 && threads <= kMaxThreads, "--threads ", threads, ": expected 0 (all cores) or 1 to ",
            kMaxThreads);
  if (threads > 0) omp_set_num_threads(threads);
}
int thread_count() { return omp_get_max_threads(); }

void add_dtype_option(CLI::App* sub, std::string& dtype) {
  sub->add_option("--dtype", dtype,
                  "f32, or bf16: every Linear weight converted to bfloat16 after loading (half the bytes to read; "
                  "float32 sums; `qkv info` shows the kernel)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
}

void apply_dtype(Module& model, const std::string& dtype) {
  if (dtype == "bf16") model.convert_linear_weights(DType::BF16);
}

void print_progress(int64_t step, int64_t total, const std::string& position, const std::string& stats,
                    double eta_seconds, int64_t skipped, int64_t lines) {
  static const bool tty = isatty(STDOUT_FILENO);
  if (!tty && step % std::max<int64_t>(1, total / lines) != 0 && step != 1) return;
  const int width = 24, filled = (int)(width * step / std::max<int64_t>(total, 1));
  std::printf("%s[%s%s] %s  %s  ETA %dm%02ds%s", tty ? "\r" : "", std::string(filled, '#').c_str(),
              std::string(width - filled, '.').c_str(), position.c_str(), stats.c_str(), (int)eta_seconds / 60,
              (int)eta_seconds % 60, skipped ? ("  skipped " + std::to_string(skipped)).c_str() : "");
  if (!tty) std::putchar('\n');
  std::fflush(stdout);
}

}  // namespace qkv::cli

int main(int argc, char** argv) {
  CLI::App app{"qkv: attention and Transformers end to end -- train, run fast, and show what they attend to."};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] { return "qkv 0.1.0\n" + qkv::runtime_summary(); });
  std::map<CLI::App*, qkv::cli::Run> runs;
  auto add = [&](qkv::cli::Run (*adder)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    qkv::cli::Run run = adder(app);
    runs[app.get_subcommands({})[before]] = run;
  };
  add(qkv::cli::add_demo);
  add(qkv::cli::add_data);
  add(qkv::cli::add_train);
  add(qkv::cli::add_translate);
  add(qkv::cli::add_eval);
  add(qkv::cli::add_classify);
  add(qkv::cli::add_generate);
  add(qkv::cli::add_serve);
  add(qkv::cli::add_average);
  add(qkv::cli::add_inspect);
  add(qkv::cli::add_bench);
  add(qkv::cli::add_info);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '\n') c = ' ';
    std::cerr << "qkv: " << msg << " (see qkv --help)\n";
    return 2;
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const qkv::Error& e) {
    std::cerr << "qkv: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "qkv: out of memory (a smaller model, batch or input needs less)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "qkv: internal error: " << e.what() << "\n";
    return 1;
  }
  return 1;
}
