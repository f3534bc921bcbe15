// qkv info: which CPU this is and what runs on it (kernel level, GEMM
// library and kernel, threads), the header of every `qkv bench` as well.
#include <cstdio>
#include <iostream>

#include "qkv/cpu.h"
#ifdef QKV_WITH_MPI
#include "qkv/mpi.h"
#endif
#include "tools/qkv/commands.h"

namespace qkv::cli {

// What `mpirun -np N qkv train` runs on, or that this build cannot.
std::string mpi_text() {
#ifdef QKV_WITH_MPI
  return mpi_library();
#else
  return "not built (install libopenmpi-dev and rebuild)";
#endif
}

nlohmann::ordered_json runtime_json() {
  const CpuInfo& cpu = cpu_info();
  const BlasInfo& blas = blas_info();
  return {{"cpu", cpu.model_name},
          {"vendor", cpu.vendor},
          {"family", cpu.family},
          {"model", cpu.model},
          {"features", cpu.features},
          {"features_off", features_turned_off()},
          {"kernels", isa_name(cpu_isa())},
          {"best_kernels", isa_name(cpu.best)},
          {"gemm", blas.library},
          {"gemm_kernel", blas.core},
          {"gemm_kernel_chosen_by", blas.chosen_by},
          {"gemm_f32", gemm_f32_path()},
          {"gemm_decode", gemm_decode_path()},
          {"gemm_bf16", gemm_bf16_path()},
          {"gemm_f16", gemm_f16_path()},
          {"gemm_int8", gemm_int8_path()},
          {"threads", thread_count()},
          {"mpi", mpi_text()}};
}

namespace {
struct InfoArgs {
  bool json = false;
  int threads = 0;
};
}  // namespace

Run add_info(CLI::App& app) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* sub = app.add_subcommand("info", "Show the CPU, its features, and the kernels and GEMM qkv runs on it");
  sub->add_flag("--json", args->json, "Print one JSON object instead of lines");
  sub->add_option("--threads", args->threads, "Threads (0: all cores)")->capture_default_str();
  return [args] {
    set_threads(args->threads);
    if (args->json) std::cout << runtime_json().dump(2) << "\n";
    else std::printf("%smpi:      %s\n", runtime_summary().c_str(), mpi_text().c_str());
    return 0;
  };
}

}  // namespace qkv::cli
