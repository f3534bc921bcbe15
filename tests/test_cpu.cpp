// The CPU features, the kernel level chosen from them, and the GEMM kernel
// that follows: what `qkv info` reports is what runs, a forced level is the
// one that runs, and every level this CPU supports computes the same numbers
// as the reference kernels (CTest also runs the whole kernel table under each
// level; these check all levels in one process).
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "qkv/cpu.h"
#include "qkv/rng.h"
#include "src/kernels/kernels.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

const std::vector<CpuIsa> kLevels = {CpuIsa::Generic, CpuIsa::Avx2, CpuIsa::Avx512};

// QKV_CPU_FEATURES_OFF's list: the extensions that can be turned off, and a
// clear error for anything else (a typo must not silently test nothing).
TEST(Cpu, FeaturesOffAreOnlyTheSwitchableExtensions) {
  EXPECT_TRUE(parse_features_off("").empty());
  EXPECT_EQ(parse_features_off("amx_bf16,avx512_vnni"), (std::vector<std::string>{"amx_bf16", "avx512_vnni"}));
  for (const char* bad : {"avx512f", "amx-bf16", "amx_bf16,", ",avx512_bf16", "avx512_bf16 "}) {
    const std::string error = testing::error_of([&] { parse_features_off(bad); });
    EXPECT_NE(error.find("cannot turn off"), std::string::npos) << bad << ": " << error;
    EXPECT_NE(error.find("avx512_vnni"), std::string::npos) << bad << ": the names that can be";
  }
}

// Under QKV_CPU_FEATURES_OFF (make test's plain_extensions tests) the
// extensions turned off are not used: the low-precision kernels say they take
// the paths of a CPU without them. (Whether those paths compute the right
// values is for the kernel and model tests run under the same variable.)
TEST(Cpu, TurnedOffFeaturesAreNotUsed) {
  const std::vector<std::string>& off = features_turned_off();
  if (off.empty()) GTEST_SKIP() << "QKV_CPU_FEATURES_OFF is not set";
  for (const std::string& f : off) EXPECT_FALSE(feature_usable(f)) << f;
  auto is_off = [&](const char* f) { return std::find(off.begin(), off.end(), f) != off.end(); };
  const std::string bf16 = gemm_bf16_path(), int8 = gemm_int8_path();
  const bool no_amx_bf16 = is_off("amx_bf16") || is_off("amx_tile"),
             no_amx_int8 = is_off("amx_int8") || is_off("amx_tile");
  EXPECT_TRUE(!no_amx_bf16 || bf16.find("AMX") == std::string::npos) << bf16;
  EXPECT_TRUE(!(no_amx_bf16 && is_off("avx512_bf16")) || bf16.find("AVX512-BF16") == std::string::npos) << bf16;
  EXPECT_TRUE(!is_off("avx512_vnni") || int8.find("VNNI") == std::string::npos) << int8;
  EXPECT_TRUE(!no_amx_int8 || int8.find("AMX") == std::string::npos) << int8;
}

TEST(Cpu, LevelFollowsFeatures) {
  const CpuInfo& cpu = cpu_info();
  EXPECT_FALSE(cpu.vendor.empty());
  EXPECT_TRUE(cpu.has("sse2")) << "every x86-64 CPU has SSE2";
  // GCC's x86-64-v3 and -v4, the sets the variants are compiled for.
  auto all = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (!cpu.has(n)) return false;
    return true;
  };
  const bool v3 = all({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "lzcnt", "movbe"});
  const bool v4 = v3 && all({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"});
  EXPECT_EQ(cpu.best, v4 ? CpuIsa::Avx512 : v3 ? CpuIsa::Avx2 : CpuIsa::Generic);
  for (CpuIsa isa : kLevels) {
    EXPECT_EQ(isa_supported(isa), (int)isa <= (int)cpu.best) << isa_name(isa);
    EXPECT_EQ(parse_isa(isa_name(isa)), isa);
    if (!isa_supported(isa)) {
      EXPECT_THROW(cpu::kernels(isa), Error) << isa_name(isa) << " is above what this CPU runs";
    } else {
      EXPECT_EQ(cpu::kernels(isa).isa, isa);
    }
  }
  EXPECT_THROW(parse_isa("avx3"), Error);
}

TEST(Cpu, TheForcedLevelIsTheOneThatRuns) {
  const char* forced = std::getenv("QKV_ISA");
  const CpuIsa expected = forced && *forced ? parse_isa(forced) : cpu_info().best;
  EXPECT_EQ(cpu_isa(), expected);
  EXPECT_EQ(cpu::kernels().isa, expected);
  const std::string summary = runtime_summary();
  EXPECT_NE(summary.find(std::string("kernels:  ") + isa_name(expected)), std::string::npos) << summary;
  const char* decode = expected == CpuIsa::Avx512 ? "decode:   register tiles of 16 lanes"
                       : expected == CpuIsa::Avx2 ? "decode:   register tiles of 8 lanes"
                                                  : "decode:   BLAS";
  EXPECT_NE(summary.find(decode), std::string::npos) << summary;
}

TEST(Cpu, GemmKernelFollowsTheLevel) {
  // OpenBLAS's own choice goes by CPU model and fell back to SSE3 kernels on
  // a Xeon it did not know; qkv's goes by the level in use.
  const BlasInfo& blas = blas_info();
  EXPECT_NE(blas.library.find("OpenBLAS"), std::string::npos) << blas.library;
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  if (user && *user) GTEST_SKIP() << "OPENBLAS_CORETYPE=" << user << " is set: the user's choice wins";
  switch (cpu_isa()) {
    case CpuIsa::Avx512: EXPECT_TRUE(blas.core == "SkylakeX" || blas.core == "Cooperlake") << blas.core; break;
    case CpuIsa::Avx2: EXPECT_TRUE(blas.core == "Haswell" || blas.core == "Zen") << blas.core; break;
    case CpuIsa::Generic:
      EXPECT_TRUE(blas.core == "Sandybridge" || blas.core == "Nehalem" || blas.core == "Prescott") << blas.core;
      break;
  }
}

// Each level the CPU runs against the reference on a few kernels in one
// process: the GEMM through BLAS, through the streaming GEMV (3 rows outside
// inference) and (avx512 and avx2, in inference) through the register tiles
// of a few rows (3 and 13 rows: tiles of 4 or 2 with one left over; 45
// columns: one left over; k 130: a masked tail of 2), on one thread
// and (37 x 301 x 203) split between two; softmax, layer norm and GELU (the
// vectorized exp and erf). Dropping the masked tail of the tiles' k loop
// failed both tiled cases.
TEST(Cpu, EveryLevelMatchesTheReference) {
  omp_set_num_threads(2);
  Rng rng(5);
  const int64_t m = 67, n = 45, k = 130;
  Tensor a = Tensor::randn({m, k}, rng), w = Tensor::randn({n, k}, rng), bias = Tensor::randn({n}, rng);
  Tensor x = Tensor::randn({33, 70}, rng);
  for (CpuIsa isa : kLevels) {
    if (!isa_supported(isa)) continue;
    const Kernels& fast = cpu::kernels(isa);
    for (auto [rows, inference] : {std::pair{m, true}, {3, false}, {3, true}, {13, true}}) {
      GemmArgs g;
      g.trans_b = true, g.m = rows, g.n = n, g.k = k, g.inference = inference;
      g.a = a.data<float>(), g.lda = k, g.b = w.data<float>(), g.ldb = k, g.bias = bias.data<float>(), g.ldc = n;
      Tensor c_fast = Tensor::zeros({rows, n}), c_ref = Tensor::zeros({rows, n});
      g.c = c_fast.data<float>();
      fast.gemm(g);
      g.c = c_ref.data<float>();
      ref::gemm(g);
      EXPECT_TRUE(testing::gemm_close(c_fast, c_ref, a.slice(0, 0, rows), w, bias))
          << isa_name(isa) << " gemm " << rows << (inference ? " inference" : "");
    }
    // Large enough for the tiles to split W's rows between the threads; alpha
    // and beta too. With k 2051 a block of W (kTiledBlockBytes) is 12 rows,
    // so each thread goes through a dozen blocks, its last one short; 2 rows
    // (one tile: W's rows swept in four strided quarters) at k 2051 split
    // between the threads too.
    for (auto [rows, depth] : {std::pair<int64_t, int64_t>{37, 203}, {37, 2051}, {2, 2051}}) {
      Tensor a2 = Tensor::randn({rows, depth}, rng), w2 = Tensor::randn({301, depth}, rng);
      GemmArgs g;
      g.trans_b = true, g.m = rows, g.n = 301, g.k = depth, g.alpha = 0.5f, g.beta = 0.0f, g.inference = true;
      g.a = a2.data<float>(), g.lda = depth, g.b = w2.data<float>(), g.ldb = depth, g.ldc = 301;
      Tensor c_fast = Tensor::full({rows, 301}, NAN), c_ref = Tensor::full({rows, 301}, NAN);
      g.c = c_fast.data<float>();
      fast.gemm(g);
      g.c = c_ref.data<float>();
      ref::gemm(g);
      EXPECT_TRUE(testing::gemm_close(g, Tensor::zeros({rows, 301}), c_fast, c_ref))
          << isa_name(isa) << " gemm " << rows << " x " << depth;
    }
    const int64_t r = x.size(0), cols = x.size(1);
    Tensor y_fast = Tensor::empty(x.shape()), y_ref = Tensor::empty(x.shape());
    const testing::Float32Bound row_bound{.terms = cols, .stages = 4};
    fast.softmax_forward(x.data<float>(), y_fast.data<float>(), r, cols);
    ref::softmax_forward(x.data<float>(), y_ref.data<float>(), r, cols);
    EXPECT_TRUE(testing::float32_close(y_fast, y_ref, row_bound)) << isa_name(isa) << " softmax";
    Tensor mean = Tensor::empty({r}), rstd = Tensor::empty({r});
    fast.layer_norm_forward(x.data<float>(), nullptr, nullptr, y_fast.data<float>(), mean.data<float>(),
                            rstd.data<float>(), r, cols, 1e-5f);
    ref::layer_norm_forward(x.data<float>(), nullptr, nullptr, y_ref.data<float>(), mean.data<float>(),
                            rstd.data<float>(), r, cols, 1e-5f);
    EXPECT_TRUE(testing::float32_close(y_fast, y_ref, row_bound)) << isa_name(isa) << " layer_norm";
    fast.unary_forward(UnaryOp::Gelu, x.data<float>(), y_fast.data<float>(), x.numel());
    ref::unary_forward(UnaryOp::Gelu, x.data<float>(), y_ref.data<float>(), x.numel());
    // erf to 3e-7 absolute (src/kernels/cpu/vec_math.h): a few units of rounding.
    EXPECT_TRUE(testing::float32_close(y_fast, y_ref, {.terms = 1, .stages = 8})) << isa_name(isa) << " gelu";
  }
}

// LayerNorm with a weight and a bias, forward and backward, on every level
// against the reference: 183 columns take the four vector chains, then the
// vectors of a last partial round (three on avx512, two on avx2) and a
// scalar tail of 7; 150 rows make three of the backward's chunks of 64, the last
// short. The backward runs its three ways: dx with dw and db (one pass), dx
// alone, and dw and db alone (by columns). x has a mean of 3, so a row's
// centring matters.
TEST(Cpu, LayerNormMatchesTheReferenceOnEveryLevel) {
  omp_set_num_threads(2);
  Rng rng(11);
  const int64_t rows = 150, cols = 183;
  Tensor x = Tensor::randn({rows, cols}, rng), w = Tensor::randn({cols}, rng), b = Tensor::randn({cols}, rng);
  Tensor dy = Tensor::randn({rows, cols}, rng);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += 3.0f;
  auto empty = [](std::vector<int64_t> shape) { return Tensor::full(shape, NAN); };
  Tensor y_ref = empty({rows, cols}), mean = empty({rows}), rstd = empty({rows});
  ref::layer_norm_forward(x.data<float>(), w.data<float>(), b.data<float>(), y_ref.data<float>(), mean.data<float>(),
                          rstd.data<float>(), rows, cols, 1e-5f);
  Tensor dx_ref = empty({rows, cols}), dw_ref = empty({cols}), db_ref = empty({cols});
  ref::layer_norm_backward(x.data<float>(), w.data<float>(), mean.data<float>(), rstd.data<float>(), dy.data<float>(),
                           dx_ref.data<float>(), dw_ref.data<float>(), db_ref.data<float>(), rows, cols);
  const testing::Float32Bound by_row{.terms = cols, .stages = 4}, by_column{.terms = rows, .stages = 2};
  for (CpuIsa isa : kLevels) {
    if (!isa_supported(isa)) continue;
    const Kernels& fast = cpu::kernels(isa);
    Tensor y = empty({rows, cols}), m = empty({rows}), rs = empty({rows});
    fast.layer_norm_forward(x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>(), m.data<float>(),
                            rs.data<float>(), rows, cols, 1e-5f);
    EXPECT_TRUE(testing::float32_close(y, y_ref, by_row)) << isa_name(isa) << " y";
    EXPECT_TRUE(testing::float32_close(m, mean, by_row)) << isa_name(isa) << " mean";
    EXPECT_TRUE(testing::float32_close(rs, rstd, by_row)) << isa_name(isa) << " rstd";
    Tensor dx = empty({rows, cols}), dw = empty({cols}), db = empty({cols});
    fast.layer_norm_backward(x.data<float>(), w.data<float>(), mean.data<float>(), rstd.data<float>(), dy.data<float>(),
                             dx.data<float>(), dw.data<float>(), db.data<float>(), rows, cols);
    EXPECT_TRUE(testing::float32_close(dx, dx_ref, by_row)) << isa_name(isa) << " dx";
    EXPECT_TRUE(testing::float32_close(dw, dw_ref, by_column)) << isa_name(isa) << " dw";
    EXPECT_TRUE(testing::float32_close(db, db_ref, by_column)) << isa_name(isa) << " db";
    Tensor dx_alone = empty({rows, cols}), dw_alone = empty({cols}), db_alone = empty({cols});
    fast.layer_norm_backward(x.data<float>(), w.data<float>(), mean.data<float>(), rstd.data<float>(), dy.data<float>(),
                             dx_alone.data<float>(), nullptr, nullptr, rows, cols);
    fast.layer_norm_backward(x.data<float>(), w.data<float>(), mean.data<float>(), rstd.data<float>(), dy.data<float>(),
                             nullptr, dw_alone.data<float>(), db_alone.data<float>(), rows, cols);
    EXPECT_TRUE(testing::float32_close(dx_alone, dx_ref, by_row)) << isa_name(isa) << " dx alone";
    EXPECT_TRUE(testing::float32_close(dw_alone, dw_ref, by_column)) << isa_name(isa) << " dw alone";
    EXPECT_TRUE(testing::float32_close(db_alone, db_ref, by_column)) << isa_name(isa) << " db alone";
  }
}

// qkv's own GEMM (the panels of src/kernels/cpu/gemm_panels.cpp, avx512 and
// avx2) against the reference, every layout of A and B, with alpha, beta, a
// bias and GELU, and three padding columns in C that must stay as they were.
// 67 x 301 splits C's columns between the threads, 301 x 67 its rows; 301
// columns leave a panel part full on both levels (48 and 16 wide); k 300
// takes the reduction in steps of 128, 128 and 44, and with beta 0.5 the sums
// wait in a buffer of their own between steps; k 1100 packs B 512 of its rows
// at a time (three blocks); A^T of k 40 and 64 is read where it lies, not
// packed (kInPlaceDepth). The activation must be GELU
// of the very C written. Starting each later step from zero instead of the
// sums so far fails the cases of k 300 and 130 on both levels; keeping the
// sums in C when beta is not 0 fails them where beta is 0.5 or 1.
TEST(Cpu, ThePanelsMatchTheReference) {
  omp_set_num_threads(2);
  Rng rng(7);
  struct Case {
    bool ta, tb;
    int64_t m, n, k;
    float alpha, beta;
  };
  const Case cases[] = {{false, true, 67, 301, 300, 1.0f, 0.0f},
                        {false, false, 301, 67, 300, 0.5f, 0.5f},
                        {true, false, 67, 301, 130, 1.0f, 1.0f},
                        {true, true, 301, 67, 300, 2.0f, 0.0f},
                        {false, true, 40, 100, 70, 1.0f, 0.5f},
                        {false, false, 40, 100, 1100, 1.0f, 0.5f},
                        {true, false, 67, 130, 1100, 1.0f, 0.0f},
                        // A^T of at most 64 steps, read where it lies (flash attention's P^T)
                        {true, false, 67, 301, 40, 1.0f, 1.0f},
                        {true, true, 130, 67, 64, 0.5f, 0.0f}};
  for (CpuIsa isa : kLevels) {
    if (!isa_supported(isa)) continue;
    const Kernels& fast = cpu::kernels(isa);
    for (const Case& c : cases) {
      const int64_t ldc = c.n + 3;
      Tensor a = c.ta ? Tensor::randn({c.k, c.m}, rng) : Tensor::randn({c.m, c.k}, rng);
      Tensor b = c.tb ? Tensor::randn({c.n, c.k}, rng) : Tensor::randn({c.k, c.n}, rng);
      Tensor bias = Tensor::randn({c.n}, rng), c0 = Tensor::randn({c.m, ldc}, rng);
      GemmArgs g;
      g.trans_a = c.ta, g.trans_b = c.tb, g.m = c.m, g.n = c.n, g.k = c.k, g.alpha = c.alpha, g.beta = c.beta;
      g.a = a.data<float>(), g.lda = c.ta ? c.m : c.k, g.b = b.data<float>(), g.ldb = c.tb ? c.k : c.n;
      g.bias = bias.data<float>(), g.ldc = ldc, g.act = UnaryOp::Gelu, g.ld_act = c.n;
      Tensor c_fast = c0.clone(), c_ref = c0.clone(), act = Tensor::empty({c.m, c.n});
      g.c = c_fast.data<float>(), g.act_out = act.data<float>();
      fast.gemm(g);
      g.c = c_ref.data<float>(), g.act_out = nullptr;
      ref::gemm(g);
      const std::string label = std::string(isa_name(isa)) + " " + std::to_string(c.m) + " x " + std::to_string(c.n) +
                                " x " + std::to_string(c.k) + (c.ta ? " A^T" : "") + (c.tb ? " B^T" : "");
      EXPECT_TRUE(testing::gemm_close(g, c0, c_fast, c_ref)) << label;
      Tensor expect = Tensor::empty({c.m, c.n});
      for (int64_t i = 0; i < c.m; ++i)
        fast.unary_forward(UnaryOp::Gelu, c_fast.data<float>() + i * ldc, expect.data<float>() + i * c.n, c.n);
      EXPECT_EQ(0, std::memcmp(act.data<float>(), expect.data<float>(), sizeof(float) * c.m * c.n)) << label;
    }
  }
}

// The sanitizer build compiles the float32 register tiles' files without
// instrumentation and has them check each range they read and write
// themselves (src/kernels/cpu/range_checked.h): a product whose C is one
// float short must still be reported, in the panels and in the decoding
// tiles. Skipped outside that build.
TEST(CpuDeathTest, TheTilesReportAShortBufferUnderAddressSanitizer) {
#if !defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer builds only (make test-asan)";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  omp_set_num_threads(1);
  const int64_t n = 96, k = 128;
  if (!isa_supported(CpuIsa::Avx2)) GTEST_SKIP() << "no level with tiles on this CPU (avx2 and avx512 have them)";
  for (bool inference : {false, true}) {
    // 64 rows: m n k above kPanelWork, the panels; 8 rows in inference: gemm_tiles.
    const int64_t m = inference ? 8 : 64;
    std::vector<float> a(m * k, 1.0f), b(n * k, 1.0f), c(m * n - 1);
    for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {  // the levels with tiles
      if (!isa_supported(isa)) continue;
      GemmArgs g;
      g.m = m, g.n = n, g.k = k, g.a = a.data(), g.lda = k, g.b = b.data(), g.ldb = k, g.trans_b = true;
      g.c = c.data(), g.ldc = n, g.inference = inference;
      EXPECT_DEATH(cpu::kernels(isa).gemm(g), "heap-buffer-overflow") << isa_name(isa) << " " << m << " rows";
    }
  }
#endif
}

// The panels sum every output in one order, whatever the rows beside it and
// however C is split between the threads: a row of a training product (past
// the GEMV's 4 rows) gets the same bits in a product of 16, 17, 40 or 200
// rows. (BLAS, on the generic level, is not held to it.)
TEST(Cpu, APanelRowDoesNotDependOnTheRowsBesideIt) {
  omp_set_num_threads(2);
  Rng rng(13);
  const int64_t n = 301, k = 300;
  Tensor a = Tensor::randn({200, k}, rng), w = Tensor::randn({n, k}, rng), bias = Tensor::randn({n}, rng);
  int levels = 0;
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (!isa_supported(isa)) continue;
    ++levels;
    const Kernels& fast = cpu::kernels(isa);
    auto product = [&](int64_t m) {
      Tensor c = Tensor::zeros({m, n});
      GemmArgs g;
      g.trans_b = true, g.m = m, g.n = n, g.k = k;
      g.a = a.data<float>(), g.lda = k, g.b = w.data<float>(), g.ldb = k, g.bias = bias.data<float>();
      g.c = c.data<float>(), g.ldc = n;
      fast.gemm(g);
      return c;
    };
    const Tensor all = product(200);
    for (int64_t m : {16, 17, 40}) {
      const Tensor some = product(m);
      EXPECT_EQ(0, std::memcmp(some.data<float>(), all.data<float>(), sizeof(float) * m * n))
          << isa_name(isa) << ": the first " << m << " rows of 200";
    }
  }
  if (levels == 0) GTEST_SKIP() << "this CPU runs neither the avx2 nor the avx512 level";
}

// In inference, a row of A gets the same bits whether it is multiplied alone
// or with others: `qkv serve` relies on it so that a stream's tokens do not
// depend on how many streams share its step. The avx512 and avx2 levels'
// tiles sum every output in one order for 1 to 64 rows; the generic level
// has only BLAS, whose order may change with the shape, and is not held to
// it. 301 columns x 203: one row runs on one thread, 16 rows split W between
// two, the last column a group of its own; x 1003, one row splits W too. Up to
// a tile of rows W is swept in strided quarters, past it in blocks. Sending
// 1-4 rows to the GEMV on avx512 again (as before 2026-12-05) fails this test
// from 5 rows.
TEST(Cpu, AnInferenceRowDoesNotDependOnTheRowsBesideIt) {
  omp_set_num_threads(2);
  for (int64_t k : {203, 1003}) {
    Rng rng(11);
    const int64_t n = 301;
    Tensor a = Tensor::randn({64, k}, rng), w = Tensor::randn({n, k}, rng), bias = Tensor::randn({n}, rng);
    auto product = [&](const Kernels& fast, const float* rows, int64_t m) {
      Tensor c = Tensor::zeros({m, n});
      GemmArgs g;
      g.trans_b = true, g.m = m, g.n = n, g.k = k, g.inference = true;
      g.a = rows, g.lda = k, g.b = w.data<float>(), g.ldb = k, g.bias = bias.data<float>(), g.c = c.data<float>(),
      g.ldc = n;
      fast.gemm(g);
      return c;
    };
    int levels = 0;
    for (CpuIsa isa : kLevels) {
      const int64_t most = isa == CpuIsa::Generic ? 0 : 64;
      if (!isa_supported(isa) || most == 0) continue;
      ++levels;
      const Kernels& fast = cpu::kernels(isa);
      std::vector<Tensor> alone;
      for (int64_t i = 0; i < most; ++i) alone.push_back(product(fast, a.data<float>() + i * k, 1));
      for (int64_t m : {2, 3, 4, 5, 8, 16, 17, 64}) {
        if (m > most) break;
        Tensor together = product(fast, a.data<float>(), m);
        for (int64_t i = 0; i < m; ++i)
          EXPECT_EQ(0, std::memcmp(together.data<float>() + i * n, alone[i].data<float>(), n * sizeof(float)))
              << isa_name(isa) << ": row " << i << " of " << m << ", k " << k;
      }
    }
    if (levels == 0) GTEST_SKIP() << "this CPU runs neither the avx2 nor the avx512 level";
  }
}

// GemmArgs::addend (a residual connection, Linear::forward_add) on every
// level and every path of gemm: the panels add it as they store a tile (C's
// rows split between the threads, then its columns; k 300 in three steps, the
// sums waiting in C; beta 0.5 in a buffer of their own), the inference tiles
// (8 rows), the GEMV (2 rows) and BLAS (below kPanelWork) after the product.
// C must hold the bits of the product without it plus the addend, rounded
// once more, and GELU must be of that sum. Adding the addend before the bias
// in the panels, or leaving it out of a path, fails it.
TEST(Cpu, TheAddendIsAddedAfterTheProduct) {
  omp_set_num_threads(2);
  Rng rng(17);
  struct Case {
    int64_t m, n, k;
    float beta;
    bool inference, gelu;
  };
  const Case cases[] = {{301, 67, 300, 0.0f, false, false}, {67, 301, 300, 0.5f, false, true},
                        {130, 200, 100, 0.0f, true, false}, {8, 301, 203, 0.0f, true, false},
                        {2, 301, 203, 0.0f, false, true},   {8, 16, 16, 0.0f, false, false}};
  for (CpuIsa isa : kLevels) {
    if (!isa_supported(isa)) continue;
    const Kernels& fast = cpu::kernels(isa);
    for (const Case& c : cases) {
      const int64_t ldc = c.n + 3, ld_addend = c.n + 5;
      Tensor a = Tensor::randn({c.m, c.k}, rng), w = Tensor::randn({c.n, c.k}, rng), bias = Tensor::randn({c.n}, rng);
      Tensor c0 = Tensor::randn({c.m, ldc}, rng), addend = Tensor::randn({c.m, ld_addend}, rng);
      GemmArgs g;
      g.trans_b = true, g.m = c.m, g.n = c.n, g.k = c.k, g.beta = c.beta, g.inference = c.inference;
      g.a = a.data<float>(), g.lda = c.k, g.b = w.data<float>(), g.ldb = c.k, g.bias = bias.data<float>();
      g.ldc = ldc;
      Tensor plain = c0.clone(), added = c0.clone(), act = Tensor::empty({c.m, c.n});
      g.c = plain.data<float>();
      fast.gemm(g);
      g.c = added.data<float>(), g.addend = addend.data<float>(), g.ld_addend = ld_addend;
      if (c.gelu) g.act = UnaryOp::Gelu, g.act_out = act.data<float>(), g.ld_act = c.n;
      fast.gemm(g);
      const std::string label = std::string(isa_name(isa)) + " " + std::to_string(c.m) + " x " + std::to_string(c.n) +
                                " x " + std::to_string(c.k) + (c.inference ? " inference" : "");
      Tensor expect = plain.clone();
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) expect.data<float>()[i * ldc + j] += addend.data<float>()[i * ld_addend + j];
      EXPECT_EQ(0, std::memcmp(added.data<float>(), expect.data<float>(), sizeof(float) * c.m * ldc)) << label;
      if (!c.gelu) continue;
      Tensor expect_act = Tensor::empty({c.m, c.n});
      for (int64_t i = 0; i < c.m; ++i)
        fast.unary_forward(UnaryOp::Gelu, expect.data<float>() + i * ldc, expect_act.data<float>() + i * c.n, c.n);
      EXPECT_EQ(0, std::memcmp(act.data<float>(), expect_act.data<float>(), sizeof(float) * c.m * c.n)) << label;
    }
  }
}

}  // namespace
}  // namespace qkv
