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
#include <string>

namespace qkv {

struct AllocatorStats {
  uint64_t system_allocs = 0;    // blocks obtained from the system
  uint64_t cache_hits = 0;       // requests served from the free lists
  uint64_t bytes_in_use = 0;     // held by live storages
  uint64_t peak_bytes_in_use = 0;
  uint64_t bytes_cached = 0;     // free, kept for reuse
};

// 64-byte aligned; never null. A request that would take the bytes in use
// past memory_limit() throws std::bad_alloc, which the qkv program reports as
// one "out of memory" line, instead of letting the kernel's OOM killer end
// the process half-way through building a model too large for the machine.
void* allocate_bytes(size_t nbytes);
void free_bytes(void* ptr, size_t nbytes);

// The most bytes live storages may hold: by default 90% of the machine's
// memory, or of its cgroup's limit (a container) where that is lower.
uint64_t memory_limit();
// Sets it (a server capping what it may take; a test). 0 restores the default.
void set_memory_limit(uint64_t bytes);

// For messages: "512 B", "1.5 KiB", "900 MiB", "21.6 GiB" (three significant digits).
std::string format_bytes(uint64_t bytes);

AllocatorStats allocator_stats();
void reset_peak_bytes();
// Returns every cached block to the system.
void release_cached_memory();

}  // namespace qkv
