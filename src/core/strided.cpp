// Copying between tensors of any layout: the tensors' shapes and strides
// handed to the kernel table's strided_copy (src/kernels).
#include "src/core/strided.h"

#include "src/kernels/kernels.h"

namespace qkv {

void strided_copy(const TensorImpl& src, TensorImpl& dst) {
  QKV_CHECK((int64_t)src.shape.size() <= kMaxCopyRank, "copy: tensors of more than ", kMaxCopyRank,
            " dimensions are not supported (", shape_str(src.shape), ")");
  if (src.storage->device == Device::Meta) detail::fail_no_values(src.shape);
  if (dst.storage->device == Device::Meta) return;
  const size_t es = dtype_size(src.dtype);
  StridedCopy c;
  c.rank = (int64_t)src.shape.size();
  c.shape = src.shape.data();
  c.src_strides = src.strides.data();
  c.dst_strides = dst.strides.data();
  c.elem_size = es;
  c.src = static_cast<const char*>(src.storage->data) + src.offset * (int64_t)es;
  c.dst = static_cast<char*>(dst.storage->data) + dst.offset * (int64_t)es;
  kernels_for(Device::Cpu).strided_copy(c);
}

}  // namespace qkv
