// qkv/io.h — files: safetensors checkpoints and atomic writes.
//
// safetensors layout: 8-byte little-endian header length N, N bytes of UTF-8
// JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// "__metadata__": {"key": "value"}}, then the raw little-endian tensor bytes,
// packed without gaps in offset order.
#pragma once

#include <fstream>
#include <functional>
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
// The file's bytes go straight into the tensors (SafetensorsReader): the
// file is never held twice.
SafetensorsFile load_safetensors(const std::string& path);

// One tensor of a file's header: its data_offsets count from the end of the header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

// A safetensors file read one tensor at a time: opening it reads and checks
// the header (every check of load_safetensors), and read(i) reads the i-th
// tensor's bytes into memory of its own. A model loads through it holding one
// tensor of the file at a time instead of the whole file. A pipe is read into
// memory once, to its end.
class SafetensorsReader {
public:
  explicit SafetensorsReader(const std::string& path);
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in the order of their data
  const Metadata& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  Tensor read(size_t i);

private:
  void read_at(uint64_t at, uint64_t n, char* to);
  std::string path_;
  std::ifstream file_;
  std::string bytes_;  // the whole of a file that is not a regular one
  uint64_t size_ = 0, data_at_ = 0;
  std::vector<SafetensorsEntry> entries_;
  Metadata metadata_;
};
// The same checks on bytes already in memory; `source` names them in errors.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source);

// Writes atomically: a temporary file in the same folder, flushed and renamed
// into place. Tensors of any layout are written contiguous, one at a time:
// the file is never assembled in memory.
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
// The same with the bytes made as they are written: `produce` calls its
// argument with each piece in order. If it throws, the temporary file is
// removed and `path` is left as it was.
using WriteBytes = std::function<void(const char* data, size_t n)>;
void write_file_atomic(const std::string& path, const std::function<void(const WriteBytes& write)>& produce);
// A folder or a device (/dev/zero, a terminal) given as a file is a qkv::Error
// naming it: /dev/zero would be read until memory runs out. Pipes pass; a
// missing path is left to the open that follows.
void refuse_devices_and_folders(const std::string& path);
// The whole file; a missing or unreadable file, a folder or a device (/dev/zero)
// is a qkv::Error naming it. Pipes are read to their end.
std::string read_file(const std::string& path);

}  // namespace qkv
