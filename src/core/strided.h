// Internal: copying between tensors of any layout.
#pragma once

#include "qkv/tensor.h"

namespace qkv {

// Copies src into dst element by element; same shape and dtype.
void strided_copy(const TensorImpl& src, TensorImpl& dst);

}  // namespace qkv
