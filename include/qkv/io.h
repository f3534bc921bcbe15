// qkv/io.h — files: safetensors checkpoints and atomic writes.
//
// safetensors layout: 8-byte little-endian header length N, N bytes of UTF-8
// JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// "__metadata__": {"key": "value"}}, then the raw little-endian tensor bytes,
// packed without gaps in offset order.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

using Metadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in the order of their data
  Metadata metadata;
  const Tensor* find(const std::string& name) const;
  std::map<std::string, Tensor> as_map() const;
};

// Reads and validates a file. Any problem is a qkv::Error naming the file:
// "safetensors: model.safetensors: tensor 'w' data_offsets [0,12] hold 12 bytes, shape [2,2] x F32 needs 16".
SafetensorsFile load_safetensors(const std::string& path);
// The same checks on bytes already in memory; `source` names them in errors.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source);

// Writes atomically: a temporary file in the same folder, flushed and renamed
// into place. Tensors of any layout are written contiguous.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const Metadata& metadata = {});
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const Metadata& metadata = {});
std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const Metadata& metadata);

// An attention matrix as an SVG picture, in the manner of the alignment
// figures of Bahdanau et al.: one row per `rows` label (e.g. target tokens),
// one column per `cols` label (source tokens), cell darkness = weight in [0, 1].
// Labels are UTF-8 text (CJK fonts are named first in the font list).
std::string attention_svg(const std::vector<std::string>& rows, const std::vector<std::string>& cols,
                          const std::vector<float>& weights, const std::string& title);

// Replaces `path` with `bytes` atomically (temporary file, fsync, rename).
void write_file_atomic(const std::string& path, const std::string& bytes);
// A folder or a device (/dev/zero, a terminal) given as a file is a qkv::Error
// naming it: /dev/zero would be read until memory runs out. Pipes pass; a
// missing path is left to the open that follows.
void refuse_devices_and_folders(const std::string& path);
// The whole file; a missing or unreadable file, a folder or a device (/dev/zero)
// is a qkv::Error naming it. Pipes are read to their end.
std::string read_file(const std::string& path);

}  // namespace qkv
