// Internal to qkv serve: requests for a model that runs one batch at a time
// (translation, images), merged into shared batches.
//
// While a batch runs, the requests that arrive wait. When it ends, the first
// waiting request and every other waiting one with the same key (for
// translation: its beam width and length limit, which a batch shares) run as
// one batch of up to max_items items; whichever waiting request finds the
// model free leads that batch, on its own thread. With a wait (qkv serve's
// --batch-wait-ms), a batch starts only once its first request has waited
// that long, or once requests of its key fill max_items, so that requests
// arriving a moment apart on an idle model still share a batch: a little
// latency for fewer, fuller runs (time spent waiting through a run counts).
// Each request gets its own results back, in its own order. A merged batch
// that fails is run again request by request, so a bad input fails only the
// request that sent it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace qkv::serve {

template <class Item, class Result>
class MergedRuns {
public:
  // Must return one result per item, in order.
  using Run = std::function<std::vector<Result>(const std::vector<Item>& items)>;

  explicit MergedRuns(size_t max_items, std::chrono::milliseconds wait = std::chrono::milliseconds(0))
      : max_items_(max_items), wait_(wait) {}

  // Blocks until `items` have run, alone or with other requests' (through
  // their `run`, which for an equal key does the same); rethrows what running
  // them alone threw.
  std::vector<Result> submit(const std::string& key, std::vector<Item> items, const Run& run) {
    Pending me{key, std::move(items), &run, std::chrono::steady_clock::now()};
    std::unique_lock<std::mutex> lock(mutex_);
    waiting_.push_back(&me);
    arrived_.notify_all();
    while (!me.done) {
      if (running_) {
        changed_.wait(lock);
        continue;
      }
      running_ = true;
      if (wait_.count() > 0)
        arrived_.wait_until(lock, waiting_.front()->arrived + wait_,
                            [this] { return front_key_items() >= max_items_; });
      std::vector<Pending*> batch = take_batch();
      lock.unlock();
      execute(batch);
      lock.lock();
      for (Pending* p : batch) p->done = true;
      running_ = false;
      changed_.notify_all();
    }
    if (me.error) std::rethrow_exception(me.error);
    return std::move(me.results);
  }

  // Calls of a `run` so far: batches, and the requests a failed batch ran alone.
  int64_t runs() const { return runs_; }
  // Requests waiting for the model.
  size_t waiting() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return waiting_.size();
  }

private:
  struct Pending {
    std::string key;
    std::vector<Item> items;
    const Run* run = nullptr;
    std::chrono::steady_clock::time_point arrived;
    std::vector<Result> results;
    std::exception_ptr error;
    bool done = false;
  };

  // Items waiting with the first waiting request's key; under the mutex.
  size_t front_key_items() const {
    size_t n = 0;
    for (const Pending* p : waiting_)
      if (p->key == waiting_.front()->key) n += p->items.size();
    return n;
  }

  // The first waiting request and those after it with its key, while they
  // fit in max_items (the first always goes); under the mutex.
  std::vector<Pending*> take_batch() {
    std::vector<Pending*> batch;
    size_t n = 0;
    const std::string key = waiting_.front()->key;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      Pending* p = *it;
      if (p->key == key && (batch.empty() || n + p->items.size() <= max_items_)) {
        batch.push_back(p);
        n += p->items.size();
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    return batch;
  }

  void run_alone(Pending* p) {
    ++runs_;
    try {
      p->results = (*p->run)(p->items);
    } catch (...) {
      p->error = std::current_exception();
    }
  }

  void execute(const std::vector<Pending*>& batch) {
    if (batch.size() == 1) return run_alone(batch[0]);
    std::vector<Item> all;
    for (Pending* p : batch) all.insert(all.end(), p->items.begin(), p->items.end());
    std::vector<Result> results;
    bool merged = true;
    ++runs_;
    try {
      results = (*batch[0]->run)(all);
    } catch (...) {
      merged = false;
    }
    if (!merged || results.size() != all.size()) {
      for (Pending* p : batch) run_alone(p);  // so that an error lands on the request it belongs to
      return;
    }
    size_t at = 0;
    for (Pending* p : batch) {
      p->results.assign(std::make_move_iterator(results.begin() + (ptrdiff_t)at),
                        std::make_move_iterator(results.begin() + (ptrdiff_t)(at + p->items.size())));
      at += p->items.size();
    }
  }

  const size_t max_items_;
  const std::chrono::milliseconds wait_;
  mutable std::mutex mutex_;
  std::condition_variable changed_, arrived_;
  std::deque<Pending*> waiting_;
  bool running_ = false;
  std::atomic<int64_t> runs_{0};
};

}  // namespace qkv::serve
