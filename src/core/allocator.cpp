#include "qkv/allocator.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace qkv {
namespace {

constexpr size_t kAlign = 64;
// Blocks above this are not cached once the cache already holds this much.
constexpr uint64_t kMaxCachedBytes = 4ull << 30;

// 90% of physical memory, or of the cgroup v2 limit when that is lower.
uint64_t default_memory_limit() {
  uint64_t total = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  uint64_t limit = 0;
  if (cgroup >> limit && limit > 0 && limit < total) total = limit;  // "max" (no limit) fails to parse
  return total / 10 * 9;
}

struct Allocator {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_lists;  // rounded size -> blocks
  AllocatorStats stats;
  uint64_t limit = default_memory_limit();
};

// Frees every cached block; the caller holds the mutex.
void drop_cache(Allocator& a) {
  for (auto& [size, blocks] : a.free_lists) {
    for (void* p : blocks) std::free(p);
    blocks.clear();
  }
  a.stats.bytes_cached = 0;
}

Allocator& allocator() {
  static Allocator* a = new Allocator();  // never destroyed: storages may outlive statics
  return *a;
}

size_t round_size(size_t n) { return n == 0 ? kAlign : (n + kAlign - 1) / kAlign * kAlign; }

#ifdef QKV_NO_ALLOC_CACHE
constexpr bool kCache = false;
#else
constexpr bool kCache = true;
#endif

}  // namespace

void* allocate_bytes(size_t nbytes) {
  size_t n = round_size(nbytes);
  Allocator& a = allocator();
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    if (n > a.limit || a.stats.bytes_in_use > a.limit - n) throw std::bad_alloc();
    a.stats.bytes_in_use += n;
    if (a.stats.bytes_in_use > a.stats.peak_bytes_in_use) a.stats.peak_bytes_in_use = a.stats.bytes_in_use;
    auto it = a.free_lists.find(n);
    if (it != a.free_lists.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      a.stats.cache_hits++;
      a.stats.bytes_cached -= n;
      return p;
    }
    a.stats.system_allocs++;
    if (a.stats.bytes_cached > a.limit - a.stats.bytes_in_use) drop_cache(a);  // the cache yields to live tensors
  }
  void* p = std::aligned_alloc(kAlign, n);
  if (!p) throw std::bad_alloc();
  return p;
}

void free_bytes(void* ptr, size_t nbytes) {
  if (!ptr) return;
  size_t n = round_size(nbytes);
  Allocator& a = allocator();
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    a.stats.bytes_in_use -= n;
    if (kCache && a.stats.bytes_cached + n <= kMaxCachedBytes) {
      a.free_lists[n].push_back(ptr);
      a.stats.bytes_cached += n;
      return;
    }
  }
  std::free(ptr);
}

AllocatorStats allocator_stats() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mutex);
  return a.stats;
}

void reset_peak_bytes() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.stats.peak_bytes_in_use = a.stats.bytes_in_use;
}

void release_cached_memory() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mutex);
  drop_cache(a);
}

std::string format_bytes(uint64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)bytes);
  else std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

uint64_t memory_limit() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mutex);
  return a.limit;
}

void set_memory_limit(uint64_t bytes) {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.limit = bytes > 0 ? bytes : default_memory_limit();
}

}  // namespace qkv
