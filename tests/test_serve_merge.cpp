// qkv serve's merging of concurrent requests into shared batches
// (tools/serve/merged_runs.h): each request gets its own results, requests
// that arrive while a batch runs share the next one, only requests of one key
// share a batch, a bad input fails only the request that sent it, and with a
// wait requests that arrive on an idle model a moment apart share a run.
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "tests/test_util.h"
#include "tools/serve/merged_runs.h"

namespace qkv::serve {
namespace {

// Requests 0..n-1 of three items each (10r, 10r+1, 10r+2) through `runs`,
// request 0 first, its batch held until the others wait; request `other`
// with another key, request `bad` with a negative item. The run doubles each
// item, records its batch, and throws on a negative item.
struct Round {
  std::vector<std::vector<int>> results, batches;
  std::vector<std::string> errors;
};

Round round(MergedRuns<int, int>& runs, int n, int other, int bad) {
  Round out;
  out.results.resize(n), out.errors.resize(n);
  std::mutex mutex;
  std::atomic<bool> first{true}, started{false};
  const MergedRuns<int, int>::Run run = [&](const std::vector<int>& items) {
    started = true;
    if (first.exchange(false)) {
      const auto start = std::chrono::steady_clock::now();
      while (runs.waiting() < (size_t)n - 1 && std::chrono::steady_clock::now() - start < std::chrono::seconds(30))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      out.batches.push_back(items);
    }
    std::vector<int> doubled;
    for (int x : items) {
      if (x < 0) throw std::runtime_error("negative item " + std::to_string(x));
      doubled.push_back(2 * x);
    }
    return doubled;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      if (r > 0)  // after request 0's batch has started
        while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::vector<int> items = {10 * r, 10 * r + 1, 10 * r + 2};
      if (r == bad) items[1] = -1;
      try {
        out.results[r] = runs.submit(r == other ? "other" : "same", items, run);
      } catch (const std::exception& e) {
        out.errors[r] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(MergedRuns, ConcurrentRequestsShareBatchesAndKeepTheirOwnResults) {
  MergedRuns<int, int> runs(64);
  const Round a = round(runs, 8, /*other=*/7, /*bad=*/-1);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(a.errors[r], "") << r;
    EXPECT_EQ(a.results[r], (std::vector<int>{20 * r, 20 * r + 2, 20 * r + 4})) << r;
  }
  // Request 0 alone, 1-6 in one batch of 18 items, 7 (another key) alone:
  // three runs where one per request would be eight.
  EXPECT_EQ(runs.runs(), 3);
  std::vector<size_t> sizes;
  for (const std::vector<int>& b : a.batches) sizes.push_back(b.size());
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<size_t>{3, 3, 18}));
  for (const std::vector<int>& b : a.batches)
    if (b.size() == 18) {
      EXPECT_EQ(std::count_if(b.begin(), b.end(), [](int x) { return x >= 70; }), 0);
    }
}

TEST(MergedRuns, ABadInputFailsOnlyItsOwnRequest) {
  MergedRuns<int, int> runs(64);
  const Round a = round(runs, 6, /*other=*/-1, /*bad=*/3);
  for (int r = 0; r < 6; ++r) {
    if (r == 3) {
      EXPECT_EQ(a.errors[r], "negative item -1");
      EXPECT_TRUE(a.results[r].empty());
      continue;
    }
    EXPECT_EQ(a.errors[r], "") << r;
    EXPECT_EQ(a.results[r], (std::vector<int>{20 * r, 20 * r + 2, 20 * r + 4})) << r;
  }
  // Request 0; the batch of 1-5, which fails; then each of 1-5 alone.
  EXPECT_EQ(runs.runs(), 7);
}

TEST(MergedRuns, ABatchHoldsAtMostMaxItems) {
  MergedRuns<int, int> runs(7);  // two requests of three items fit, a third does not
  const Round a = round(runs, 5, -1, -1);
  for (int r = 0; r < 5; ++r) EXPECT_EQ(a.results[r], (std::vector<int>{20 * r, 20 * r + 2, 20 * r + 4})) << r;
  for (const std::vector<int>& b : a.batches) EXPECT_LE(b.size(), 7u);
  EXPECT_EQ(runs.runs(), 3);  // 0; two of 1-4; the other two
}

// A run that doubles each item and records its batch.
struct Recorder {
  std::mutex mutex;
  std::vector<std::vector<int>> batches;
  MergedRuns<int, int>::Run run() {
    return [this](const std::vector<int>& items) {
      std::lock_guard<std::mutex> lock(mutex);
      batches.push_back(items);
      std::vector<int> doubled;
      for (int x : items) doubled.push_back(2 * x);
      return doubled;
    };
  }
};

// Request 0 ({1, 2}) on an idle model; once it waits, request 1 ({3, 4}).
// Returns their results and the seconds until both were back.
double two_requests(MergedRuns<int, int>& runs, Recorder& recorder, std::vector<int> results[2]) {
  const MergedRuns<int, int>::Run run = recorder.run();
  const auto start = std::chrono::steady_clock::now();
  std::thread first([&] { results[0] = runs.submit("same", {1, 2}, run); });
  while (runs.waiting() == 0 && runs.runs() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread second([&] { results[1] = runs.submit("same", {3, 4}, run); });
  first.join(), second.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(MergedRuns, WithAWaitARequestOnAnIdleModelWaitsForOthers) {
  // A wait far longer than the test: request 1 arrives within it and the two
  // fill the batch (4 items), which then starts without waiting any longer.
  MergedRuns<int, int> runs(4, std::chrono::milliseconds(60000));
  Recorder recorder;
  std::vector<int> results[2];
  const double seconds = two_requests(runs, recorder, results);
  EXPECT_EQ(results[0], (std::vector<int>{2, 4}));
  EXPECT_EQ(results[1], (std::vector<int>{6, 8}));
  EXPECT_EQ(runs.runs(), 1);
  EXPECT_EQ(recorder.batches, (std::vector<std::vector<int>>{{1, 2, 3, 4}}));
  EXPECT_LT(seconds, 30.0);  // a full batch does not sit out the wait
}

TEST(MergedRuns, TheWaitEndsWhenTheFirstRequestHasWaitedItsTime) {
  // max_items 8: nothing fills the batch, so each batch starts when its first
  // request has waited 200 ms. Request 0 runs alone if request 1 came too late
  // (a stalled thread), else with it; either way each gets its own results.
  MergedRuns<int, int> runs(8, std::chrono::milliseconds(200));
  Recorder recorder;
  std::vector<int> results[2];
  const double seconds = two_requests(runs, recorder, results);
  EXPECT_EQ(results[0], (std::vector<int>{2, 4}));
  EXPECT_EQ(results[1], (std::vector<int>{6, 8}));
  EXPECT_GE(seconds, 0.2);
  EXPECT_LE(runs.runs(), 2);
}

}  // namespace
}  // namespace qkv::serve
