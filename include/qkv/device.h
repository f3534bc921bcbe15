// qkv/device.h — where a tensor's values live.
//
//   Cpu   host memory from the caching allocator (qkv/allocator.h); the only
//         device ops run on today.
//   Meta  shapes, dtypes and sizes with no memory and no values: a model built
//         inside a DefaultDeviceGuard(Device::Meta) costs nothing, so its size
//         can be known before a byte of it is allocated (qkv::model_size).
//
// A CUDA device would be a third value with its own allocator and its own
// kernel table (src/kernels/kernels.h).
#pragma once

#include <cstdint>

namespace qkv {

enum class Device : uint8_t { Cpu, Meta };

const char* device_name(Device d);  // "cpu", "meta"

// The device new tensors are made on (Tensor::empty and every factory), per
// thread: Cpu unless a DefaultDeviceGuard says otherwise.
Device default_device();
class DefaultDeviceGuard {
public:
  explicit DefaultDeviceGuard(Device d);
  ~DefaultDeviceGuard();
  DefaultDeviceGuard(const DefaultDeviceGuard&) = delete;
  DefaultDeviceGuard& operator=(const DefaultDeviceGuard&) = delete;
private:
  Device previous_;
};

}  // namespace qkv
