// qkv — attention and Transformers, trained, run and shown from C++.
//
// Errors are one line on stderr starting with "qkv: " and a non-zero exit.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <iostream>
#include <map>

#include "qkv/cpu.h"
#include "qkv/error.h"
#ifdef QKV_WITH_MPI
#include "qkv/mpi.h"
#endif
#include "qkv/process_group.h"
#include "qkv/nn.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {

// OpenMP starts every thread asked for; libgomp overflowed its stack at
// --threads 100000. A thousand is far past any useful count on one machine.
constexpr int kMaxThreads = 1024;

namespace {
std::unique_ptr<ProcessGroup> g_world;  // an MPI launch's processes
int g_local_processes = 1;
}  // namespace

ProcessGroup* process_group() { return g_world.get(); }
int local_processes() { return g_local_processes; }

// 0: all cores, shared among the processes of an MPI launch on this machine.
void set_threads(int threads) {
  QKV_CHECK(threads >= 0 && threads <= kMaxThreads, "--threads ", threads, ": expected 0 (all cores) or 1 to ",
            kMaxThreads);
  if (threads == 0 && g_local_processes > 1) threads = std::max(1, omp_get_max_threads() / g_local_processes);
  if (threads > 0) omp_set_num_threads(threads);
}

// Started by mpirun: join the launch's processes (only qkv train runs across
// them; a build without MPI refuses a launch of more than one).
void join_mpi_launch(int& argc, char**& argv) {
#ifdef QKV_WITH_MPI
  if (!launched_by_mpi()) return;
  g_world = mpi_world(argc, argv);
  g_local_processes = mpi_local_size();
#else
  (void)argc, (void)argv;
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!size) size = std::getenv("PMI_SIZE");
  QKV_CHECK(!size || std::string(size) == "1", "this qkv was built without MPI, so it cannot train with ", size,
            " processes: install libopenmpi-dev (scripts/install-deps.sh) and rebuild");
#endif
}
int thread_count() { return omp_get_max_threads(); }

void add_dtype_option(CLI::App* sub, std::string& dtype) {
  sub->add_option("--dtype", dtype,
                  "Every Linear weight in this dtype, built so and filled from the files as they are read (a bf16 "
                  "checkpoint loads without a float32 copy): f32; bf16 (bfloat16, half the bytes to read); f16 "
                  "(IEEE half, half the bytes); or int8 (blockwise int8, about a quarter). Sums stay float32; `qkv "
                  "info` shows the kernels. Default: as the folder stores them (qkv convert writes bf16, f16 and int8 "
                  "folders)")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "int8"}));
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
  add(qkv::cli::add_chat);
  add(qkv::cli::add_embed);
  add(qkv::cli::add_serve);
  add(qkv::cli::add_average);
  add(qkv::cli::add_convert);
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
  // An error in one process of an MPI launch ends them all at once: the others
  // may be waiting for it in a collective. Rank 0's errors are the program's;
  // another rank names itself.
  auto failed = [](const std::string& what) {
    qkv::ProcessGroup* group = qkv::cli::process_group();
    if (!group || group->size() == 1) {
      std::cerr << "qkv: " << what << "\n";
      return 1;
    }
    // One write, so that the lines of two processes do not interleave.
    const std::string line =
        "qkv" + (group->rank() ? " (process " + std::to_string(group->rank()) + ")" : std::string()) + ": " + what + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
#ifdef QKV_WITH_MPI
    qkv::mpi_abort(1);
#endif
    return 1;
  };
  try {
    qkv::cli::join_mpi_launch(argc, argv);
    qkv::ProcessGroup* group = qkv::cli::process_group();
    for (auto& [sub, run] : runs) {
      if (!sub->parsed()) continue;
      QKV_CHECK(!group || group->size() == 1 || sub->get_name() == "train", "qkv ", sub->get_name(),
                " runs in one process; of the commands only qkv train runs across the processes of mpirun -np ",
                group ? group->size() : 1);
      return run();
    }
  } catch (const qkv::Error& e) {
    return failed(e.what());
  } catch (const std::bad_alloc&) {
    return failed("out of memory (a smaller model, batch or input needs less)");
  } catch (const std::exception& e) {
    return failed(std::string("internal error: ") + e.what());
  }
  return 1;
}
