// qkv bench SUITE: measurements, side by side with the peer in the same run.
//
//   ops   our matmul / linear ops against raw sgemm of the loaded BLAS and
//         torch.matmul on the same shapes (GFLOP/s and qkv over the faster
//         peer); softmax, layer norm and GELU in GB/s; memory requests to
//         the system per warm training step.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "qkv/allocator.h"
#include "qkv/attention.h"
#include "qkv/cpu.h"
#include "qkv/encoder.h"
#include "qkv/infer.h"
#include "qkv/io.h"
#include "qkv/registry.h"
#include "qkv/trainer.h"
#include "qkv/translation.h"
#include "qkv/nn.h"
#include "qkv/optim.h"
#include "qkv/tokenizer.h"
#include "qkv/lm.h"
#include "qkv/vit.h"
#include "src/kernels/blas.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {
namespace {

struct BenchArgs {
  std::string suite;
  bool json = false;
  int threads = 0;
  double seconds = 0.2;  // per measurement round
  std::vector<int64_t> lengths = {256, 512, 1024, 2048, 4096, 8192};
  int64_t max_naive = 4096;  // the naive path's N x N buffers grow quadratically
  bool causal = false;
  std::string python = "python3";
  int steps = 5;  // train: timed steps
  int rounds = 3;  // train, vit, attention, ops: qkv and PyTorch measured alternately, each keeping its best
  std::string precision = "f32";  // train, vit: "bf16" runs qkv under Bf16AutocastGuard and PyTorch under autocast
  std::string model = "out/demo/model";           // decode: a trained model folder; generate: a decoder folder
  const CLI::Option* model_option = nullptr;      // whether --model was given
  const CLI::Option* test_option = nullptr;       // whether --test was given
  std::string test = "out/demo/zh-ja.test.tsv";  // decode: its sentences
  int64_t sentences = 200;                        // decode: how many of them
  std::vector<int64_t> rows = {1, 4, 16};         // streams: sequences decoded together
  int64_t images = 16;                            // vit --model: images a batch
};

// A suite's --json output: its figures, plus what ran them.
void print_json(nlohmann::ordered_json& out) {
  out["runtime"] = runtime_json();
  std::cout << out.dump(2) << "\n";
}

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

// The peer of x W^T: the loaded BLAS's sgemm on c [m, n] = a [m, k] w [n, k]^T.
void sgemm_weight_layout(int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& w, Tensor& c) {
  blas::sgemm()(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f, a.data<float>(),
                (blasint)k, w.data<float>(), (blasint)k, 0.0f, c.data<float>(), (blasint)n);
}

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
  // The peer: the loaded BLAS's sgemm straight on the same buffers, no tensors, no allocation.
  double raw = seconds_per_call(
      [&] {
        if (r.weight_layout) {
          sgemm_weight_layout(r.batch * r.m, r.n, r.k, a, b, c);
        } else {
          for (int64_t i = 0; i < r.batch; ++i)
            blas::sgemm()(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)r.m, (blasint)r.n, (blasint)r.k, 1.0f,
                          a.data<float>() + i * r.m * r.k, (blasint)r.k, b.data<float>() + i * r.k * r.n,
                          (blasint)r.n, 0.0f, c.data<float>() + i * r.m * r.n, (blasint)r.n);
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

// As bench_gemm for x W^T, but each call reads a different copy of W, from
// enough copies (256 MB) that none is still in a cache: a decoding step's
// weights come from memory, which the loop above, on one W, never shows.
nlohmann::ordered_json bench_gemm_streamed(const GemmRow& r, double seconds) {
  Rng rng(0);
  NoGradGuard no_grad;
  const int64_t copies = std::max<int64_t>(8, (int64_t(256) << 20) / (r.n * r.k * 4));
  Tensor a = Tensor::randn({r.m, r.k}, rng);
  std::vector<Tensor> ws;
  for (int64_t i = 0; i < copies; ++i) ws.push_back(Tensor::randn({r.n, r.k}, rng));
  Tensor c = Tensor::empty({r.m, r.n});
  size_t next = 0;
  auto w = [&] { return ws[next++ % ws.size()]; };
  const double ours = seconds_per_call([&] { linear(a, w()); }, seconds);
  const double raw = seconds_per_call([&] { sgemm_weight_layout(r.m, r.n, r.k, a, w(), c); }, seconds);
  const double flops = 2.0 * r.m * r.n * r.k, bytes = 4.0 * r.n * r.k;
  return {{"name", r.name},
          {"shape", "[" + std::to_string(r.m) + "x" + std::to_string(r.k) + "]@[" + std::to_string(r.k) + "x" +
                        std::to_string(r.n) + "]"},
          {"qkv_gflops", flops / ours / 1e9},
          {"qkv_weight_gb_per_s", bytes / ours / 1e9},
          {"sgemm_gflops", flops / raw / 1e9},
          {"ratio", raw / ours}};
}

nlohmann::json run_peer(const std::string& cmd_in);

// The PyTorch peer of `rows` (scripts/bench_matmul_torch.py, all shapes in
// one Python process, the same threads) in float32 or bfloat16; null without
// torch. Its "rows" come in the order of `rows`.
nlohmann::json torch_matmul(const BenchArgs& a, const std::vector<const GemmRow*>& rows, const std::string& dtype) {
  std::string cmd = a.python + " scripts/bench_matmul_torch.py --dtype " + dtype + " --threads " +
                    std::to_string(thread_count()) + " --seconds " + std::to_string(a.seconds) + " --shapes";
  for (const GemmRow* r : rows)
    cmd += " " + std::to_string(r->batch) + "," + std::to_string(r->m) + "," + std::to_string(r->n) + "," +
           std::to_string(r->k) + "," + (r->weight_layout ? "1" : "0");
  if (!a.json) std::fprintf(stderr, "\rbench ops: PyTorch %s (scripts/bench_matmul_torch.py) ...   ", dtype.c_str());
  nlohmann::json torch = run_peer(cmd);
  if (!a.json) std::fprintf(stderr, "\r%70s\r", "");
  return torch.contains("rows") && torch["rows"].size() == rows.size() ? torch : nlohmann::json();
}

// linear with a BF16 weight on the weight-layout shapes of `gemms` (whose
// float32 rows are already in out["matmul"]), against F.linear on bfloat16
// tensors (oneDNN; AMX where the CPU has it). Three ways: float32 x and y
// (x rounded as the kernel reads it) with W packed on each call, the same
// with W packed once (as a Linear keeps it), and "bf16 io": x and y in
// bfloat16, W packed once, the peer's own bytes in and out.
void bench_bf16_linear(const BenchArgs& a, const std::vector<GemmRow>& gemms, nlohmann::ordered_json& out) {
  std::vector<size_t> rows;
  std::vector<const GemmRow*> shapes;
  for (size_t i = 0; i < gemms.size(); ++i)
    if (gemms[i].weight_layout) rows.push_back(i), shapes.push_back(&gemms[i]);
  const nlohmann::json torch = torch_matmul(a, shapes, "bfloat16");
  const bool have_torch = !torch.is_null();
  const char* path = gemm_bf16_path();
  out["bf16_path"] = path;
  out["bf16_linear"] = nlohmann::ordered_json::array();
  if (!a.json)
    std::printf("\n%-18s %-26s %10s %10s %10s %12s %11s %8s %10s %8s\n%s\n", "bf16 linear", "shape", "qkv GF/s",
                "packed", "bf16 io", "qkv f32 GF/s", "torch GF/s", "vs torch", "packed vs", "io vs",
                ("  (qkv: " + std::string(path) +
                 "; packed: W packed once, as a Linear layer keeps it, where this CPU reads one; bf16 io: packed, "
                 "x and y bfloat16 as the peer's)")
                    .c_str());
  for (size_t j = 0; j < rows.size(); ++j) {
    const GemmRow& r = gemms[rows[j]];
    Rng rng(0);
    NoGradGuard no_grad;
    Tensor x = Tensor::randn({r.batch * r.m, r.k}, rng), w = Tensor::randn({r.n, r.k}, rng).to(DType::BF16);
    const double t = seconds_per_call([&] { linear(x, w); }, a.seconds);
    const Tensor packed = pack_bf16_weight(w);
    const double t_packed = packed.defined() ? seconds_per_call([&] { linear_bf16(x, w, packed); }, a.seconds) : t;
    const Tensor x_bf16 = x.to(DType::BF16);
    const double t_io =
        seconds_per_call([&] { linear_bf16(x_bf16, w, packed, Tensor(), nullptr, DType::BF16); }, a.seconds);
    const double flops = 2.0 * r.batch * r.m * r.n * r.k;
    nlohmann::ordered_json row = {{"name", r.name},
                                  {"shape", out["matmul"][rows[j]]["shape"]},
                                  {"qkv_gflops", flops / t / 1e9},
                                  {"qkv_packed_gflops", flops / t_packed / 1e9},
                                  {"qkv_bf16_io_gflops", flops / t_io / 1e9},
                                  {"qkv_f32_gflops", out["matmul"][rows[j]]["qkv_gflops"]}};
    const auto vs = [&](const char* key) {
      return have_torch ? std::to_string(row[key].get<double>() / torch["rows"][j]["gflops"].get<double>()).substr(0, 4)
                        : std::string("-");
    };
    if (have_torch) {
      const double peer = torch["rows"][j]["gflops"].get<double>();
      row["torch_gflops"] = peer;
      row["vs_torch"] = row["qkv_gflops"].get<double>() / peer;
      row["packed_vs_torch"] = row["qkv_packed_gflops"].get<double>() / peer;
      row["bf16_io_vs_torch"] = row["qkv_bf16_io_gflops"].get<double>() / peer;
    }
    if (!a.json)
      std::printf("%-18s %-26s %10.1f %10.1f %10.1f %12.1f %11s %8s %10s %8s\n", r.name.c_str(),
                  row["shape"].get<std::string>().c_str(), row["qkv_gflops"].get<double>(),
                  row["qkv_packed_gflops"].get<double>(), row["qkv_bf16_io_gflops"].get<double>(),
                  row["qkv_f32_gflops"].get<double>(),
                  have_torch ? std::to_string((int)std::lround(row["torch_gflops"].get<double>())).c_str() : "-",
                  vs("qkv_gflops").c_str(), vs("qkv_packed_gflops").c_str(), vs("qkv_bf16_io_gflops").c_str());
    out["bf16_linear"].push_back(row);
  }
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

// --- attention: flash vs naive vs PyTorch, H = 8, Dh = 64, batch 1 ---

struct AttentionRow {
  std::string impl;
  int64_t n;
  double fwd_ms, fwd_bwd_ms;
  uint64_t peak_extra_bytes;
};

// bf16: under Bf16AutocastGuard, as a mixed-precision training step runs it
// (the flash kernels' products in bfloat16; the naive path stays float32).
AttentionRow bench_attention_impl(AttentionImpl impl, int64_t n, bool causal, bool bf16, double seconds) {
  const int64_t heads = 8, dh = 64;
  Rng rng(0);
  Tensor q = Tensor::randn({1, heads, n, dh}, rng).set_requires_grad(true);
  Tensor k = Tensor::randn({1, heads, n, dh}, rng).set_requires_grad(true);
  Tensor v = Tensor::randn({1, heads, n, dh}, rng).set_requires_grad(true);
  Tensor r = Tensor::randn({1, heads, n, dh}, rng);
  AttentionOptions o{.causal = causal, .impl = impl};
  auto fwd = [&] {
    NoGradGuard no_grad;
    Bf16AutocastGuard mixed(bf16);
    scaled_dot_product_attention(q, k, v, o);
  };
  auto fwd_bwd = [&] {
    q.zero_grad(), k.zero_grad(), v.zero_grad();
    Tensor loss;
    {
      Bf16AutocastGuard mixed(bf16);
      loss = sum(mul(scaled_dot_product_attention(q, k, v, o), r));
    }
    loss.backward();
  };
  AttentionRow row{impl == AttentionImpl::Flash ? (bf16 ? "flash-bf16" : "flash") : "naive", n, 0, 0, 0};
  row.fwd_ms = seconds_per_call(fwd, seconds) * 1e3;
  row.fwd_bwd_ms = seconds_per_call(fwd_bwd, seconds) * 1e3;
  q.zero_grad(), k.zero_grad(), v.zero_grad();
  release_cached_memory();
  uint64_t base = allocator_stats().bytes_in_use;
  reset_peak_bytes();
  fwd_bwd();
  row.peak_extra_bytes = allocator_stats().peak_bytes_in_use - base;
  return row;
}

// A recipe the benchmarks build their models from, read relative to the
// repository root (where the peers' scripts are too).
std::string recipe_text(const std::string& path, const char* suite) {
  QKV_CHECK(std::filesystem::exists(path), "bench ", suite, ": ", path,
            " not found; run qkv bench from the repository root");
  return read_file(path);
}

// Runs a peer's script and parses the one JSON object it prints; null when
// Python or torch is missing or the script fails.
nlohmann::json run_peer(const std::string& cmd_in) {
  std::string cmd = cmd_in + " 2>/dev/null";
  std::string text;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, got);
    if (pclose(p) != 0) text.clear();
  }
  try {
    return text.empty() ? nlohmann::json() : nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return nlohmann::json();
  }
}

nlohmann::json bench_attention_torch(const BenchArgs& a, const std::vector<int64_t>& lengths, bool autocast) {
  std::string cmd = a.python + " scripts/bench_attention_torch.py --threads " + std::to_string(thread_count()) +
                    " --seconds " + std::to_string(a.seconds) + (a.causal ? " --causal" : "") +
                    (autocast ? " --autocast" : "") + " --n";
  for (int64_t n : lengths) cmd.append(" ").append(std::to_string(n));  // not " " + ...: GCC 12's -Wrestrict false alarm
  return run_peer(cmd);
}

// --- train: the reference translation Transformer, qkv vs PyTorch nn.Transformer ---

// train, vit, attention and ops measure qkv and the PyTorch peer alternately, --rounds times
// (a fresh peer process each round), and each side keeps its best round:
// these machines' speed moves by a third from one minute to the next, and a
// ratio of one measurement each, taken seconds apart, compared two machines.
std::string rounds_note(size_t rounds, bool with_peer) {
  if (!with_peer) return rounds == 1 ? std::string("one round") : "best of " + std::to_string(rounds) + " rounds";
  return rounds == 1 ? std::string("one round: qkv, then PyTorch")
                     : "best of " + std::to_string(rounds) + " rounds each, qkv and PyTorch alternating";
}

// "4820 5341 4410": a suite's figures by round, with `decimals` digits
// after the point (a large model runs a few images/s).
std::string join_rounds(const nlohmann::json& rates, int decimals = 0) {
  std::string out;
  char buf[64];
  for (const auto& r : rates) {
    if (!out.empty()) out += ' ';
    if (decimals == 0) {
      out += std::to_string((long long)std::llround(r.get<double>()));
      continue;
    }
    std::snprintf(buf, sizeof buf, "%.*f", decimals, r.get<double>());
    out += buf;
  }
  return out;
}

// The largest |ours - theirs| over a peer's first rows (JSON arrays of
// numbers), to show both sides ran the same model. Infinity when a shape
// differs, an entry is not a number, or either side holds a NaN, so a
// mismatch can never print as agreement.
double max_abs_diff_with_peer(const float* ours, int64_t rows, int64_t cols, const nlohmann::json& theirs) {
  if (!theirs.is_array() || (int64_t)theirs.size() != rows) return INFINITY;
  double max_diff = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const nlohmann::json& row = theirs[i];
    if (!row.is_array() || (int64_t)row.size() != cols) return INFINITY;
    for (int64_t j = 0; j < cols; ++j) {
      if (!row[j].is_number()) return INFINITY;
      const double diff = std::fabs(ours[i * cols + j] - row[j].get<double>());
      if (std::isnan(diff)) return INFINITY;
      max_diff = std::max(max_diff, diff);
    }
  }
  return max_diff;
}

// "within 4.2e-06 of qkv's float32", or a plain "do NOT match" for infinity.
std::string agreement(double max_diff) {
  if (!std::isfinite(max_diff)) return "do NOT match qkv's float32 (a shape differs, or a value is missing or NaN)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "within %.1e of qkv's float32", max_diff);
  return buf;
}

int run_bench_train(const BenchArgs& a) {
  // d_model 256, 4 heads, 3 + 3 layers, dim_feedforward 1024, vocabulary 8000,
  // Post-Norm, dropout 0.1, tied embeddings; 64 sentences x (32 source + 32 target) tokens.
  TransformerConfig c;
  c.vocab_size = 8000, c.d_model = 256, c.nhead = 4, c.num_encoder_layers = 3, c.num_decoder_layers = 3;
  c.dim_feedforward = 1024, c.dropout = 0.1f, c.norm_first = false;
  const int64_t B = 64, S = 32, T = 32;
  Rng rng(0);
  TranslationTransformer model(c, rng);
  model.train();
  AdamW opt(model.parameters(), {.lr = 1e-4f});
  std::vector<EncodedPair> data;
  for (int64_t i = 0; i < B; ++i) {
    EncodedPair p;
    for (int64_t j = 0; j < S; ++j) p.src.push_back(4 + (int64_t)rng.next_below(c.vocab_size - 4));
    for (int64_t j = 0; j < T - 1; ++j) p.tgt.push_back(4 + (int64_t)rng.next_below(c.vocab_size - 4));
    data.push_back(p);
  }
  std::vector<int64_t> all(B);
  for (int64_t i = 0; i < B; ++i) all[i] = i;
  Batch batch = collate(data, all);  // tgt_in and tgt_out are T = 32 long
  const bool bf16 = a.precision == "bf16";
  auto step = [&] {
    opt.zero_grad();
    Tensor loss;
    {
      Bf16AutocastGuard mixed(bf16);
      loss = translation_loss(model, batch, 0.1f);
    }
    loss.backward();
    clip_grad_norm(model.parameters(), 1.0f);
    opt.step();
  };
  const bool progress = !a.json && isatty(STDERR_FILENO);
  step();
  step();
  const int steps = std::max(2, a.steps);
  AllocatorStats before = allocator_stats();
  const std::string peer = a.python + " scripts/bench_train_torch.py --threads " + std::to_string(thread_count()) +
                           " --steps " + std::to_string(steps) + " --precision " + a.precision;
  std::vector<double> ours, theirs;  // seconds per step, one per round
  nlohmann::json torch;              // the peer's best round
  for (int round = 1; round <= a.rounds; ++round) {
    if (progress) std::fprintf(stderr, "\rbench train: qkv, round %d of %d ...   ", round, a.rounds);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step();
    ours.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps);
    if (round > 1 && theirs.empty()) continue;  // no peer: its first round failed
    if (progress)
      std::fprintf(stderr, "\rbench train: PyTorch (scripts/bench_train_torch.py), round %d of %d ...   ", round,
                   a.rounds);
    nlohmann::json t = run_peer(peer);
    if (!t.contains("seconds_per_step")) continue;
    theirs.push_back(t["seconds_per_step"].get<double>());
    if (theirs.back() == *std::min_element(theirs.begin(), theirs.end())) torch = t;
  }
  AllocatorStats after = allocator_stats();
  const double per_step = *std::min_element(ours.begin(), ours.end());
  if (progress) std::fprintf(stderr, "\r%70s\r", "");
  const double qkv_tps = B * (S + T) / per_step;
  nlohmann::ordered_json out = {
      {"suite", "train"},
      {"threads", thread_count()},
      {"parameters", model.parameter_count()},
      {"batch", "64 x (32 + 32) tokens"},
      {"precision", a.precision},
      {"steps_timed", steps},
      {"rounds", ours.size()},
      {"qkv_seconds_per_step", per_step},
      {"qkv_tokens_per_s", qkv_tps},
      {"qkv_system_allocs_per_step", (double)(after.system_allocs - before.system_allocs) / (steps * ours.size())},
      {"qkv_peak_bytes", after.peak_bytes_in_use}};
  if (torch.contains("tokens_per_s")) {
    out["torch"] = torch["torch"];
    out["torch_seconds_per_step"] = torch["seconds_per_step"];
    out["torch_tokens_per_s"] = torch["tokens_per_s"];
    out["ratio"] = qkv_tps / torch["tokens_per_s"].get<double>();
  } else {
    out["torch_tokens_per_s"] = nullptr;
    out["ratio"] = nullptr;
  }
  out["qkv_tokens_per_s_by_round"] = nlohmann::json::array();
  for (double t : ours) out["qkv_tokens_per_s_by_round"].push_back(B * (S + T) / t);
  out["torch_tokens_per_s_by_round"] = nlohmann::json::array();
  for (double t : theirs) out["torch_tokens_per_s_by_round"].push_back(B * (S + T) / t);
  if (a.json) {
    print_json(out);
    return 0;
  }
  std::printf(
      "qkv bench train: translation Transformer, d_model 256, 4 heads, 3+3 layers, ff 1024, vocabulary 8000,\n"
      "  %lld parameters, 64 x (32 + 32) tokens per step, AdamW, %d threads; tokens = source + target;\n"
      "  %s\n",
      (long long)model.parameter_count(), thread_count(),
      bf16 ? "bf16 mixed precision: qkv's linear layers in bfloat16 (float32 sums; attention, with dropout, on the "
             "float32 naive path), PyTorch under autocast"
           : "float32");
  std::printf("  %s\n\n", rounds_note(ours.size(), !theirs.empty()).c_str());
  std::printf("  qkv      %8.0f tokens/s  (%.3f s/step, %.1f system allocations per warm step)\n", qkv_tps, per_step,
              out["qkv_system_allocs_per_step"].get<double>());
  if (out["ratio"].is_null()) {
    std::printf("  PyTorch  not available (needs python3 with torch)\n");
  } else {
    std::printf("  PyTorch  %8.0f tokens/s  (%.3f s/step, nn.Transformer %s)\n  ratio    %.2fx\n",
                out["torch_tokens_per_s"].get<double>(), out["torch_seconds_per_step"].get<double>(),
                out["torch"].get<std::string>().c_str(), out["ratio"].get<double>());
  }
  if (ours.size() > 1)
    std::printf("\n  by round (tokens/s): qkv %s; PyTorch %s\n", join_rounds(out["qkv_tokens_per_s_by_round"]).c_str(),
                theirs.empty() ? "-" : join_rounds(out["torch_tokens_per_s_by_round"]).c_str());
  return 0;
}

// --- decode: greedy and beam search with the cache, and greedy recomputing the prefix ---

// Greedy decoding without any cache: the whole prefix through the decoder at every step (the baseline).
std::vector<std::vector<int64_t>> greedy_uncached(Seq2Seq& model, const std::vector<std::vector<int64_t>>& sources,
                                                  int64_t max_len) {
  NoGradGuard no_grad;
  std::vector<EncodedPair> chunk;
  std::vector<int64_t> idx;
  for (size_t i = 0; i < sources.size(); ++i) chunk.push_back({sources[i], {}}), idx.push_back((int64_t)i);
  const DecodingIds ids = model.decoding_ids();
  Batch b = collate(chunk, idx, ids);
  const int64_t B = (int64_t)sources.size();
  std::vector<std::vector<int64_t>> prefix(B, {ids.start}), out(B);
  std::vector<bool> done(B, false);
  for (int64_t step = 0; step < max_len; ++step) {
    std::vector<int64_t> flat;
    for (auto& p : prefix) flat.insert(flat.end(), p.begin(), p.end());
    Tensor logits = model.forward(b.src, b.src_lengths, Tensor::from_ints(flat, {B, step + 1}));
    Tensor last = logits.slice(1, step, step + 1).contiguous();
    const int64_t V = last.size(-1);
    bool all = true;
    for (int64_t r = 0; r < B; ++r) {
      const float* row = last.data<float>() + r * V;
      const int64_t next = done[r] ? ids.pad : ids.best_output(row, V);
      prefix[r].push_back(next);
      if (!done[r] && next == ids.eos) done[r] = true;
      if (!done[r]) out[r].push_back(next), all = false;
    }
    if (all) break;
  }
  return out;
}

// A Hugging Face translation folder (Marian): qkv in float32 and int8 beside
// CTranslate2 (float32, int8) and transformers on the same sentences, batches
// of 32, greedy and beam 4, up to 32 target tokens (the peers:
// scripts/bench_translate_peers.py). Every engine counts the target tokens it
// made, </s> not counted.
int run_bench_decode_peers(const BenchArgs& a, TranslationModel& m, const std::string& sources_path) {
  const int64_t batch = 32, max_len = 32, beam = 4;
  const bool progress = !a.json && isatty(STDERR_FILENO);
  std::vector<std::string> texts;
  const std::string all = read_file(sources_path);
  for (size_t at = 0; at < all.size() && (int64_t)texts.size() < a.sentences;) {
    size_t end = all.find('\n', at);
    if (end == std::string::npos) end = all.size();
    std::string line = all.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    texts.push_back(line.substr(0, line.find('\t')));  // a TSV's source column, or the whole line
    at = end + 1;
  }
  QKV_CHECK(!texts.empty(), "bench decode: ", sources_path, " has no sentences");
  char tmpl[] = "/tmp/qkv_bench_decode_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  QKV_CHECK(dir, "bench decode: cannot make a temporary folder");
  const std::string listed = std::string(dir) + "/sources.txt";
  std::string joined;
  for (const std::string& t : texts) joined += t + "\n";
  write_file_atomic(listed, joined);
  std::vector<std::vector<int64_t>> sources;
  for (size_t i = 0; i < texts.size(); ++i)
    sources.push_back(encode_source(m, texts[i], {.truncate = true}, "sentence " + std::to_string(i + 1)));
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::vector<std::vector<int64_t>> first;  // qkv float32's first sentence: greedy, beam
  auto qkv_rows = [&](const std::string& engine) {
    if (progress) std::fprintf(stderr, "\rbench decode: %s ...          ", engine.c_str());
    greedy_translate(*m.model, {sources.begin(), sources.begin() + std::min<size_t>(batch, sources.size())}, max_len,
                     batch);  // warm up
    for (const int64_t k : {int64_t(1), beam}) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::vector<int64_t>> outs;
      if (k == 1) {
        outs = greedy_translate(*m.model, sources, max_len, batch);
      } else {
        for (auto& h : beam_translate(*m.model, sources, max_len, {.beam = k, .batch_size = batch}))
          outs.push_back(h.tokens);
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      int64_t made = 0;
      for (const auto& o : outs) made += (int64_t)o.size();
      if (engine == "qkv f32") first.push_back(outs[0]);
      rows.push_back({{"engine", engine},
                      {"mode", k == 1 ? "greedy" : "beam " + std::to_string(k)},
                      {"seconds", seconds},
                      {"target_tokens", made},
                      {"tokens_per_s", made / seconds}});
    }
  };
  auto peer_rows = [&](const std::string& peer, const std::string& type) {
    if (progress) std::fprintf(stderr, "\rbench decode: %s %s ...          ", peer.c_str(), type.c_str());
    const nlohmann::json r =
        run_peer(a.python + " scripts/bench_translate_peers.py --peer " + peer + (type.empty() ? "" : " --type " + type) +
                 " --model '" + a.model + "' --sources '" + listed + "' --batch " + std::to_string(batch) +
                 " --max-len " + std::to_string(max_len) + " --threads " + std::to_string(thread_count()));
    if (!r.is_object() || !r.contains("rows")) {
      if (!a.json)
        std::fprintf(stderr, "\rbench decode: %s %s not run: %s\n", peer.c_str(), type.c_str(),
                     r.is_object() ? r.value("error", std::string("no result")).c_str() : "no result (see --python)");
      return;
    }
    for (size_t i = 0; i < r["rows"].size(); ++i) {
      const nlohmann::json& row = r["rows"][i];
      const std::vector<int64_t> theirs = row["first"].get<std::vector<int64_t>>();
      int64_t same = 0;
      for (size_t j = 0; i < first.size() && j < std::min(theirs.size(), first[i].size()) && theirs[j] == first[i][j]; ++j) ++same;
      const double seconds = row["seconds"].get<double>();
      rows.push_back({{"engine", r["peer"]},
                      {"mode", row["mode"]},
                      {"seconds", seconds},
                      {"target_tokens", row["target_tokens"]},
                      {"tokens_per_s", row["target_tokens"].get<double>() / seconds},
                      {"same_first_tokens_as_qkv_f32", same},
                      {"version", r.value("version", "")}});
    }
  };
  qkv_rows("qkv f32");
  peer_rows("ctranslate2", "float32");
  peer_rows("transformers", "");
  m.model->convert_linear_weights(DType::I8);
  qkv_rows("qkv int8");
  peer_rows("ctranslate2", "int8");
  std::filesystem::remove_all(dir);
  if (progress) std::fprintf(stderr, "\r%70s\r", "");
  // Each peer beside the qkv row of its precision: float32 peers against qkv f32, int8 against qkv int8.
  auto qkv_rate = [&](const std::string& engine, const std::string& mode) {
    for (const auto& r : rows)
      if (r["engine"] == engine && r["mode"] == mode) return r["tokens_per_s"].get<double>();
    return 0.0;
  };
  for (auto& r : rows) {
    const std::string engine = r["engine"].get<std::string>();
    if (engine.rfind("qkv", 0) == 0) continue;
    const bool int8 = engine.find("int8") != std::string::npos;
    r["qkv_vs_peer"] = qkv_rate(int8 ? "qkv int8" : "qkv f32", r["mode"].get<std::string>()) / r["tokens_per_s"].get<double>();
  }
  nlohmann::ordered_json out = {{"suite", "decode"},   {"model", m.model->summary()}, {"sentences", texts.size()},
                                {"batch", batch},      {"max_len", max_len},          {"threads", thread_count()},
                                {"rows", rows}};
  if (a.json) {
    print_json(out);
    return 0;
  }
  std::printf("qkv bench decode: %s\n  %zu sentences of %s, batches of %lld, up to %lld target tokens, %d threads\n\n",
              m.model->summary().c_str(), texts.size(), sources_path.c_str(), (long long)batch, (long long)max_len,
              thread_count());
  std::printf("  %-22s %-8s %14s %12s\n", "engine", "mode", "target tok/s", "qkv vs it");
  for (const auto& r : rows) {
    std::printf("  %-22s %-8s %14.0f", r["engine"].get<std::string>().c_str(), r["mode"].get<std::string>().c_str(),
                r["tokens_per_s"].get<double>());
    if (r.contains("qkv_vs_peer")) std::printf(" %11.2fx", r["qkv_vs_peer"].get<double>());
    std::printf("\n");
  }
  return 0;
}

int run_bench_decode(const BenchArgs& a) {
  TranslationModel m = load_translation_model(a.model, "bench decode");
  m.model->eval();
  const std::string config = folder_config_path(a.model);
  if (is_hf_config(read_file(config), config)) {
    const bool own_test = a.test_option && a.test_option->count() > 0;
    const std::string sources = own_test ? a.test : a.model + "/sources.txt";
    QKV_CHECK(own_test || std::filesystem::exists(sources), "bench decode: ", a.model,
              " is a Hugging Face folder without sources.txt: give --test FILE (one source sentence per line)");
    return run_bench_decode_peers(a, m, sources);
  }
  std::vector<SentencePair> pairs = read_parallel_tsv(a.test);
  if ((int64_t)pairs.size() > a.sentences) pairs.resize(a.sentences);
  std::vector<std::vector<int64_t>> sources;
  for (auto& [s, t] : pairs) sources.push_back(m.model->decoding_ids().source(m.tokenizer->encode(s)));
  const int64_t max_len = 128;
  struct Row {
    std::string name;
    double seconds;
    int64_t tokens;
  };
  std::vector<Row> rows;
  auto count = [](const std::vector<std::vector<int64_t>>& outs) {
    int64_t n = 0;
    for (auto& o : outs) n += (int64_t)o.size() + 1;  // + <eos>
    return n;
  };
  auto timed = [&](const std::string& name, const std::function<std::vector<std::vector<int64_t>>()>& f) {
    auto t0 = std::chrono::steady_clock::now();
    auto outs = f();
    rows.push_back({name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), count(outs)});
  };
  timed("greedy, cached", [&] { return greedy_translate(*m.model, sources, max_len); });
  timed("greedy, uncached", [&] {
    std::vector<std::vector<int64_t>> all;
    for (size_t i = 0; i < sources.size(); i += 64) {  // the same batches of 64 as greedy_translate
      std::vector<std::vector<int64_t>> part(sources.begin() + i, sources.begin() + std::min(sources.size(), i + 64));
      for (auto& o : greedy_uncached(*m.model, part, max_len)) all.push_back(o);
    }
    return all;
  });
  timed("beam 4, cached", [&] {
    std::vector<std::vector<int64_t>> outs;
    for (auto& h : beam_translate(*m.model, sources, max_len, {.beam = 4})) outs.push_back(h.tokens);
    return outs;
  });
  nlohmann::ordered_json out = {{"suite", "decode"}, {"model", m.model->summary()}, {"sentences", sources.size()},
                                {"threads", thread_count()}, {"rows", nlohmann::ordered_json::array()}};
  for (auto& r : rows)
    out["rows"].push_back({{"mode", r.name}, {"seconds", r.seconds}, {"sentences_per_s", sources.size() / r.seconds},
                           {"tokens_per_s", r.tokens / r.seconds}});
  if (a.json) {
    print_json(out);
    return 0;
  }
  std::printf("qkv bench decode: %s\n  %zu sentences of %s, %d threads, batches of 64 (beam: 16 sentences x 4)\n\n",
              m.model->summary().c_str(), sources.size(), a.test.c_str(), thread_count());
  std::printf("  %-18s %12s %12s\n", "mode", "sentences/s", "tokens/s");
  for (auto& r : rows) std::printf("  %-18s %12.1f %12.1f\n", r.name.c_str(), sources.size() / r.seconds, r.tokens / r.seconds);
  return 0;
}

int run_bench_attention(const BenchArgs& a) {
  std::vector<AttentionRow> rows;
  const bool bf16 = a.precision == "bf16";
  const bool progress = !a.json && isatty(STDERR_FILENO);
  for (int64_t n : a.lengths) QKV_CHECK(n > 0, "bench attention: lengths must be positive");
  // Every row's best round (rounds_note): the fastest forward and forward + backward.
  auto keep_best = [&](AttentionRow r) {
    for (AttentionRow& o : rows)
      if (o.impl == r.impl && o.n == r.n) {
        o.fwd_ms = std::min(o.fwd_ms, r.fwd_ms), o.fwd_bwd_ms = std::min(o.fwd_bwd_ms, r.fwd_bwd_ms);
        return;
      }
    rows.push_back(r);
  };
  nlohmann::json torch;  // the peer's first answer (its version)
  for (int round = 1; round <= a.rounds; ++round) {
    for (int64_t n : a.lengths) {
      if (progress)
        std::fprintf(stderr, "\rbench attention: n = %lld, round %d of %d ...   ", (long long)n, round, a.rounds);
      keep_best(bench_attention_impl(AttentionImpl::Flash, n, a.causal, false, a.seconds));
      if (bf16) keep_best(bench_attention_impl(AttentionImpl::Flash, n, a.causal, true, a.seconds));
      if (n <= a.max_naive) keep_best(bench_attention_impl(AttentionImpl::Naive, n, a.causal, false, a.seconds));
    }
    if (round > 1 && torch.is_null()) continue;  // no peer: its first round failed
    if (progress)
      std::fprintf(stderr, "\rbench attention: PyTorch (scripts/bench_attention_torch.py), round %d of %d ...   ",
                   round, a.rounds);
    for (bool autocast : {false, true}) {
      if (autocast && !bf16) continue;
      const nlohmann::json peer = bench_attention_torch(a, a.lengths, autocast);
      if (!peer.contains("rows")) break;  // without float32 torch, no autocast either
      if (!autocast && torch.is_null()) torch = peer;
      for (auto& t : peer["rows"])
        keep_best({autocast ? "torch-bf16" : "torch", t["n"].get<int64_t>(), t["fwd_ms"].get<double>(),
                   t["fwd_bwd_ms"].get<double>(), t["peak_extra_bytes"].get<uint64_t>()});
    }
  }
  if (progress) std::fprintf(stderr, "\r%70s\r", "");
  // FLOPs of the two products forward (QK^T, PV) and the four of the backward's
  // gradients (dV, dP, dQ, dK); the flash backward's recomputation of QK^T is not counted.
  auto flops = [&](int64_t n, bool with_backward) {
    double per_product = 2.0 * 8 * n * n * 64 * (a.causal ? 0.5 : 1.0);
    return per_product * (with_backward ? 6 : 2);
  };
  auto find = [&](const std::string& impl, int64_t n) -> const AttentionRow* {
    for (auto& r : rows)
      if (r.impl == impl && r.n == n) return &r;
    return nullptr;
  };
  nlohmann::ordered_json out;
  out["suite"] = "attention";
  out["heads"] = 8;
  out["head_dim"] = 64;
  out["batch"] = 1;
  out["causal"] = a.causal;
  out["precision"] = a.precision;
  out["gemm_bf16"] = bf16 ? nlohmann::json(gemm_bf16_path()) : nlohmann::json(nullptr);
  out["threads"] = thread_count();
  out["rounds"] = a.rounds;
  out["torch"] = torch.contains("torch") ? torch["torch"] : nlohmann::json(nullptr);
  // The machine's sgemm rate in this run, the ceiling for attention's products.
  out["sgemm_gflops_1024"] = bench_gemm({"square 1024", 1, 1024, 1024, 1024, false}, a.seconds)["sgemm_gflops"];
  out["rows"] = nlohmann::ordered_json::array();
  for (auto& r : rows) {
    nlohmann::ordered_json j = {{"impl", r.impl},         {"n", r.n},
                                {"fwd_ms", r.fwd_ms},     {"fwd_bwd_ms", r.fwd_bwd_ms},
                                {"peak_extra_bytes", r.peak_extra_bytes},
                                {"fwd_gflops", flops(r.n, false) / r.fwd_ms / 1e6},
                                {"fwd_bwd_gflops", flops(r.n, true) / r.fwd_bwd_ms / 1e6}};
    const bool flash = r.impl.rfind("flash", 0) == 0;
    if (const AttentionRow* t = find("torch", r.n); t && flash) {
      j["fwd_speedup_vs_torch"] = t->fwd_ms / r.fwd_ms;
      j["fwd_bwd_speedup_vs_torch"] = t->fwd_bwd_ms / r.fwd_bwd_ms;
    }
    if (const AttentionRow* t = find("torch-bf16", r.n); t && r.impl == "flash-bf16") {
      j["fwd_speedup_vs_torch_bf16"] = t->fwd_ms / r.fwd_ms;
      j["fwd_bwd_speedup_vs_torch_bf16"] = t->fwd_bwd_ms / r.fwd_bwd_ms;
    }
    out["rows"].push_back(j);
  }
  if (a.json) {
    print_json(out);
    return 0;
  }
  std::printf("qkv bench attention: batch 1, H = 8, Dh = 64, %s, %d threads; PyTorch %s;\n%s\n",
              a.causal ? "causal" : "no mask", thread_count(),
              torch.contains("torch") ? torch["torch"].get<std::string>().c_str() : "not available",
              rounds_note(a.rounds, !torch.is_null()).c_str());
  if (bf16)
    std::printf("bf16: qkv's flash products in bfloat16 (%s), PyTorch under torch.autocast(\"cpu\", bfloat16)\n",
                out["gemm_bf16"].get<std::string>().c_str());
  std::printf("\n%6s  %-10s %10s %12s %10s %14s %10s%s\n", "n", "impl", "fwd ms", "fwd+bwd ms", "GFLOP/s",
              "peak extra MB", "vs torch", bf16 ? "  vs torch bf16" : "");
  auto ratio = [](const nlohmann::ordered_json& j, const char* key) {
    return j.contains(key) ? std::to_string(j[key].get<double>()).substr(0, 4) + "x" : std::string();
  };
  for (auto& j : out["rows"]) {
    std::printf("%6lld  %-10s %10.2f %12.2f %10.1f %14.1f %10s", (long long)j["n"].get<int64_t>(),
                j["impl"].get<std::string>().c_str(), j["fwd_ms"].get<double>(), j["fwd_bwd_ms"].get<double>(),
                j["fwd_bwd_gflops"].get<double>(), j["peak_extra_bytes"].get<double>() / 1e6,
                ratio(j, "fwd_bwd_speedup_vs_torch").c_str());
    if (bf16) std::printf("  %14s", ratio(j, "fwd_bwd_speedup_vs_torch_bf16").c_str());
    std::printf("\n");
  }
  std::printf("\nGFLOP/s: forward + backward, counting 6 products of 2 n^2 Dh FLOPs per head%s;\n"
              "raw sgemm on 1024 x 1024 in this run: %.1f GFLOP/s.\n",
              a.causal ? " (halved for the causal mask)" : "", out["sgemm_gflops_1024"].get<double>());
  return 0;
}

// --- vit: the recipe's Vision Transformer, qkv vs the same model in PyTorch ---

// vit --model: a folder's Vision Transformer (a Hugging Face
// ViTForImageClassification or DeiT folder, or qkv's own), inference only,
// against transformers' model of the same folder on the same pixels
// (scripts/bench_vit_hf_peer.py): qkv in float32, bf16 and int8 against the
// peer in float32, rounds alternating; the peer's logits of the first images
// are compared with qkv's float32 ones, so that the two ran the same model.
int run_bench_vit_folder(const BenchArgs& a) {
  QKV_CHECK(a.precision == "f32",
            "bench vit --model: --precision is for the recipe's model (a folder runs float32, "
            "bf16 and int8 weights, each against transformers' float32)");
  const bool progress = !a.json && isatty(STDERR_FILENO);
  const int64_t first = std::min<int64_t>(4, a.images);
  const int calls = std::max(2, a.steps);
  const std::vector<std::string> dtypes = {"f32", "bf16", "int8"};
  std::vector<std::shared_ptr<VisionTransformer>> models;
  for (const std::string& dtype : dtypes) models.push_back(load_vit_model(a.model, "bench vit", dtype));
  const ViTConfig& c = models[0]->config();
  Rng rng(0);
  const Tensor pixels = Tensor::randn({a.images, c.channels, c.image_size, c.image_size}, rng);
  Tensor logits;  // qkv's float32 logits of the first images
  {
    NoGradGuard no_grad;
    logits = models[0]->forward(pixels.slice(0, 0, first)).contiguous();
  }
  // The peer reads the pixels from a file of its own.
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("qkv-bench-vit-" + std::to_string(getpid()) + ".safetensors");
  struct RemovedAtExit {
    std::filesystem::path path;
    ~RemovedAtExit() {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
  } removed{file};
  save_safetensors(file.string(), std::vector<std::pair<std::string, Tensor>>{{"pixels", pixels}});
  const std::string peer_cmd = a.python + " scripts/bench_vit_hf_peer.py --model '" + a.model + "' --pixels '" +
                               file.string() + "' --threads " + std::to_string(thread_count()) + " --calls " +
                               std::to_string(calls) + " --first " + std::to_string(first);
  std::vector<std::vector<double>> ours(dtypes.size());
  std::vector<double> peak_mb(dtypes.size(), 0.0), theirs;
  nlohmann::json peer;  // the peer's last answer (its versions, logits)
  std::string peer_error;
  for (int round = 1; round <= a.rounds; ++round) {
    for (size_t d = 0; d < dtypes.size(); ++d) {
      if (progress)
        std::fprintf(stderr, "\rbench vit: qkv %s, round %d of %d ...          ", dtypes[d].c_str(), round, a.rounds);
      release_cached_memory();
      const uint64_t base = allocator_stats().bytes_in_use;
      reset_peak_bytes();
      double best = 1e30;
      for (int i = 0; i <= calls; ++i) {  // the first call warms up and is not counted
        NoGradGuard no_grad;
        const auto t0 = std::chrono::steady_clock::now();
        models[d]->forward(pixels);
        if (i > 0) best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      ours[d].push_back(a.images / best);
      peak_mb[d] = std::max(peak_mb[d], (allocator_stats().peak_bytes_in_use - base) / 1e6);
    }
    if (round > 1 && theirs.empty()) continue;  // no peer: its first round failed
    if (progress)
      std::fprintf(stderr, "\rbench vit: transformers (scripts/bench_vit_hf_peer.py), round %d of %d ...   ", round,
                   a.rounds);
    const nlohmann::json t = run_peer(peer_cmd);
    if (t.is_null() || t.contains("error")) {
      peer_error = t.is_null() ? "its script failed (needs torch and transformers)" : t["error"].get<std::string>();
      continue;
    }
    peer = t;
    theirs.push_back(t["images_per_s"].get<double>());
  }
  if (progress) std::fprintf(stderr, "\r%76s\r", "");
  auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  const bool have_peer = !theirs.empty();
  const double max_diff =
      have_peer ? max_abs_diff_with_peer(logits.data<float>(), first, logits.size(1), peer["first"]) : -1;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t d = 0; d < dtypes.size(); ++d) {
    nlohmann::ordered_json r = {{"impl", "qkv " + dtypes[d]},
                                {"images_per_s", best(ours[d])},
                                {"peak_extra_mb", peak_mb[d]},
                                {"images_per_s_by_round", ours[d]}};
    if (have_peer) r["vs_peer"] = best(ours[d]) / best(theirs);
    rows.push_back(r);
  }
  const std::string peer_name = have_peer ? "transformers " + peer["transformers"].get<std::string>() + " (torch " +
                                                peer["torch"].get<std::string>() + ", attention " +
                                                peer["attention"].get<std::string>() + ")"
                                          : "";
  if (a.json) {
    nlohmann::ordered_json out = {{"suite", "vit"},
                                  {"model", a.model},
                                  {"summary", models[0]->summary()},
                                  {"threads", thread_count()},
                                  {"images", a.images},
                                  {"rounds", a.rounds},
                                  {"qkv", rows}};
    if (have_peer) {
      out["peer"] = {{"impl", peer_name},
                     {"images_per_s", best(theirs)},
                     {"images_per_s_by_round", theirs},
                     {"max_abs_logit_diff_f32_first", max_diff}};
      out["infer_ratio"] = best(ours[0]) / best(theirs);
    } else {
      out["peer"] = peer_error;
      out["infer_ratio"] = nullptr;
    }
    print_json(out);
    return 0;
  }
  std::printf(
      "qkv bench vit: %s\n  %s, inference on batches of %lld random images, the best of %d forwards a round, "
      "%d threads;\n  %s\n",
      a.model.c_str(), models[0]->summary().c_str(), (long long)a.images, calls, thread_count(),
      rounds_note(ours[0].size(), have_peer).c_str());
  if (have_peer)
    std::printf("  peer: %s, float32; its logits of the first %lld images %s\n\n", peer_name.c_str(), (long long)first,
                agreement(max_diff).c_str());
  else
    std::printf("  peer: transformers not available (%s)\n\n", peer_error.c_str());
  std::printf("  %-16s %12s %14s %10s   %s\n", "", "images/s", "peak extra MB", "vs peer", "by round");
  for (size_t d = 0; d < dtypes.size(); ++d)
    std::printf("  %-16s %12.2f %14.1f %10s   %s\n", ("qkv " + dtypes[d]).c_str(), best(ours[d]), peak_mb[d],
                have_peer ? (std::to_string(best(ours[d]) / best(theirs)).substr(0, 4) + "x").c_str() : "-",
                join_rounds(ours[d], 1).c_str());
  if (have_peer)
    std::printf("  %-16s %12.2f %14s %10s   %s\n", "transformers", best(theirs), "-", "1.00x",
                join_rounds(theirs, 1).c_str());
  return 0;
}

int run_bench_vit(const BenchArgs& a) {
  if (a.model_option && a.model_option->count() > 0) return run_bench_vit_folder(a);
  // The recipe's model (learned positions, mean pooling: the shape the PyTorch peer builds).
  const std::string recipe = "configs/vit-fashion-mnist.json";
  ViTConfig c = ViTConfig::from_json(recipe_text(recipe, "vit"), recipe);
  c.dropout = 0;
  QKV_CHECK(c.positions == PositionKind::Learned && c.pool == Pool::Mean, recipe,
            ": the PyTorch peer builds learned positions and mean pooling only");
  const int64_t C = c.channels, S = c.image_size;
  Rng rng(0);
  VisionTransformer model(c, rng);
  AdamW opt(model.parameters(), {.lr = 1e-3f, .weight_decay = 0.05f});
  std::vector<int64_t> labels;
  for (int i = 0; i < 128; ++i) labels.push_back((int64_t)rng.next_below((uint64_t)c.num_classes));
  Tensor x = Tensor::randn({128, C, S, S}, rng), y = Tensor::from_ints(labels, {128});
  Tensor xi = Tensor::randn({256, C, S, S}, rng);
  const bool progress = !a.json && isatty(STDERR_FILENO);
  const bool bf16 = a.precision == "bf16";
  auto train_step = [&] {
    opt.zero_grad();
    Tensor loss;
    {
      Bf16AutocastGuard mixed(bf16);
      loss = cross_entropy(model.forward(x), y, {.label_smoothing = 0.1f});
    }
    loss.backward();
    clip_grad_norm(model.parameters(), 1.0f);
    opt.step();
  };
  auto best_of_3 = [&](const std::function<void()>& f, int calls) {
    f();
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) f();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls);
    }
    return best;
  };
  const int steps = std::max(2, a.steps);
  const std::string peer = a.python + " scripts/bench_vit_torch.py --threads " + std::to_string(thread_count()) +
                           " --steps " + std::to_string(steps) + " --image " + std::to_string(S) + " --patch " +
                           std::to_string(c.patch_size) + " --channels " + std::to_string(C) + " --d-model " +
                           std::to_string(c.d_model) + " --heads " + std::to_string(c.nhead) + " --layers " +
                           std::to_string(c.num_layers) + " --ff " + std::to_string(c.dim_feedforward()) +
                           " --classes " + std::to_string(c.num_classes) + " --precision " + a.precision;
  // Images per second by round (rounds_note): training, inference.
  std::vector<double> our_train, our_infer, their_train, their_infer;
  nlohmann::json torch;  // the peer's last answer (its version, parameters)
  for (int round = 1; round <= a.rounds; ++round) {
    if (progress) std::fprintf(stderr, "\rbench vit: qkv, round %d of %d ...   ", round, a.rounds);
    model.train();
    our_train.push_back(128 / best_of_3(train_step, steps));
    model.eval();
    our_infer.push_back(256 / best_of_3(
                                  [&] {
                                    NoGradGuard no_grad;
                                    Bf16AutocastGuard mixed(bf16);
                                    model.forward(xi);
                                  },
                                  steps));
    if (round > 1 && their_train.empty()) continue;  // no peer: its first round failed
    if (progress)
      std::fprintf(stderr, "\rbench vit: PyTorch (scripts/bench_vit_torch.py), round %d of %d ...   ", round, a.rounds);
    nlohmann::json t = run_peer(peer);
    if (!t.contains("train_images_per_s")) continue;
    torch = t;
    their_train.push_back(t["train_images_per_s"].get<double>());
    their_infer.push_back(t["infer_images_per_s"].get<double>());
  }
  if (progress) std::fprintf(stderr, "\r%70s\r", "");
  auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  nlohmann::ordered_json out = {{"suite", "vit"},
                                {"threads", thread_count()},
                                {"parameters", model.parameter_count()},
                                {"model", model.summary()},
                                {"precision", a.precision},
                                {"rounds", our_train.size()},
                                {"qkv_train_images_per_s", best(our_train)},
                                {"qkv_infer_images_per_s", best(our_infer)}};
  const bool have_torch = !their_train.empty();
  if (have_torch) {
    out["torch"] = torch["torch"];
    out["torch_parameters"] = torch["parameters"];
    out["torch_train_images_per_s"] = best(their_train);
    out["torch_infer_images_per_s"] = best(their_infer);
    out["train_ratio"] = best(our_train) / best(their_train);
    out["infer_ratio"] = best(our_infer) / best(their_infer);
  } else {
    out["train_ratio"] = nullptr;
    out["infer_ratio"] = nullptr;
  }
  out["qkv_train_images_per_s_by_round"] = our_train;
  out["qkv_infer_images_per_s_by_round"] = our_infer;
  out["torch_train_images_per_s_by_round"] = their_train;
  out["torch_infer_images_per_s_by_round"] = their_infer;
  if (a.json) {
    print_json(out);
    return 0;
  }
  std::printf(
      "qkv bench vit: %s\n  training: batches of 128 (AdamW, label smoothing 0.1); inference: batches of 256; "
      "%d threads;\n  %s\n  %s\n\n",
      model.summary().c_str(), thread_count(),
      bf16 ? "bf16 mixed precision: qkv's linear and flash attention products in bfloat16 (float32 sums), PyTorch "
             "under autocast"
           : "float32",
      rounds_note(our_train.size(), have_torch).c_str());
  std::printf("  %-8s %14s %14s\n", "", "train img/s", "infer img/s");
  std::printf("  %-8s %14.0f %14.0f\n", "qkv", best(our_train), best(our_infer));
  if (have_torch) {
    std::printf("  %-8s %14.0f %14.0f   (PyTorch %s, %lld parameters)\n", "PyTorch", best(their_train),
                best(their_infer), torch["torch"].get<std::string>().c_str(),
                (long long)torch["parameters"].get<int64_t>());
    std::printf("  %-8s %13.2fx %13.2fx\n", "ratio", out["train_ratio"].get<double>(), out["infer_ratio"].get<double>());
  } else {
    std::printf("  PyTorch  not available (needs python3 with torch)\n");
  }
  if (our_train.size() > 1) {
    std::printf("\n  by round (img/s): training qkv %s; PyTorch %s\n",
                join_rounds(out["qkv_train_images_per_s_by_round"]).c_str(),
                have_torch ? join_rounds(out["torch_train_images_per_s_by_round"]).c_str() : "-");
    std::printf("                    inference qkv %s; PyTorch %s\n",
                join_rounds(out["qkv_infer_images_per_s_by_round"]).c_str(),
                have_torch ? join_rounds(out["torch_infer_images_per_s_by_round"]).c_str() : "-");
  }
  return 0;
}

// --- generate: decoder-only models, prefill and cached decoding, vs plain PyTorch with its own KV cache ---

// Bytes/s of summing a buffer far larger than the caches, all threads (the decode bound's denominator).
double read_bandwidth() {
  const int64_t n = (int64_t)1 << 27;  // 512 MiB of floats
  std::vector<float> buf((size_t)n, 1.0f);
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    double total = 0;
#pragma omp parallel reduction(+ : total)
    {  // each thread sums its slice into 32 independent lanes, so loads, not one add chain, set the pace
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t lo = n * t / threads / 32 * 32, hi = n * (t + 1) / threads / 32 * 32;
      float lanes[32] = {};
      const float* p = buf.data();
      for (int64_t i = lo; i < hi; i += 32)
        for (int j = 0; j < 32; ++j) lanes[j] += p[i + j];
      for (float l : lanes) total += l;
    }
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!(total > 0)) std::fprintf(stderr, "bandwidth: unexpected sum\n");
    best = std::max(best, (double)n * 4 / dt);
  }
  return best;
}

// One model of bench generate: a recipe's shape with random weights, or the
// folder of --model. A Hugging Face folder (hf) is also run by transformers
// and by llama.cpp on a GGUF converted from it.
struct GenerateModel {
  std::string name;
  std::shared_ptr<DecoderLM> model;
  bool hf = false;
};

std::vector<GenerateModel> generate_models(const BenchArgs& a) {
  std::vector<GenerateModel> out;
  if (a.model_option && a.model_option->count() > 0) {
    LanguageModel lm = load_language_model(a.model, "bench generate");
    const std::string config = folder_config_path(a.model);
    out.push_back({std::filesystem::path(a.model).filename().string(), lm.model,
                   is_hf_config(read_file(config), config)});
    return out;
  }
  // The shipped recipes; the vocabulary is their tokenizer's size.
  for (const auto& [name, path] : {std::pair{"20M", "configs/lm-20m.json"}, std::pair{"100M", "configs/lm-100m.json"}}) {
    const std::string text = recipe_text(path, "generate");
    DecoderConfig c = DecoderConfig::from_json(text, path);
    c.vocab_size = TokenizerConfig::from_json(nlohmann::json::parse(text).at("tokenizer").dump(), path).vocab_size;
    c.dropout = 0.0f;
    Rng rng(1);
    out.push_back({name, std::make_shared<DecoderLM>(c, rng), false});
  }
  return out;
}

int run_bench_generate(const BenchArgs& a) {
  const int64_t prompt_len = 128, new_tokens = 32;
  const bool progress = !a.json && isatty(STDERR_FILENO);
  std::vector<GenerateModel> models = generate_models(a);
  if (progress) std::fprintf(stderr, "\rbench generate: memory bandwidth ...   ");
  const double bandwidth = read_bandwidth();
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  double best_fraction = 0;
  for (GenerateModel& gm : models) {
    const std::string& name = gm.name;
    DecoderLM& model = *gm.model;
    const DecoderConfig& c = model.config();
    QKV_CHECK(c.context >= prompt_len + new_tokens, name, ": context must hold ", prompt_len + new_tokens, " tokens");
    model.eval();
    NoGradGuard no_grad;
    std::vector<int64_t> prompt;
    for (int64_t i = 0; i < prompt_len; ++i) prompt.push_back(4 + (i * 7919) % (c.vocab_size - 4));
    if (progress) std::fprintf(stderr, "\rbench generate: qkv %s ...          ", name.c_str());
    {  // warm up the allocator and the kernels
      std::vector<KVCache> warm = model.make_caches(1, prompt_len + new_tokens);
      model.forward_cached(Tensor::from_ints({prompt.begin(), prompt.begin() + 8}, {1, 8}), warm);
    }
    // The model's parameters, counted before any conversion adds int8 scales.
    const int64_t params = model.parameter_count();
    // Prefill, then greedy decoding; the bytes of weights a step reads (decode_bytes) set the bound.
    auto run = [&](const char* impl) {
      std::vector<KVCache> caches = model.make_caches(1, prompt_len + new_tokens);
      auto t0 = std::chrono::steady_clock::now();
      // The last position's logits only, as qkv generate, llama.cpp and transformers' generate keep them.
      Tensor logits = model.forward_cached(Tensor::from_ints(prompt, {1, prompt_len}), caches, /*last_only=*/true);
      const double prefill = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<int64_t> tokens;
      t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < new_tokens; ++i) {
        const int64_t V = logits.size(-1);
        const float* last = logits.data<float>() + (logits.size(1) - 1) * V;
        tokens.push_back(2 + (std::max_element(last + 2, last + V) - (last + 2)));
        logits = model.forward_cached(Tensor::from_ints({tokens.back()}, {1, 1}), caches);
      }
      const double decode = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double decode_tps = new_tokens / decode;
      const double fraction = (double)model.decode_bytes() * decode_tps / bandwidth;
      best_fraction = std::max(best_fraction, fraction);
      rows.push_back({{"impl", impl},
                      {"size", name},
                      {"params", params},
                      {"weight_bytes", model.decode_bytes()},
                      {"prefill_tokens_per_s", prompt_len / prefill},
                      {"decode_tokens_per_s", decode_tps},
                      {"bandwidth_fraction", fraction}});
      return tokens;
    };
    const std::vector<int64_t> tokens = run("qkv");
    const double weight_bytes = (double)model.decode_bytes();
    // A peer's row, and how many of its greedy tokens are qkv float32's.
    auto peer_row = [&](const char* impl, const nlohmann::json& r, double bytes) {
      if (!r.contains("decode_tokens_per_s")) return false;
      int64_t same = 0;
      auto theirs = r["tokens"].get<std::vector<int64_t>>();
      for (size_t i = 0; i < std::min(theirs.size(), tokens.size()) && theirs[i] == tokens[i]; ++i) ++same;
      const double tps = r["decode_tokens_per_s"].get<double>();
      rows.push_back({{"impl", impl},
                      {"size", name},
                      {"params", params},
                      {"weight_bytes", bytes},
                      {"prefill_tokens_per_s", r["prefill_tokens_per_s"]},
                      {"decode_tokens_per_s", tps},
                      {"bandwidth_fraction", bytes * tps / bandwidth},
                      {"same_greedy_tokens", same}});
      return true;
    };
    // llama.cpp on the folder converted to GGUF of `type` (scripts/bench_generate_peers.py).
    auto llama_cpp = [&](const std::string& type) {
      if (!gm.hf) return;
      if (progress) std::fprintf(stderr, "\rbench generate: llama.cpp %s %s ...          ", type.c_str(), name.c_str());
      const nlohmann::json r = run_peer(a.python + " scripts/bench_generate_peers.py --peer llama.cpp --type " + type +
                                        " --model '" + a.model + "' --prompt-len " + std::to_string(prompt_len) +
                                        " --new-tokens " + std::to_string(new_tokens) + " --threads " +
                                        std::to_string(thread_count()));
      const bool object = r.is_object();
      if (!peer_row(("llama.cpp " + type).c_str(), r, object ? r.value("gguf_bytes", 0.0) : 0.0) && !a.json)
        std::fprintf(stderr, "\rbench generate: llama.cpp %s not run: %s\n", type.c_str(),
                     object ? r.value("error", std::string("no result")).c_str() : "no result (see --python)");
    };
    if (gm.hf) {
      if (progress) std::fprintf(stderr, "\rbench generate: transformers %s ...          ", name.c_str());
      peer_row("transformers",
               run_peer(a.python + " scripts/bench_generate_peers.py --peer transformers --model '" + a.model +
                        "' --prompt-len " + std::to_string(prompt_len) + " --new-tokens " +
                        std::to_string(new_tokens) + " --threads " + std::to_string(thread_count())),
               weight_bytes);
      llama_cpp("f32");
    }
    if (!gm.hf) {  // the same weights in plain PyTorch
      char tmpl[] = "/tmp/qkv_bench_generate_XXXXXX";
      const char* dir = mkdtemp(tmpl);
      QKV_CHECK(dir, "bench generate: cannot make a temporary folder");
      const std::string weights = std::string(dir) + "/model.safetensors";
      save_safetensors(weights, model.state_dict(), {});
      if (progress) std::fprintf(stderr, "\rbench generate: PyTorch %s ...          ", name.c_str());
      nlohmann::json config = nlohmann::json::parse(c.to_json());
      nlohmann::json torch = run_peer(a.python + " scripts/bench_generate_torch.py --weights " + weights +
                                      " --config '" + config.dump() + "' --prompt-len " + std::to_string(prompt_len) +
                                      " --new-tokens " + std::to_string(new_tokens) + " --threads " +
                                      std::to_string(thread_count()));
      std::filesystem::remove_all(dir);
      peer_row("torch", torch, weight_bytes);
    }
    // The same model with every Linear weight in bfloat16, float16, then in
    // blockwise int8 (the tied head too, as a converted copy of the embedding).
    for (const auto& [dtype, impl, gguf] : {std::tuple{DType::BF16, "qkv bf16", "bf16"},
                                            std::tuple{DType::F16, "qkv f16", "f16"},
                                            std::tuple{DType::I8, "qkv int8", "q8_0"}}) {
      if (progress) std::fprintf(stderr, "\rbench generate: %s %s ...          ", impl, name.c_str());
      model.convert_linear_weights(dtype);
      const std::vector<int64_t> low_tokens = run(impl);
      int64_t same = 0;
      for (size_t i = 0; i < tokens.size() && low_tokens[i] == tokens[i]; ++i) ++same;
      rows.back()["same_greedy_tokens_as_f32"] = same;
      llama_cpp(gguf);
    }
  }
  if (progress) std::fprintf(stderr, "\r%70s\r", "");
  nlohmann::ordered_json out = {{"suite", "generate"},
                                {"threads", thread_count()},
                                {"prompt_tokens", prompt_len},
                                {"new_tokens", new_tokens},
                                {"read_bandwidth_gb_per_s", bandwidth / 1e9},
                                {"rows", rows},
                                {"bandwidth_fraction", best_fraction}};
  if (a.json) {
    print_json(out);
    return 0;
  }
  std::printf("qkv bench generate: %s, batch 1, prompt %lld tokens, %lld greedy "
              "tokens, float32 (\"qkv bf16\": Linear weights in bfloat16, %s; \"qkv f16\": float16, widened in "
              "registers; \"qkv int8\": blockwise int8, %s), "
              "%d threads;\nmeasured read bandwidth %.1f GB/s; bound = bandwidth / bytes of weights a token reads\n\n",
              models.size() == 1 ? ("the decoder of " + a.model).c_str() : "decoders (RMSNorm, RoPE, SwiGLU, tied)",
              (long long)prompt_len, (long long)new_tokens, gemm_bf16_path(), gemm_int8_path(), thread_count(),
              bandwidth / 1e9);
  int width = 6;
  for (const GenerateModel& gm : models) width = std::max<int>(width, (int)gm.name.size());
  std::printf("  %-*s %-15s %12s %16s %16s %12s\n", width, "model", "impl", "params", "prefill tok/s", "decode tok/s",
              "of bound");
  for (auto& r : rows)
    std::printf("  %-*s %-15s %12lld %16.0f %16.1f %11.0f%%\n", width, r["size"].get<std::string>().c_str(),
                r["impl"].get<std::string>().c_str(), (long long)r["params"].get<int64_t>(),
                r["prefill_tokens_per_s"].get<double>(), r["decode_tokens_per_s"].get<double>(),
                100 * r["bandwidth_fraction"].get<double>());
  auto find = [&](const nlohmann::ordered_json& size, const char* impl) -> const nlohmann::ordered_json* {
    for (auto& r : rows)
      if (r["size"] == size && r["impl"] == impl) return &r;
    return nullptr;
  };
  for (const GenerateModel& gm : models)
    if (!find(gm.name, gm.hf ? "transformers" : "torch"))
      std::printf("  %s not available (needs %s with torch, safetensors%s)\n", gm.hf ? "transformers" : "PyTorch",
                  a.python.c_str(), gm.hf ? " and transformers" : "");
  for (auto& r : rows)
    for (const auto& [ours, theirs] : {std::pair{"qkv", "llama.cpp f32"}, std::pair{"qkv bf16", "llama.cpp bf16"},
                                       std::pair{"qkv f16", "llama.cpp f16"}, std::pair{"qkv int8", "llama.cpp q8_0"},
                                       std::pair{"qkv", "transformers"}})
      if (r["impl"] == ours)
        if (const nlohmann::ordered_json* t = find(r["size"], theirs))
          std::printf("  %s %s: decode %.2fx, prefill %.2fx %s\n", r["size"].get<std::string>().c_str(), ours,
                      r["decode_tokens_per_s"].get<double>() / (*t)["decode_tokens_per_s"].get<double>(),
                      r["prefill_tokens_per_s"].get<double>() / (*t)["prefill_tokens_per_s"].get<double>(), theirs);
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i]["impl"] == "qkv bf16" || rows[i]["impl"] == "qkv f16" || rows[i]["impl"] == "qkv int8")
      for (size_t j = 0; j < i; ++j)
        if (rows[j]["impl"] == "qkv" && rows[j]["size"] == rows[i]["size"])
          std::printf("  %s %s: decode %.2fx, prefill %.2fx qkv float32; greedy tokens as float32's for the first "
                      "%lld of %lld\n",
                      rows[i]["size"].get<std::string>().c_str(), rows[i]["impl"].get<std::string>().c_str() + 4,
                      rows[i]["decode_tokens_per_s"].get<double>() / rows[j]["decode_tokens_per_s"].get<double>(),
                      rows[i]["prefill_tokens_per_s"].get<double>() / rows[j]["prefill_tokens_per_s"].get<double>(),
                      (long long)rows[i]["same_greedy_tokens_as_f32"].get<int64_t>(), (long long)new_tokens);
  for (size_t i = 0; i + 1 < rows.size(); ++i)
    if (rows[i]["impl"] == "qkv" && rows[i + 1]["impl"] == "torch")
      std::printf("  %s: decode %.2fx, prefill %.2fx PyTorch; greedy tokens identical for the first %lld of %lld\n",
                  rows[i]["size"].get<std::string>().c_str(),
                  rows[i]["decode_tokens_per_s"].get<double>() / rows[i + 1]["decode_tokens_per_s"].get<double>(),
                  rows[i]["prefill_tokens_per_s"].get<double>() / rows[i + 1]["prefill_tokens_per_s"].get<double>(),
                  (long long)rows[i + 1]["same_greedy_tokens"].get<int64_t>(), (long long)new_tokens);
  return 0;
}

// Continuous batching's step without the server: `rows` sequences, each with
// caches of its own (as `qkv serve`'s slots) after a prompt of its own, go
// through DecoderLM::forward_cached_rows together, greedy. Best of 3 runs
// of 48 steps. The peer (llama-server) is measured through HTTP by
// scripts/bench_serve.py; this isolates the engine's part.
int run_bench_streams(const BenchArgs& a) {
  const int64_t prompt_len = 16, steps = 48, runs = 3;
  std::vector<GenerateModel> models = generate_models(a);
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  if (!a.json)
    std::printf(
        "qkv bench streams: greedy decoding steps of 1 to N sequences at once (forward_cached_rows, each "
        "sequence its own KV caches after a %lld-token prompt), best of %lld runs of %lld steps, %d threads\n\n"
        "  %-20s %6s %10s %12s %10s\n",
        (long long)prompt_len, (long long)runs, (long long)steps, thread_count(), "model", "rows", "step ms",
        "tokens/s", "x 1 row");
  for (GenerateModel& gm : models) {
    DecoderLM& model = *gm.model;
    model.eval();
    NoGradGuard no_grad;
    const int64_t V = model.config().vocab_size;
    QKV_CHECK(model.config().context >= prompt_len + steps + 1, gm.name, ": context must hold ", prompt_len + steps + 1,
              " tokens");
    double one_row = 0;
    for (int64_t rows : a.rows) {
      QKV_CHECK(rows > 0, "bench streams: --rows must be positive, got ", rows);
      double best = 1e30;
      for (int64_t run = 0; run < runs; ++run) {
        std::vector<std::vector<KVCache>> caches(rows);
        std::vector<std::vector<KVCache>*> slots;
        std::vector<int64_t> next(rows);
        auto argmax = [&](const Tensor& logits, int64_t row, int64_t position) {
          const float* l = logits.data<float>() + (row * logits.size(1) + position) * V;
          return (int64_t)(std::max_element(l, l + V) - l);
        };
        for (int64_t r = 0; r < rows; ++r) {
          caches[r] = model.make_caches(1, prompt_len + steps + 1);
          slots.push_back(&caches[r]);
          std::vector<int64_t> prompt;
          for (int64_t i = 0; i < prompt_len; ++i) prompt.push_back(4 + (i * 7919 + r * 104729) % (V - 4));
          next[r] =
              argmax(model.forward_cached(Tensor::from_ints(prompt, {1, prompt_len}), caches[r]), 0, prompt_len - 1);
        }
        auto step = [&] {
          Tensor logits = model.forward_cached_rows(Tensor::from_ints(next, {rows, 1}), slots);
          for (int64_t r = 0; r < rows; ++r) next[r] = argmax(logits, r, 0);
        };
        step();  // warm up
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 1; i < steps; ++i) step();
        best =
            std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (steps - 1));
      }
      const double tps = rows / best;
      if (rows == 1) one_row = tps;
      results.push_back({{"model", gm.name}, {"rows", rows}, {"step_ms", best * 1e3}, {"tokens_per_s", tps}});
      if (!a.json)
        std::printf("  %-20s %6lld %10.2f %12.1f %10s\n", gm.name.c_str(), (long long)rows, best * 1e3, tps,
                    one_row > 0 ? (std::to_string(tps / one_row).substr(0, 4) + "x").c_str() : "-");
    }
  }
  if (a.json) {
    nlohmann::ordered_json out = {{"suite", "streams"}, {"threads", thread_count()}, {"rows", results}};
    print_json(out);
  }
  return 0;
}

// --- embed: sentence embeddings of an encoder folder, qkv vs sentence-transformers ---

// Sentences for `bench embed` without --test: 8 to 60 words each, drawn
// (seeded) from a list of common English words, so that lengths vary as
// real text's do and every word is in an English vocabulary.
std::vector<std::string> bench_sentences(int64_t count) {
  static const char* const words[] = {
      "the",     "model",   "reads",   "a",       "sentence", "and",      "every",    "token",   "attends", "to",
      "others",  "before",  "it",      "with",    "weights",  "that",     "were",     "learned", "from",    "large",
      "amounts", "of",      "text",    "people",  "write",    "about",    "cities",   "rivers",  "music",   "food",
      "science", "history", "quickly", "slowly",  "bright",   "morning",  "evening",  "market",  "school",  "train",
      "station", "garden",  "window",  "because", "although", "while",    "after",    "under",   "between", "small",
      "old",     "new",     "green",   "ancient", "modern",   "language", "question", "answer",  "simple",  "careful"};
  const int64_t n_words = sizeof words / sizeof *words;
  Rng rng(0);
  std::vector<std::string> out;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t length = 8 + (int64_t)(rng.next_uniform() * 53);
    std::string s;
    for (int64_t w = 0; w < length; ++w) {
      if (w) s += ' ';
      s += words[std::min(n_words - 1, (int64_t)(rng.next_uniform() * n_words))];
    }
    out.push_back(s + ".");
  }
  return out;
}

// The same sentences, embedded by qkv in float32, bf16 and int8 (best of 3
// passes over all of them, after one) and by sentence-transformers' encode()
// in float32 (scripts/bench_embed_peers.py), on the same threads.
int run_bench_embed(const BenchArgs& a) {
  QKV_CHECK(a.model_option && a.model_option->count() > 0,
            "bench embed: --model is required (an encoder folder: a BertModel with sentence-transformers' files)");
  std::vector<std::string> sentences;
  if (a.test_option && a.test_option->count() > 0) {
    std::istringstream in(read_file(a.test));
    for (std::string line; std::getline(in, line) && (int64_t)sentences.size() < a.sentences;)
      if (!line.empty()) sentences.push_back(line);
    QKV_CHECK(!sentences.empty(), "bench embed: ", a.test, " has no sentences");
  } else {
    sentences = bench_sentences(a.sentences);
  }
  const bool progress = !a.json && isatty(STDERR_FILENO);
  const int rounds = 3, first = 8;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::vector<std::vector<float>> ours_first;
  int64_t tokens = 0;
  for (const char* dtype : {"f32", "bf16", "int8"}) {
    if (progress) std::fprintf(stderr, "\rbench embed: qkv %s ...          ", dtype);
    EmbeddingModel m = load_embedding_model(a.model, "bench embed", dtype);
    std::vector<int64_t> counts;
    std::vector<std::vector<float>> v = embed_texts(m, sentences, false, {.truncate = true}, {}, &counts);
    if (ours_first.empty()) ours_first.assign(v.begin(), v.begin() + std::min<size_t>(first, v.size()));
    tokens = 0;
    for (int64_t c : counts) tokens += c;
    double best = 1e30;
    release_cached_memory();
    const uint64_t base = allocator_stats().bytes_in_use;
    reset_peak_bytes();
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      embed_texts(m, sentences, false, {.truncate = true});
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    rows.push_back({{"impl", std::string("qkv ") + dtype},
                    {"sentences_per_s", sentences.size() / best},
                    {"tokens_per_s", tokens / best},
                    {"peak_extra_mb", (allocator_stats().peak_bytes_in_use - base) / 1e6}});
  }
  // The peer reads the sentences from a file of its own.
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("qkv-bench-embed-" + std::to_string(getpid()) + ".txt");
  {
    std::string text;
    for (const std::string& s : sentences) text += s + "\n";
    write_file_atomic(file.string(), text);
  }
  if (progress) std::fprintf(stderr, "\rbench embed: sentence-transformers (scripts/bench_embed_peers.py) ...   ");
  const nlohmann::json peer =
      run_peer(a.python + " scripts/bench_embed_peers.py --model '" + a.model + "' --sentences '" + file.string() +
               "' --threads " + std::to_string(thread_count()) + " --first " + std::to_string(first));
  std::filesystem::remove(file);
  if (progress) std::fprintf(stderr, "\r%70s\r", "");
  const bool have_peer = !peer.is_null() && !peer.contains("error");
  double peer_rate = 0, max_diff = -1;
  if (have_peer) {
    peer_rate = peer["sentences_per_s"].get<double>();
    // Every embedding has the same width; flattened, they are one table.
    const int64_t width = ours_first.empty() ? 0 : (int64_t)ours_first[0].size();
    std::vector<float> flat;
    for (const auto& v : ours_first) flat.insert(flat.end(), v.begin(), v.end());
    max_diff = max_abs_diff_with_peer(flat.data(), (int64_t)ours_first.size(), width, peer["first"]);
    for (auto& r : rows) r["vs_peer"] = r["sentences_per_s"].get<double>() / peer_rate;
  }
  if (a.json) {
    nlohmann::ordered_json out = {{"suite", "embed"},          {"model", a.model},
                                  {"threads", thread_count()}, {"sentences", sentences.size()},
                                  {"tokens", tokens},          {"qkv", rows}};
    if (have_peer) {
      out["peer"] = {{"impl", "sentence-transformers " + peer["version"].get<std::string>() + " (torch " +
                                  peer["torch"].get<std::string>() + ")"},
                     {"sentences_per_s", peer_rate},
                     {"max_abs_diff_f32_first", max_diff}};
    } else {
      out["peer"] = peer.is_null() ? nlohmann::json("not available") : peer["error"];
    }
    print_json(out);
    return 0;
  }
  std::printf("qkv bench embed: %s, %zu sentences (%lld tokens with [CLS] and [SEP]), best of %d passes, %d threads\n",
              a.model.c_str(), sentences.size(), (long long)tokens, rounds, thread_count());
  if (have_peer)
    std::printf(
        "peer: sentence-transformers %s (torch %s) encode(), float32, batches of 32; its vectors of the first "
        "%d sentences %s\n\n",
        peer["version"].get<std::string>().c_str(), peer["torch"].get<std::string>().c_str(), first,
        agreement(max_diff).c_str());
  else
    std::printf("peer: sentence-transformers not available (%s)\n\n",
                peer.is_null() ? "its script failed" : peer["error"].get<std::string>().c_str());
  std::printf("  %-24s %14s %12s %14s %10s\n", "", "sentences/s", "tokens/s", "peak extra MB", "vs peer");
  for (const auto& r : rows)
    std::printf("  %-24s %14.1f %12.0f %14.1f %10s\n", r["impl"].get<std::string>().c_str(),
                r["sentences_per_s"].get<double>(), r["tokens_per_s"].get<double>(), r["peak_extra_mb"].get<double>(),
                have_peer ? (std::to_string(r["vs_peer"].get<double>()).substr(0, 4) + "x").c_str() : "-");
  if (have_peer)
    std::printf("  %-24s %14.1f %12.0f %14s %10s\n", "sentence-transformers", peer_rate,
                tokens * peer_rate / sentences.size(), "-", "1.00x");
  return 0;
}

int run_bench(const BenchArgs& a) {
  set_threads(a.threads);
  if (!a.json) std::printf("%s\n", runtime_summary().c_str());
  if (a.suite == "attention") return run_bench_attention(a);
  if (a.suite == "train") return run_bench_train(a);
  if (a.suite == "decode") return run_bench_decode(a);
  if (a.suite == "vit") return run_bench_vit(a);
  if (a.suite == "generate") return run_bench_generate(a);
  if (a.suite == "streams") return run_bench_streams(a);
  if (a.suite == "embed") return run_bench_embed(a);
  QKV_CHECK(a.suite == "ops", "bench: unknown suite '", a.suite,
            "' (available: ops, attention, train, decode, vit, generate, streams, embed)");
  std::vector<GemmRow> gemms = {
      {"square 256", 1, 256, 256, 256, false},
      {"square 512", 1, 512, 512, 512, false},
      {"square 1024", 1, 1024, 1024, 1024, false},
      {"qkv projection", 1, 2048, 768, 256, true},
      {"ffn expand", 1, 2048, 1024, 256, true},
      {"ffn contract", 1, 2048, 256, 1024, true},
      {"vocab projection", 1, 2048, 8000, 256, true},
      {"attention scores", 256, 32, 32, 64, false},
      // The ViT recipe (configs/vit-fashion-mnist.json): 128 images x 16 patches, d_model 128, MLP 384.
      {"vit qkv", 1, 2048, 384, 128, true},
      {"vit mlp contract", 1, 2048, 128, 384, true},
      // Decoding a batch: 32 sentences x 4 beams (the Marian bench), and 32 greedy rows.
      {"beams ffn expand", 1, 128, 1024, 256, true},
      {"beams ffn contract", 1, 128, 256, 1024, true},
      {"beams vocab", 1, 128, 8000, 256, true},
      {"greedy ffn expand", 1, 32, 1024, 256, true},
      {"greedy vocab", 1, 32, 8000, 256, true},
      // One decoding step of 16 served streams of the lm-20m Llama (scripts/make_bench_llama.py:
      // d_model 512, SwiGLU 1408, vocabulary 4096): the projections read the weights once per step.
      {"16 rows q/k/v/o", 1, 16, 512, 512, true},
      {"16 rows gate/up", 1, 16, 1408, 512, true},
      {"16 rows down", 1, 16, 512, 1408, true},
      {"16 rows vocab", 1, 16, 4096, 512, true},
  };
  nlohmann::ordered_json out;
  out["suite"] = "ops";
  out["threads"] = thread_count();
  out["matmul"] = nlohmann::ordered_json::array();
  // The second peer: torch.matmul / F.linear on the same shapes and threads
  // (MKL on x86), all shapes in one Python process, then our rows, --rounds
  // times (rounds_note); each column keeps its best round.
  std::vector<const GemmRow*> shapes;
  for (const GemmRow& r : gemms) shapes.push_back(&r);
  nlohmann::json torch;  // the best round of each shape's torch figure in torch["rows"][i]["gflops"]
  std::vector<nlohmann::ordered_json> rows(gemms.size());
  const bool progress = !a.json && isatty(STDERR_FILENO);
  for (int round = 1; round <= a.rounds; ++round) {
    if (round == 1 || !torch.is_null()) {
      const nlohmann::json t = torch_matmul(a, shapes, "float32");
      if (torch.is_null()) {
        torch = t;
      } else if (!t.is_null()) {
        for (size_t i = 0; i < gemms.size(); ++i)
          torch["rows"][i]["gflops"] =
              std::max(torch["rows"][i]["gflops"].get<double>(), t["rows"][i]["gflops"].get<double>());
      }
    }
    for (size_t i = 0; i < gemms.size(); ++i) {
      if (progress) std::fprintf(stderr, "\rbench ops: qkv, round %d of %d ...   ", round, a.rounds);
      nlohmann::ordered_json row = bench_gemm(gemms[i], a.seconds);
      if (round > 1)
        for (const char* key : {"qkv_gflops", "sgemm_gflops"})
          row[key] = std::max(row[key].get<double>(), rows[i][key].get<double>());
      row["ratio"] = row["qkv_gflops"].get<double>() / row["sgemm_gflops"].get<double>();
      rows[i] = row;
    }
    if (progress) std::fprintf(stderr, "\r%70s\r", "");
  }
  const bool have_torch = !torch.is_null();
  if (have_torch) out["torch"] = torch["torch"];
  out["rounds"] = a.rounds;
  if (!a.json) {
    std::printf(
        "qkv bench ops (%d threads); peers in the same run: raw sgemm of the loaded BLAS on the same\n"
        "buffers, and %s; \"vs best\" is qkv over the faster peer;\n%s\n\n",
        thread_count(),
        have_torch ? ("PyTorch " + torch["torch"].get<std::string>() + " torch.matmul / F.linear").c_str()
                   : "PyTorch (not available: needs python3 with torch)",
        rounds_note(a.rounds, have_torch).c_str());
    std::printf("%-18s %-26s %10s %12s %11s %8s\n", "matmul", "shape", "qkv GF/s", "sgemm GF/s", "torch GF/s",
                "vs best");
  }
  for (size_t i = 0; i < gemms.size(); ++i) {
    const GemmRow& r = gemms[i];
    nlohmann::ordered_json& row = rows[i];
    double best = row["sgemm_gflops"].get<double>();
    if (have_torch) {
      const double t = torch["rows"][i]["gflops"].get<double>();
      row["torch_gflops"] = t;
      best = std::max(best, t);
    }
    row["vs_best_peer"] = row["qkv_gflops"].get<double>() / best;
    out["matmul"].push_back(row);
    if (!a.json)
      std::printf("%-18s %-26s %10.1f %12.1f %11s %8.2f\n", r.name.c_str(), row["shape"].get<std::string>().c_str(),
                  row["qkv_gflops"].get<double>(), row["sgemm_gflops"].get<double>(),
                  have_torch ? std::to_string((int)std::lround(row["torch_gflops"].get<double>())).c_str() : "-",
                  row["vs_best_peer"].get<double>());
  }
  bench_bf16_linear(a, gemms, out);
  // Decoding: one row (a single stream) and 16 (16 streams), the weights from memory.
  out["matmul_weights_from_memory"] = nlohmann::ordered_json::array();
  if (!a.json)
    std::printf("\n%-18s %-26s %10s %12s %12s %8s\n", "weights streamed", "shape", "qkv GF/s", "weights GB/s",
                "sgemm GF/s", "vs sgemm");
  for (const GemmRow& r : std::vector<GemmRow>{{"1 row gate/up", 1, 1, 1408, 512, true},
                                               {"16 rows q/k/v/o", 1, 16, 512, 512, true},
                                               {"16 rows gate/up", 1, 16, 1408, 512, true},
                                               {"16 rows down", 1, 16, 512, 1408, true},
                                               {"16 rows vocab", 1, 16, 4096, 512, true}}) {
    auto row = bench_gemm_streamed(r, a.seconds);
    out["matmul_weights_from_memory"].push_back(row);
    if (!a.json)
      std::printf("%-18s %-26s %10.1f %12.1f %12.1f %8.2f\n", r.name.c_str(), row["shape"].get<std::string>().c_str(),
                  row["qkv_gflops"].get<double>(), row["qkv_weight_gb_per_s"].get<double>(),
                  row["sgemm_gflops"].get<double>(), row["ratio"].get<double>());
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
    print_json(out);
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
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Measure speed side by side with a peer (suites: ops, attention, train, decode, vit, generate, streams, embed)");
  sub->add_option("suite", args->suite,
                  "Which benchmark: ops | attention | train | decode | vit | generate | streams | embed")
      ->required();
  args->model_option =
      sub->add_option(
             "--model", args->model,
             "decode: a trained model folder; generate, streams: a decoder folder (qkv or Hugging Face; without it, "
             "random models of configs/lm-20m.json and lm-100m.json); embed: an encoder folder (required); vit: "
             "a vit folder (Hugging Face ViT or DeiT, or qkv's), inference against transformers (without it, the "
             "recipe's model, training and inference against PyTorch)")
          ->capture_default_str();
  args->test_option =
      sub->add_option("--test", args->test,
                      "decode: sentences to translate (TSV; for a Hugging Face folder one source per line, default "
                      "DIR/sources.txt as scripts/make_bench_marian.py writes it); embed: sentences, one per line "
                      "(default: generated English)")
          ->capture_default_str();
  sub->add_option("--sentences", args->sentences, "decode, embed: how many")->capture_default_str();
  sub->add_option("--steps", args->steps, "train, vit: timed training steps (vit --model: timed forwards a round)")
      ->capture_default_str();
  sub->add_option("--images", args->images, "vit --model: images a batch")
      ->check(CLI::Range((int64_t)1, (int64_t)4096))
      ->capture_default_str();
  sub->add_option("--rounds", args->rounds,
                  "train, vit, attention, ops (its float32 matmul table): measure qkv and the PyTorch peer alternately "
                  "this many times and keep each one's best (the machine's speed moves between minutes)")
      ->check(CLI::Range(1, 20))
      ->capture_default_str();
  sub->add_option("--rows", args->rows, "streams: how many sequences decode together, one measurement each")
      ->capture_default_str();
  sub->add_option("--precision", args->precision,
                  "train, vit, attention: f32, or bf16 (mixed precision: qkv's Bf16AutocastGuard, PyTorch's "
                  "autocast; attention adds bf16 rows beside the float32 ones)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  sub->add_option("--n", args->lengths, "attention: sequence lengths")->capture_default_str();
  sub->add_option("--max-naive", args->max_naive, "attention: longest length for the naive path")->capture_default_str();
  sub->add_flag("--causal", args->causal, "attention: causal mask");
  sub->add_option("--python", args->python,
                  "attention, train, vit, generate: Python with torch (generate --model: transformers, "
                  "llama-cpp-python; vit --model: transformers) for the peer columns")
      ->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object instead of tables");
  sub->add_option("--threads", args->threads, "Threads (0: all cores)")->capture_default_str();
  sub->add_option("--seconds", args->seconds, "Seconds per measurement round")->capture_default_str();
  return [args] { return run_bench(*args); };
}

}  // namespace qkv::cli
