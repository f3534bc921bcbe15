// qkv demo: until the translation Transformer lands, the demo trains a small
// real model end to end in seconds -- an MLP separating two interleaved
// spirals -- prints the loss as it falls, draws what it learned, saves a
// model folder, and checks that the saved model reloads to the same answers.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "qkv/allocator.h"
#include "qkv/io.h"
#include "qkv/nn.h"
#include "qkv/optim.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {
namespace {

struct DemoArgs {
  std::string out = "out/demo";
  int steps = 600;
  int hidden = 64;
  uint64_t seed = 1;
  int threads = 0;
};

// Two interleaved spirals, `n` points each: class k winds half a turn behind class 1-k.
void make_spirals(int n, Rng& rng, Tensor* x, Tensor* y) {
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < 2; ++k) {
      float t = 0.05f + 0.95f * rng.next_uniform();
      float angle = 3.0f * (float)M_PI * t + (float)M_PI * k;
      float r = t + 0.02f * rng.next_normal();
      xs.push_back(r * std::cos(angle));
      xs.push_back(r * std::sin(angle));
      ys.push_back(k);
    }
  }
  *x = Tensor::from_vector(xs, {2 * (int64_t)n, 2});
  *y = Tensor::from_ints(ys, {2 * (int64_t)n});
}

class SpiralNet : public Module {
public:
  SpiralNet(int64_t hidden, Rng& rng) {
    fc1 = register_module("fc1", std::make_shared<Linear>(LinearOptions{2, hidden}, rng));
    fc2 = register_module("fc2", std::make_shared<Linear>(LinearOptions{hidden, hidden}, rng));
    fc3 = register_module("fc3", std::make_shared<Linear>(LinearOptions{hidden, 2}, rng));
  }
  Tensor forward(const Tensor& x) const { return fc3->forward(gelu(fc2->forward(gelu(fc1->forward(x))))); }
  std::shared_ptr<Linear> fc1, fc2, fc3;
};

float accuracy(const SpiralNet& net, const Tensor& x, const Tensor& y) {
  NoGradGuard no_grad;
  std::vector<float> logits = net.forward(x).to_vector();
  std::vector<int64_t> labels = y.to_ints();
  int correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) correct += (logits[2 * i + 1] > logits[2 * i]) == (labels[i] == 1);
  return (float)correct / (float)labels.size();
}

// The learned decision regions as text: '.' and '#' for the two classes.
void draw(const SpiralNet& net) {
  const int w = 48, h = 20;
  std::vector<float> grid;
  for (int r = 0; r < h; ++r)
    for (int c = 0; c < w; ++c) {
      grid.push_back(-1.1f + 2.2f * (c + 0.5f) / w);
      grid.push_back(1.1f - 2.2f * (r + 0.5f) / h);
    }
  NoGradGuard no_grad;
  std::vector<float> logits = net.forward(Tensor::from_vector(grid, {w * h, 2})).to_vector();
  std::printf("what the model learned (the plane [-1.1, 1.1]^2; '#' = spiral 1, '.' = spiral 0):\n");
  for (int r = 0; r < h; ++r) {
    std::printf("  ");
    for (int c = 0; c < w; ++c) std::putchar(logits[2 * (r * w + c) + 1] > logits[2 * (r * w + c)] ? '#' : '.');
    std::putchar('\n');
  }
}

int run_demo(const DemoArgs& a) {
  QKV_CHECK(a.steps > 0, "demo: --steps must be positive, got ", a.steps);
  QKV_CHECK(a.hidden > 0, "demo: --hidden must be positive, got ", a.hidden);
  set_threads(a.threads);
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  QKV_CHECK(std::filesystem::is_directory(a.out), "demo: cannot create the output folder ", a.out,
            ec ? ": " + ec.message() : "");

  Rng data_rng(a.seed), init_rng(a.seed + 1);
  Tensor x_train, y_train, x_test, y_test;
  make_spirals(500, data_rng, &x_train, &y_train);
  make_spirals(250, data_rng, &x_test, &y_test);
  SpiralNet net(a.hidden, init_rng);
  std::printf("qkv demo: an MLP (2 -> %d -> %d -> 2, GELU, %lld parameters) learns two interleaved spirals\n",
              a.hidden, a.hidden, (long long)net.parameter_count());
  std::printf("  train %lld points, held-out %lld points, AdamW with warmup + cosine, %d steps, %d threads\n\n",
              (long long)x_train.size(0), (long long)x_test.size(0), a.steps, thread_count());

  AdamW opt(net.parameters(), {.lr = 1e-2f, .weight_decay = 1e-4f});
  WarmupCosine schedule{.peak_lr = 1e-2f, .min_lr = 1e-4f, .warmup_steps = a.steps / 20, .total_steps = a.steps};
  nlohmann::json history = nlohmann::json::array();
  auto start = std::chrono::steady_clock::now();
  const int report_every = std::max(1, a.steps / 12);
  uint64_t warm_allocs = 0;
  float loss_value = 0;
  for (int step = 1; step <= a.steps; ++step) {
    uint64_t allocs_before = allocator_stats().system_allocs;
    opt.set_lr(schedule.lr_at(step));
    opt.zero_grad();
    Tensor loss = cross_entropy(net.forward(x_train), y_train);
    loss.backward();
    clip_grad_norm(net.parameters(), 1.0f);
    opt.step();
    loss_value = loss.item();
    if (step > 2) warm_allocs += allocator_stats().system_allocs - allocs_before;
    if (step % report_every == 0 || step == 1 || step == a.steps) {
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      float acc = accuracy(net, x_train, y_train);
      std::printf("  step %5d/%d  loss %.4f  train accuracy %5.1f%%  lr %.2e  %6.0f steps/s\n", step, a.steps,
                  loss_value, 100 * acc, opt.lr(), step / std::max(secs, 1e-9));
      std::fflush(stdout);
      history.push_back({{"step", step}, {"loss", loss_value}, {"train_accuracy", acc}});
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  float test_acc = accuracy(net, x_test, y_test);
  std::printf("\ntrained in %.2f s; held-out accuracy %.1f%%; memory requests to the system in warm steps: %llu\n\n",
              secs, 100 * test_acc, (unsigned long long)warm_allocs);
  draw(net);

  // The model folder: config, weights, trainer state; each file written atomically.
  nlohmann::ordered_json config = {{"arch", "mlp"}, {"task", "two-spirals"}, {"in_features", 2},
                                   {"hidden", a.hidden}, {"classes", 2}, {"activation", "gelu"}};
  write_file_atomic(a.out + "/config.json", config.dump(2) + "\n");
  save_safetensors(a.out + "/model.safetensors", net.state_dict(), {{"format", "qkv"}, {"arch", "mlp"}});
  nlohmann::ordered_json state = {{"step", a.steps}, {"seed", a.seed}, {"held_out_accuracy", test_acc},
                                  {"history", history}};
  write_file_atomic(a.out + "/trainer_state.json", state.dump(2) + "\n");

  Rng other(12345);
  SpiralNet reloaded(a.hidden, other);
  reloaded.load_state_dict(load_safetensors(a.out + "/model.safetensors").as_map());
  float reload_acc = accuracy(reloaded, x_test, y_test);
  QKV_CHECK(reload_acc == test_acc, "demo: the reloaded model scores ", reload_acc, ", the trained one ", test_acc);
  std::printf("\nwrote %s/{config.json, model.safetensors, trainer_state.json}; reloaded: same held-out accuracy\n",
              a.out.c_str());
  std::printf("look inside: qkv inspect %s\n", a.out.c_str());
  return 0;
}

}  // namespace

Run add_demo(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* sub = app.add_subcommand("demo", "Train a small model in seconds, show it learning, save and reload it");
  sub->add_option("--out", args->out, "Folder for the trained model")->capture_default_str();
  sub->add_option("--steps", args->steps, "Training steps")->capture_default_str();
  sub->add_option("--hidden", args->hidden, "Hidden width of the MLP")->capture_default_str();
  sub->add_option("--seed", args->seed, "Seed for data and initialization")->capture_default_str();
  sub->add_option("--threads", args->threads, "Threads (0: all cores)")->capture_default_str();
  return [args] { return run_demo(*args); };
}

}  // namespace qkv::cli
