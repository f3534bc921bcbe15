// safetensors bytes: the header (JSON, names, shapes, offsets) and the data.
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = qkv::fuzz::as_string(data, size);
  qkv::fuzz::expect_clean([&] {
    qkv::SafetensorsFile f = qkv::parse_safetensors(bytes, "fuzz.safetensors");
    // What parses must write back and parse again to the same tensors.
    qkv::SafetensorsFile back = qkv::parse_safetensors(qkv::serialize_safetensors(f.tensors, f.metadata), "again");
    if (back.tensors.size() != f.tensors.size() || back.metadata != f.metadata) std::abort();
  });
  return 0;
}
