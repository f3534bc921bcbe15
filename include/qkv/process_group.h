// qkv/process_group.h — the processes that train one model together
// (data parallelism, docs/distributed.md).
//
// Every process holds the whole model and takes its shard of each global
// batch; after backward the gradients are summed across processes, so every
// process applies the same optimizer step to the same weights. The library
// sees only this interface: qkv/mpi.h implements it with MPI for the qkv
// program, and a run without one is a single process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace qkv {

class ProcessGroup {
public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;  // 0 .. size() - 1; rank 0 writes files and prints
  virtual int size() const = 0;

  // Sums `data` over every process, in place, and waits for the result.
  virtual void sum(float* data, int64_t n) = 0;
  virtual void sum(double* data, int64_t n) = 0;
  // Starts summing `data` in place and returns at once; poll() lets started
  // sums progress, wait_all() waits for every one. Every process starts the
  // same sums in the same order.
  virtual void start_sum(float* data, int64_t n) = 0;
  virtual void poll() = 0;
  virtual void wait_all() = 0;
  // Copies `bytes` bytes at `data` from process `root` to every other one.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
};

// Which part of a global batch of `count` items is this process's: a
// contiguous range, sizes differing by at most one. Without a group: all.
struct Shard {
  int index = 0, count = 1;
  std::pair<int64_t, int64_t> range(int64_t items) const {
    return {items * index / count, items * (index + 1) / count};
  }
};

inline Shard shard_of(const ProcessGroup* group) {
  return group ? Shard{group->rank(), group->size()} : Shard{};
}

}  // namespace qkv
