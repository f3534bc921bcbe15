// safetensors reader (validating) and writer.
#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "qkv/io.h"
#include "qkv/utf8.h"

namespace qkv {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so is this code");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
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

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source) {
  auto bad = [&](const auto&... what) { fail("safetensors: ", source, ": ", what...); };
  if (bytes.size() < 8) bad("file is ", bytes.size(), " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeaderBytes) bad("header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  if (n > bytes.size() - 8) bad("header length ", n, " runs past the end of the file (", bytes.size(), " bytes)");
  std::string header = bytes.substr(8, n);
  if (size_t at = invalid_utf8_offset(header); at != std::string::npos)
    bad("header is not valid UTF-8 (bad byte at header offset ", at, ")");

  std::string duplicate = first_duplicate_key(header);
  if (!duplicate.empty()) bad("key '", duplicate, "' appears twice in the header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    bad("header is not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) bad("header is not a JSON object");

  SafetensorsFile out;
  std::vector<Entry> entries;
  const uint64_t data_size = bytes.size() - 8 - n;
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
  const char* data = bytes.data() + 8 + n;
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(t.raw_data(), data + e.begin, e.end - e.begin);
    out.tensors.emplace_back(e.name, t);
  }
  return out;
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::string bytes;
  try {
    bytes = read_file(path);
  } catch (const Error& e) {
    fail("safetensors: ", e.what());
  }
  return parse_safetensors(bytes, path);
}

std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors, const Metadata& metadata) {
  // The header is written as text, entry by entry: an ordered_json object
  // finds each new key by a linear search, quadratic in the tensor count.
  for (auto& [key, value] : metadata)
    QKV_CHECK(invalid_utf8_offset(key) == std::string::npos && invalid_utf8_offset(value) == std::string::npos,
              "safetensors: metadata '", replace_invalid_utf8(key), "' is not valid UTF-8");
  std::string h = "{";
  if (!metadata.empty()) h += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  std::set<std::string> names;
  uint64_t at = 0;
  std::vector<Tensor> contiguous;
  for (auto& [name, t] : tensors) {
    QKV_CHECK(name != "__metadata__", "safetensors: '__metadata__' cannot name a tensor");
    QKV_CHECK(names.insert(name).second, "safetensors: tensor name '", name, "' given twice");
    QKV_CHECK(invalid_utf8_offset(name) == std::string::npos, "safetensors: tensor name '", replace_invalid_utf8(name),
              "' is not valid UTF-8");
    Tensor c = t.contiguous();
    uint64_t nbytes = (uint64_t)c.numel() * dtype_size(c.dtype());
    if (h.size() > 1) h += ',';
    h += nlohmann::json(name).dump() + ":" +
         nlohmann::ordered_json{{"dtype", dtype_name(c.dtype())}, {"shape", c.shape()}, {"data_offsets", {at, at + nbytes}}}
             .dump();
    at += nbytes;
    contiguous.push_back(c);
  }
  h += '}';
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // align the data to 8 bytes, as the Python writer does
  std::string out(8, '\0');
  uint64_t hn = h.size();
  std::memcpy(out.data(), &hn, 8);
  out += h;
  out.reserve(out.size() + at);
  for (const Tensor& c : contiguous)
    out.append(static_cast<const char*>(c.raw_data()), (size_t)c.numel() * dtype_size(c.dtype()));
  return out;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const Metadata& metadata) {
  write_file_atomic(path, serialize_safetensors(tensors, metadata));
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors, const Metadata& metadata) {
  save_safetensors(path, std::vector<std::pair<std::string, Tensor>>(tensors.begin(), tensors.end()), metadata);
}

}  // namespace qkv
