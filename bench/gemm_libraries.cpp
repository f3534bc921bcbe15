// sgemm of one BLAS-like library, loaded with dlopen, on the shapes of
// `qkv bench ops`: the measurement behind the README's GEMM choice.
// scripts/compare_gemm_libraries.sh runs it once per library (each in its
// own process, since OpenBLAS fixes its kernel when it loads) and prints the
// table in docs/benchmarks.md.
//
// Usage: gemm_libraries LABEL cblas|dnnl LIBRARY.so [SECONDS]
// Prints one JSON object per shape: {"label", "shape", "gflops", "kernel"}.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// cblas_sgemm with CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112.
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                            int);
// dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), row-major.
using DnnlSgemm = int (*)(char, char, long, long, long, float, const float*, long, const float*, long, float, float*,
                          long);

struct Shape {
  const char* name;
  int m, n, k;
  bool trans_b;  // x [m,k] times W^T with W [n,k], as nn.Linear
};

const Shape kShapes[] = {
    {"square 256", 256, 256, 256, false},        {"square 1024", 1024, 1024, 1024, false},
    {"qkv projection", 2048, 768, 256, true},    {"ffn expand", 2048, 1024, 256, true},
    {"ffn contract", 2048, 256, 1024, true},     {"vocab projection", 2048, 8000, 256, true},
    {"vit qkv (128x50 tokens)", 6400, 384, 128, true},
};

template <class F>
double best_seconds(F&& f, double seconds) {
  using clock = std::chrono::steady_clock;
  f();
  int calls = 1;
  for (;;) {
    auto t0 = clock::now();
    for (int i = 0; i < calls; ++i) f();
    if (std::chrono::duration<double>(clock::now() - t0).count() >= seconds / 4 || calls >= (1 << 16)) break;
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s LABEL cblas|dnnl LIBRARY.so [SECONDS]\n", argv[0]);
    return 2;
  }
  const std::string label = argv[1], api = argv[2];
  const double seconds = argc > 4 ? std::atof(argv[4]) : 0.2;
  void* lib = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "gemm_libraries: %s\n", dlerror());
    return 1;
  }
  CblasSgemm cblas = api == "cblas" ? (CblasSgemm)dlsym(lib, "cblas_sgemm") : nullptr;
  DnnlSgemm dnnl = api == "dnnl" ? (DnnlSgemm)dlsym(lib, "dnnl_sgemm") : nullptr;
  if (!cblas && !dnnl) {
    std::fprintf(stderr, "gemm_libraries: %s has no %s sgemm\n", argv[3], api.c_str());
    return 1;
  }
  // The kernel the library says it runs, where it says one.
  std::string kernel = "-";
  if (auto core = (char* (*)())dlsym(lib, "openblas_get_corename")) kernel = core();
  if (auto arch_id = (int (*)())dlsym(lib, "bli_arch_query_id"))
    if (auto arch_name = (const char* (*)(int))dlsym(lib, "bli_arch_string")) kernel = arch_name(arch_id());
  for (const Shape& s : kShapes) {
    std::vector<float> a((size_t)s.m * s.k, 0.5f), b((size_t)s.k * s.n, 0.25f), c((size_t)s.m * s.n);
    const int ldb = s.trans_b ? s.k : s.n;
    auto call = [&] {
      if (cblas)
        cblas(101, 111, s.trans_b ? 112 : 111, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), ldb, 0.0f, c.data(), s.n);
      else
        dnnl('N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), ldb, 0.0f, c.data(), s.n);
    };
    const double t = best_seconds(call, seconds);
    std::printf("{\"label\": \"%s\", \"shape\": \"%s\", \"gflops\": %.1f, \"kernel\": \"%s\"}\n", label.c_str(),
                s.name, 2.0 * s.m * s.n * s.k / t / 1e9, kernel.c_str());
    std::fflush(stdout);
  }
  return 0;
}
