// Internal to the CPU kernel variants: a kernel's scratch floats, from the
// caching allocator (a warm call asks the system for no memory). In the
// variant's namespace, like every inline helper of a variant (vec_math.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "qkv/allocator.h"

namespace qkv::cpu::QKV_CPU_NS {

class Scratch {
public:
  explicit Scratch(int64_t floats) : bytes_(sizeof(float) * std::max<int64_t>(floats, 1)) {
    data_ = static_cast<float*>(allocate_bytes(bytes_));
  }
  ~Scratch() { free_bytes(data_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() const { return data_; }

private:
  size_t bytes_;
  float* data_;
};

}  // namespace qkv::cpu::QKV_CPU_NS
