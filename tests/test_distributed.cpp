// Data parallelism's parts that one process can test (tests/mpi_test.sh runs
// two): backward reporting each leaf as its gradient becomes final, the
// gradient reducer's buckets, and the shards of a batch.
#include <map>
#include <set>

#include "qkv/nn.h"
#include "qkv/ops.h"
#include "qkv/process_group.h"
#include "src/train/gradient_reducer.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

TEST(Distributed, LeafReadyReportsEachLeafOnceWithItsFinalGradient) {
  Rng rng(1);
  Tensor w1 = Tensor::randn({3, 3}, rng).set_requires_grad(true);
  Tensor w2 = Tensor::randn({3, 3}, rng).set_requires_grad(true);
  Tensor b = Tensor::randn({3}, rng).set_requires_grad(true);
  Tensor x = Tensor::randn({2, 3}, rng);  // no gradient: never reported
  // w1 is used first and last, so it is final only at the end of backward.
  Tensor h = add(matmul(x, w1), b);
  Tensor loss = sum(mul(matmul(matmul(h, w2), w1), h));
  std::map<const TensorImpl*, std::vector<float>> at_report;
  std::vector<const TensorImpl*> order;
  loss.backward(Tensor(), [&](const Tensor& leaf) {
    order.push_back(&leaf.impl());
    at_report[&leaf.impl()] = leaf.grad().contiguous().to_vector();
  });
  EXPECT_EQ(order.size(), 3u);
  EXPECT_EQ(std::set<const TensorImpl*>(order.begin(), order.end()).size(), 3u) << "a leaf reported twice";
  for (const Tensor* t : {&w1, &w2, &b}) {
    ASSERT_TRUE(at_report.count(&t->impl()));
    EXPECT_EQ(at_report[&t->impl()], t->grad().contiguous().to_vector()) << "reported before its gradient was final";
  }
  EXPECT_FALSE(at_report.count(&x.impl()));
}

// A stand-in for a second process that holds the same gradients: every sum
// doubles. It records when sums start, to show they start during backward.
class TwinGroup final : public ProcessGroup {
public:
  int started = 0;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void sum(float* d, int64_t n) override { double_all(d, n); }
  void sum(double* d, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) d[i] *= 2;
  }
  void start_sum(float* d, int64_t n) override { ++started, pending_.emplace_back(d, n); }
  void poll() override {}
  void wait_all() override {
    for (auto [d, n] : pending_) double_all(d, n);
    pending_.clear();
  }
  void broadcast(void*, size_t, int) override {}

private:
  static void double_all(float* d, int64_t n) {
    for (int64_t i = 0; i < n; ++i) d[i] *= 2;
  }
  std::vector<std::pair<float*, int64_t>> pending_;
};

TEST(Distributed, ReducerSumsEveryGradientInBucketsStartedDuringBackward) {
  Rng rng(2);
  Linear first({8, 16}, rng), second({16, 4}, rng), unused({4, 4}, rng);
  std::vector<Tensor> params;
  // Registered first, so its buckets come last (buckets follow the reverse
  // order): they wait for a gradient that never comes, and start in finish().
  for (Module* m : {(Module*)&unused, (Module*)&first, (Module*)&second})
    for (Tensor& p : m->parameters()) params.push_back(p);
  TwinGroup group;
  GradientReducer reducer(params, group, /*bucket_bytes=*/256);  // several buckets
  EXPECT_GT(reducer.buckets(), 3u);
  Tensor loss = sum(second.forward(first.forward(Tensor::randn({5, 8}, rng))));
  loss.backward(Tensor(), [&](const Tensor& leaf) { reducer.ready(leaf); });
  std::map<const TensorImpl*, std::vector<float>> own;
  for (Tensor& p : params)
    if (p.grad().defined()) own[&p.impl()] = p.grad().contiguous().to_vector();
  const int during_backward = group.started;
  EXPECT_GT(during_backward, 0) << "no bucket started before backward ended";
  EXPECT_LT(during_backward, (int)reducer.buckets()) << "unused's bucket started without its gradient";
  reducer.finish();
  EXPECT_EQ(group.started, (int)reducer.buckets());
  for (Tensor& p : params) {
    ASSERT_TRUE(p.grad().defined()) << "finish() leaves every parameter a gradient";
    const std::vector<float> got = p.grad().contiguous().to_vector();
    if (!own.count(&p.impl())) {
      EXPECT_EQ(got, std::vector<float>(got.size(), 0.f)) << "a parameter no node reached sums zeros";
      continue;
    }
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], 2 * own[&p.impl()][i]);
  }
}

TEST(Distributed, ShardsCoverTheBatchInNearlyEqualParts) {
  for (int count : {1, 2, 3, 8})
    for (int64_t items : {0, 1, 5, 7, 64}) {
      int64_t next = 0;
      for (int i = 0; i < count; ++i) {
        auto [first, last] = Shard{i, count}.range(items);
        EXPECT_EQ(first, next);
        EXPECT_LE(last - first, items / count + 1);
        EXPECT_GE(last - first, items / count);
        next = last;
      }
      EXPECT_EQ(next, items);
    }
  EXPECT_EQ(shard_of(nullptr).range(9), (std::pair<int64_t, int64_t>{0, 9}));
}

}  // namespace
}  // namespace qkv
