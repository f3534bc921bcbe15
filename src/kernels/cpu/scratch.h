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
  // Empty until take(): for scratch a call needs only sometimes (the allocator
  // takes a lock; std::optional would instantiate std:: code outside the
  // variant's namespace, which check_kernel_variants refuses).
  Scratch() = default;
  explicit Scratch(int64_t floats) { take(floats); }
  ~Scratch() {
    if (data_) free_bytes(data_, bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() const { return data_; }
  // The floats, taken once (an empty Scratch only).
  float* take(int64_t floats) {
    bytes_ = sizeof(float) * std::max<int64_t>(floats, 1);
    data_ = static_cast<float*>(allocate_bytes(bytes_));
    return data_;
  }

private:
  size_t bytes_ = 0;
  float* data_ = nullptr;
};

}  // namespace qkv::cpu::QKV_CPU_NS
