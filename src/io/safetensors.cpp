// safetensors reader (validating) and writer.
#include <algorithm>
#include <bit>
#include <cstring>
#include <sys/stat.h>
#include <nlohmann/json.hpp>
#include <set>

#include "qkv/io.h"
#include "qkv/utf8.h"
#include "src/core/json.h"

namespace qkv {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so is this code");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

using Entry = SafetensorsEntry;

struct Header {
  std::vector<Entry> entries;  // in the order of their data
  Metadata metadata;
};

// The parser keeps the last of two equal keys without a word; this pass over
// the events finds them, in time linear in the header (nlohmann's callback
// parser, used here before, rescans an object each time a member ends).
struct DuplicateKeys : nlohmann::json_sax<nlohmann::json> {
  std::vector<std::set<std::string>> open;  // the keys of each object being read
  std::string duplicate;

  bool key(string_t& k) override {
    if (!open.back().insert(k).second) duplicate = k;
    return duplicate.empty();
  }
  bool start_object(std::size_t) override {
    open.emplace_back();
    return true;
  }
  bool end_object() override {
    open.pop_back();
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

// The first key that appears twice in one object, or "" (also for text that
// is not JSON: the parse after this one says what is wrong with it).
std::string first_duplicate_key(const std::string& header) {
  DuplicateKeys keys;
  nlohmann::json::sax_parse(header, &keys, nlohmann::json::input_format_t::json, false);
  return keys.duplicate;
}

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

std::map<std::string, Tensor> SafetensorsFile::as_map() const { return {tensors.begin(), tensors.end()}; }

namespace {

// The header's entries, checked against `data_size`, the bytes after it:
// every check of load_safetensors but the reads themselves.
Header parse_header(const std::string& header, uint64_t data_size, const std::string& source) {
  auto bad = [&](const auto&... what) { fail("safetensors: ", source, ": ", what...); };
  if (size_t at = invalid_utf8_offset(header); at != std::string::npos)
    bad("header is not valid UTF-8 (bad byte at header offset ", at, ")");
  std::string duplicate = first_duplicate_key(header);
  if (!duplicate.empty()) bad("key '", duplicate, "' appears twice in the header");
  if (json_text_nested_deeper_than(header, kMaxFileJsonDepth))
    bad("header nested deeper than ", kMaxFileJsonDepth, " levels");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    bad("header is not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) bad("header is not a JSON object");

  Header out;
  std::vector<Entry>& entries = out.entries;
  for (auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) bad("__metadata__ is not an object of strings");
      for (auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) bad("__metadata__ value for '", mk, "' is not a string");
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    if (!value.is_object()) bad("tensor '", key, "': entry is not an object");
    for (auto& [field, v] : value.items())
      if (field != "dtype" && field != "shape" && field != "data_offsets") bad("tensor '", key, "': unknown field '", field, "'");
    if (!value.contains("dtype") || !value["dtype"].is_string()) bad("tensor '", key, "': missing dtype string");
    if (!value.contains("shape") || !value["shape"].is_array()) bad("tensor '", key, "': missing shape array");
    if (!value.contains("data_offsets") || !value["data_offsets"].is_array() || value["data_offsets"].size() != 2)
      bad("tensor '", key, "': data_offsets must be an array of two integers");
    Entry e;
    e.name = key;
    std::string dt = value["dtype"].get<std::string>();
    if (!parse_dtype(dt, &e.dtype)) bad("tensor '", key, "': unsupported dtype '", dt, "' (qkv reads F32, F16, BF16, I64, I32, I8, U8)");
    // The sizes other than 0 must multiply within int64 too: a tensor with no
    // elements still has strides, and [0, 2^62, 4] would overflow them.
    uint64_t numel = 1, nonzero = 1;
    for (auto& d : value["shape"]) {
      if (!d.is_number_integer()) bad("tensor '", key, "': shape ", value["shape"].dump(), " holds a non-integer");
      if (d.is_number_unsigned() ? false : d.get<int64_t>() < 0)
        bad("tensor '", key, "': shape ", value["shape"].dump(), " has a negative size");
      uint64_t dim = d.get<uint64_t>();
      if (dim > (uint64_t)INT64_MAX || (dim != 0 && __builtin_mul_overflow(nonzero, dim, &nonzero)) ||
          nonzero > (uint64_t)INT64_MAX)
        bad("tensor '", key, "': shape ", value["shape"].dump(), " overflows");
      numel *= dim;  // at most `nonzero`, or 0
      e.shape.push_back((int64_t)dim);
    }
    uint64_t nbytes;
    if (numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, (uint64_t)dtype_size(e.dtype), &nbytes))
      bad("tensor '", key, "': shape ", value["shape"].dump(), " overflows");
    for (auto& o : value["data_offsets"])
      if (!o.is_number_integer() || (!o.is_number_unsigned() && o.get<int64_t>() < 0))
        bad("tensor '", key, "': data_offsets ", value["data_offsets"].dump(), " are not non-negative integers");
    e.begin = value["data_offsets"][0].get<uint64_t>();
    e.end = value["data_offsets"][1].get<uint64_t>();
    if (e.begin > e.end) bad("tensor '", key, "': data_offsets ", value["data_offsets"].dump(), " end before they begin");
    if (e.end > data_size)
      bad("tensor '", key, "': data_offsets ", value["data_offsets"].dump(), " run past the end of the data (",
          data_size, " bytes)");
    if (e.end - e.begin != nbytes)
      bad("tensor '", key, "': data_offsets ", value["data_offsets"].dump(), " hold ", e.end - e.begin,
          " bytes, shape ", shape_str(e.shape), " x ", dt, " needs ", nbytes);
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const Entry& e : entries) {
    if (e.begin < at) bad("tensor '", e.name, "': data [", e.begin, ",", e.end, ") overlaps the tensor before it");
    if (e.begin > at) bad("tensor '", e.name, "': gap of ", e.begin - at, " bytes before its data at ", e.begin);
    at = e.end;
  }
  if (at != data_size) bad(data_size - at, " trailing bytes after the last tensor's data");
  return out;
}

// The header text of a file of `size` bytes, which `read(offset, n, to)` reads.
template <class Read>
std::string read_header(uint64_t size, const std::string& source, Read read) {
  auto bad = [&](const auto&... what) { fail("safetensors: ", source, ": ", what...); };
  if (size < 8) bad("file is ", size, " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  read(0, 8, reinterpret_cast<char*>(&n));
  if (n > kMaxHeaderBytes) bad("header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  if (n > size - 8) bad("header length ", n, " runs past the end of the file (", size, " bytes)");
  std::string header(n, '\0');
  read(8, n, header.data());
  return header;
}

}  // namespace

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source) {
  auto read = [&](uint64_t at, uint64_t n, char* to) { std::memcpy(to, bytes.data() + at, n); };
  const std::string header = read_header(bytes.size(), source, read);
  const uint64_t data_at = 8 + header.size();
  Header h = parse_header(header, bytes.size() - data_at, source);
  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) read(data_at + e.begin, e.end - e.begin, static_cast<char*>(t.raw_data()));
    out.tensors.emplace_back(e.name, t);
  }
  return out;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  bool regular = true;
  try {
    refuse_devices_and_folders(path);
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      bytes_ = read_file(path);  // a pipe: read once, to its end
      regular = false;
    }
  } catch (const Error& e) {
    fail("safetensors: ", e.what());
  }
  if (regular) {
    file_.open(path, std::ios::binary);
    QKV_CHECK(file_.good(), "safetensors: ", path, ": cannot open: ", std::strerror(errno));
    file_.seekg(0, std::ios::end);
    size_ = (uint64_t)file_.tellg();
  } else {
    size_ = bytes_.size();
  }
  const std::string header =
      read_header(size_, path, [this](uint64_t at, uint64_t n, char* to) { read_at(at, n, to); });
  data_at_ = 8 + header.size();
  Header h = parse_header(header, size_ - data_at_, path);
  entries_ = std::move(h.entries);
  metadata_ = std::move(h.metadata);
}

void SafetensorsReader::read_at(uint64_t at, uint64_t n, char* to) {
  if (!file_.is_open()) {
    std::memcpy(to, bytes_.data() + at, n);
    return;
  }
  file_.clear();
  file_.seekg((std::streamoff)at);
  file_.read(to, (std::streamsize)n);
  QKV_CHECK(file_.good() && (uint64_t)file_.gcount() == n, "safetensors: ", path_, ": reading ", n, " bytes at ", at,
            " failed (did the file change while it was read?)");
}

Tensor SafetensorsReader::read(size_t i) {
  QKV_CHECK(i < entries_.size(), "safetensors: ", path_, ": no tensor ", i, " (the file has ", entries_.size(), ")");
  const Entry& e = entries_[i];
  Tensor t = Tensor::empty(e.shape, e.dtype);
  if (e.end > e.begin) read_at(data_at_ + e.begin, e.end - e.begin, static_cast<char*>(t.raw_data()));
  return t;
}

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  SafetensorsFile out;
  out.metadata = reader.metadata();
  for (size_t i = 0; i < reader.entries().size(); ++i)
    out.tensors.emplace_back(reader.entries()[i].name, reader.read(i));
  return out;
}

namespace {

// The 8-byte length and the header of `tensors` as they are written
// (contiguous, one after another), every name and metadata entry checked.
std::string safetensors_header(const std::vector<std::pair<std::string, Tensor>>& tensors, const Metadata& metadata) {
  // The header is written as text, entry by entry: an ordered_json object
  // finds each new key by a linear search, quadratic in the tensor count.
  for (auto& [key, value] : metadata)
    QKV_CHECK(invalid_utf8_offset(key) == std::string::npos && invalid_utf8_offset(value) == std::string::npos,
              "safetensors: metadata '", replace_invalid_utf8(key), "' is not valid UTF-8");
  std::string h = "{";
  if (!metadata.empty()) h += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  std::set<std::string> names;
  uint64_t at = 0;
  for (auto& [name, t] : tensors) {
    QKV_CHECK(name != "__metadata__", "safetensors: '__metadata__' cannot name a tensor");
    QKV_CHECK(names.insert(name).second, "safetensors: tensor name '", name, "' given twice");
    QKV_CHECK(invalid_utf8_offset(name) == std::string::npos, "safetensors: tensor name '", replace_invalid_utf8(name),
              "' is not valid UTF-8");
    const uint64_t nbytes = (uint64_t)t.numel() * dtype_size(t.dtype());
    if (h.size() > 1) h += ',';
    h += nlohmann::json(name).dump() + ":" +
         nlohmann::ordered_json{{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {at, at + nbytes}}}
             .dump();
    at += nbytes;
  }
  h += '}';
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // align the data to 8 bytes, as the Python writer does
  std::string out(8, '\0');
  const uint64_t hn = h.size();
  std::memcpy(out.data(), &hn, 8);
  return out + h;
}

// Each tensor's bytes in order, one contiguous tensor at a time.
void write_tensor_data(const std::vector<std::pair<std::string, Tensor>>& tensors, const WriteBytes& write) {
  for (auto& [name, t] : tensors) {
    const Tensor c = t.contiguous();
    write(static_cast<const char*>(c.raw_data()), (size_t)c.numel() * dtype_size(c.dtype()));
  }
}

}  // namespace

std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors, const Metadata& metadata) {
  std::string out = safetensors_header(tensors, metadata);
  size_t total = out.size();
  for (auto& [name, t] : tensors) total += (size_t)t.numel() * dtype_size(t.dtype());
  out.reserve(total);
  write_tensor_data(tensors, [&](const char* data, size_t n) { out.append(data, n); });
  return out;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const Metadata& metadata) {
  const std::string header = safetensors_header(tensors, metadata);  // its errors before any file is made
  write_file_atomic(path, [&](const WriteBytes& write) {
    write(header.data(), header.size());
    write_tensor_data(tensors, write);
  });
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors, const Metadata& metadata) {
  save_safetensors(path, std::vector<std::pair<std::string, Tensor>>(tensors.begin(), tensors.end()), metadata);
}

}  // namespace qkv
