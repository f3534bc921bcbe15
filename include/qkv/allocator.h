// qkv/allocator.h — the caching allocator behind every Storage.
//
// Freed blocks go back to a free list keyed by their (rounded) size and are
// handed out again to the next request of that size, so a warm training step
// -- the same shapes as the step before -- asks the system for no memory at
// all. The counters below make that measurable.
//
// Under AddressSanitizer builds (QKV_NO_ALLOC_CACHE) every block goes straight
// back to the system so that use-after-free is still caught.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qkv {

struct AllocatorStats {
  uint64_t system_allocs = 0;    // blocks obtained from the system
  uint64_t cache_hits = 0;       // requests served from the free lists
  uint64_t bytes_in_use = 0;     // held by live storages
  uint64_t peak_bytes_in_use = 0;
  uint64_t bytes_cached = 0;     // free, kept for reuse
};

void* allocate_bytes(size_t nbytes);  // 64-byte aligned; never null
void free_bytes(void* ptr, size_t nbytes);

AllocatorStats allocator_stats();
void reset_peak_bytes();
// Returns every cached block to the system.
void release_cached_memory();

}  // namespace qkv
