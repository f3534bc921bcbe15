// qkv bench SUITE: measurements, side by side with the peer in the same run.
//
//   ops   our matmul / linear ops against raw OpenBLAS sgemm on the same
//         shapes (GFLOP/s and their ratio); softmax, layer norm and GELU in
//         GB/s; memory requests to the system per warm training step.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "qkv/allocator.h"
#include "qkv/nn.h"
#include "qkv/optim.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {
namespace {

struct BenchArgs {
  std::string suite;
  bool json = false;
  int threads = 0;
  double seconds = 0.2;  // per measurement round
};

// Best time per call over 5 rounds, each of enough calls to last `seconds`.
template <class F>
double seconds_per_call(F&& f, double seconds) {
  using clock = std::chrono::steady_clock;
  f();  // warm up caches and the allocator
  int calls = 1;
  for (;;) {
    auto t0 = clock::now();
    for (int i = 0; i < calls; ++i) f();
    double dt = std::chrono::duration<double>(clock::now() - t0).count();
    if (dt >= seconds / 4 || calls >= (1 << 20)) break;
    calls *= 2;
  }
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    auto t0 = clock::now();
    for (int i = 0; i < calls; ++i) f();
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count() / calls);
  }
  return best;
}

struct GemmRow {
  std::string name;
  int64_t batch, m, n, k;
  bool weight_layout;  // x [m,k] times W^T with W [n,k], as nn.Linear
};

nlohmann::ordered_json bench_gemm(const GemmRow& r, double seconds) {
  Rng rng(0);
  NoGradGuard no_grad;
  const double flops = 2.0 * r.batch * r.m * r.n * r.k;
  Tensor a = Tensor::randn({r.batch, r.m, r.k}, rng);
  Tensor b = r.weight_layout ? Tensor::randn({r.n, r.k}, rng) : Tensor::randn({r.batch, r.k, r.n}, rng);
  Tensor c = Tensor::empty({r.batch, r.m, r.n});
  double ours;
  if (r.weight_layout) {
    Tensor a2 = a.reshape({r.batch * r.m, r.k});
    ours = seconds_per_call([&] { linear(a2, b); }, seconds);
  } else {
    ours = seconds_per_call([&] { matmul(a, b); }, seconds);
  }
  // The peer: OpenBLAS sgemm straight on the same buffers, no tensors, no allocation.
  double raw = seconds_per_call(
      [&] {
        if (r.weight_layout) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)(r.batch * r.m), (blasint)r.n, (blasint)r.k,
                      1.0f, a.data<float>(), (blasint)r.k, b.data<float>(), (blasint)r.k, 0.0f, c.data<float>(),
                      (blasint)r.n);
        } else {
          for (int64_t i = 0; i < r.batch; ++i)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)r.m, (blasint)r.n, (blasint)r.k, 1.0f,
                        a.data<float>() + i * r.m * r.k, (blasint)r.k, b.data<float>() + i * r.k * r.n, (blasint)r.n,
                        0.0f, c.data<float>() + i * r.m * r.n, (blasint)r.n);
        }
      },
      seconds);
  return {{"name", r.name},
          {"shape", std::to_string(r.batch) + "x[" + std::to_string(r.m) + "x" + std::to_string(r.k) + "]@[" +
                        std::to_string(r.k) + "x" + std::to_string(r.n) + "]"},
          {"qkv_gflops", flops / ours / 1e9},
          {"sgemm_gflops", flops / raw / 1e9},
          {"ratio", raw / ours}};
}

nlohmann::ordered_json bench_bandwidth(const std::string& name, const Shape& shape, double seconds) {
  Rng rng(0);
  NoGradGuard no_grad;
  Tensor x = Tensor::randn(shape, rng);
  Tensor w = Tensor::ones({shape.back()}), b = Tensor::zeros({shape.back()});
  double t = seconds_per_call(
      [&] {
        if (name == "softmax") softmax(x);
        else if (name == "layer_norm") layer_norm(x, w, b);
        else gelu(x);
      },
      seconds);
  double bytes = 2.0 * (double)x.numel() * 4;  // read x once, write y once
  return {{"op", name}, {"shape", shape_str(shape)}, {"gb_per_s", bytes / t / 1e9}, {"ms", t * 1e3}};
}

// System allocations and bytes in use across warm steps of a transformer-sized MLP block.
nlohmann::ordered_json bench_allocations() {
  Rng rng(0);
  MLP mlp({256, 1024, 256, Activation::Gelu}, rng);
  LayerNorm norm(256);
  AdamW opt(mlp.parameters(), {});
  Tensor x = Tensor::randn({2048, 256}, rng);
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = mean(mul(mlp.forward(norm.forward(x)), x));
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step();
  AllocatorStats before = allocator_stats();
  const int steps = 10;
  for (int i = 0; i < steps; ++i) step();
  AllocatorStats after = allocator_stats();
  return {{"model", "LayerNorm + MLP 256->1024->256 on 2048 tokens, AdamW"},
          {"system_allocs_per_warm_step", (double)(after.system_allocs - before.system_allocs) / steps},
          {"cache_hits_per_warm_step", (double)(after.cache_hits - before.cache_hits) / steps},
          {"peak_bytes_in_use", after.peak_bytes_in_use}};
}

int run_bench(const BenchArgs& a) {
  QKV_CHECK(a.suite == "ops", "bench: unknown suite '", a.suite, "' (available: ops)");
  set_threads(a.threads);
  std::vector<GemmRow> gemms = {
      {"square 256", 1, 256, 256, 256, false},
      {"square 512", 1, 512, 512, 512, false},
      {"square 1024", 1, 1024, 1024, 1024, false},
      {"qkv projection", 1, 2048, 768, 256, true},
      {"ffn expand", 1, 2048, 1024, 256, true},
      {"ffn contract", 1, 2048, 256, 1024, true},
      {"vocab projection", 1, 2048, 8000, 256, true},
      {"attention scores", 256, 32, 32, 64, false},
  };
  nlohmann::ordered_json out;
  out["suite"] = "ops";
  out["threads"] = thread_count();
  out["matmul"] = nlohmann::ordered_json::array();
  if (!a.json) {
    std::printf("qkv bench ops (%d threads); peer: raw OpenBLAS sgemm on the same buffers in the same run\n\n",
                thread_count());
    std::printf("%-18s %-26s %10s %12s %7s\n", "matmul", "shape", "qkv GF/s", "sgemm GF/s", "ratio");
  }
  for (const GemmRow& r : gemms) {
    auto row = bench_gemm(r, a.seconds);
    out["matmul"].push_back(row);
    if (!a.json)
      std::printf("%-18s %-26s %10.1f %12.1f %7.2f\n", r.name.c_str(), row["shape"].get<std::string>().c_str(),
                  row["qkv_gflops"].get<double>(), row["sgemm_gflops"].get<double>(), row["ratio"].get<double>());
  }
  out["bandwidth"] = nlohmann::ordered_json::array();
  if (!a.json) std::printf("\n%-18s %-26s %10s %12s\n", "memory-bound op", "shape", "GB/s", "ms");
  for (auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{
           {"softmax", {4096, 1024}}, {"layer_norm", {8192, 256}}, {"gelu", {2048, 1024}}}) {
    auto row = bench_bandwidth(name, shape, a.seconds);
    out["bandwidth"].push_back(row);
    if (!a.json)
      std::printf("%-18s %-26s %10.1f %12.3f\n", name.c_str(), shape_str(shape).c_str(), row["gb_per_s"].get<double>(),
                  row["ms"].get<double>());
  }
  out["allocations"] = bench_allocations();
  if (a.json) {
    std::cout << out.dump(2) << "\n";
  } else {
    auto& al = out["allocations"];
    std::printf("\nallocations: %s\n  system allocations per warm step %.1f, cache hits per step %.0f, peak %.1f MB\n",
                al["model"].get<std::string>().c_str(), al["system_allocs_per_warm_step"].get<double>(),
                al["cache_hits_per_warm_step"].get<double>(), al["peak_bytes_in_use"].get<double>() / 1e6);
  }
  return 0;
}

}  // namespace

Run add_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "Measure speed side by side with a peer (suites: ops)");
  sub->add_option("suite", args->suite, "Which benchmark: ops")->required();
  sub->add_flag("--json", args->json, "Print one JSON object instead of tables");
  sub->add_option("--threads", args->threads, "Threads (0: all cores)")->capture_default_str();
  sub->add_option("--seconds", args->seconds, "Seconds per measurement round")->capture_default_str();
  return [args] { return run_bench(*args); };
}

}  // namespace qkv::cli
