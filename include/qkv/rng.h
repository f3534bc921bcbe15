// qkv/rng.h — a seeded, counter-based random number generator.
//
// Numbers are a pure function of (seed, counter): value i of a stream is
// splitmix64(seed ^ stream_key, i). So a kernel can draw element i's number
// on any thread, in any order, and the result does not depend on the number
// of threads. `Rng` hands out consecutive counter ranges.
#pragma once

#include <cstdint>

namespace qkv {

// The 64-bit finalizer of splitmix64 (Steele, Lea, Flood 2014).
inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) from the top 24 bits.
inline float uniform_from_bits(uint64_t bits) { return (float)(bits >> 40) * (1.0f / 16777216.0f); }

class Rng {
public:
  explicit Rng(uint64_t seed = 0) : seed_(mix64(seed)) {}

  // Reserves `n` numbers; returns the counter of the first.
  uint64_t reserve(uint64_t n) {
    uint64_t first = counter_;
    counter_ += n;
    return first;
  }
  // Number `i` of this generator's stream (thread-safe, pure).
  uint64_t bits_at(uint64_t i) const { return mix64(seed_ ^ mix64(i)); }
  float uniform_at(uint64_t i) const { return uniform_from_bits(bits_at(i)); }
  float normal_at(uint64_t i) const;  // Box-Muller from numbers 2i, 2i+1 of a sub-stream

  uint64_t next_bits() { return bits_at(reserve(1)); }
  float next_uniform() { return uniform_at(reserve(1)); }
  float next_normal() { return normal_at(reserve(1)); }
  // Uniform integer in [0, n).
  uint64_t next_below(uint64_t n) { return next_bits() % n; }

  // The whole state, for checkpoints (--resume restores it exactly).
  uint64_t seed_state() const { return seed_; }
  uint64_t counter() const { return counter_; }
  void restore(uint64_t seed_state, uint64_t counter) {
    seed_ = seed_state;
    counter_ = counter;
  }

private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace qkv
