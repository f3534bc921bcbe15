// Internal: a config struct's keys written once. A Fields<C> table lists each
// key with the member it fills, its type and its allowed values; from that one
// list come reading (type and range checks, defaults kept for absent keys),
// writing, and the unknown-key check. Cross-field rules (d_model divisible by
// nhead) stay in each config's own check, after reading.
//
//   static const Fields<ViTConfig> fields = Fields<ViTConfig>()
//       .constant("arch", "vit")
//       .add("image_size", &ViTConfig::image_size).at_least(1)
//       .add("pool", &ViTConfig::pool);
//   ViTConfig c = fields.parse(text, "config.json");   // defaults: ViTConfig{}
//   std::string text = fields.write(c).dump(2);
//
// Enum members are read and written by name through EnumNames<E> (below).
#pragma once

#include <any>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "qkv/error.h"
#include "src/core/json.h"

namespace qkv::config {

// The config names of an enum's values, in the order they are listed in
// errors: specialize with `static constexpr std::pair<E, const char*> values[]`.
template <class E>
struct EnumNames;

template <class E>
const char* name_of(E value) {
  for (auto& [v, n] : EnumNames<E>::values)
    if (v == value) return n;
  return "?";
}

// "a, b, c": the names of `allowed` (every value when empty).
template <class E>
std::string names_list(const std::vector<E>& allowed) {
  std::string list;
  for (auto& [v, n] : EnumNames<E>::values) {
    bool ok = allowed.empty();
    for (E a : allowed) ok = ok || a == v;
    if (ok) list += std::string(list.empty() ? "" : ", ") + n;
  }
  return list;
}

// The value named `name`, if it is one of `allowed` (all when empty); else
// "SOURCE: 'KEY' is 'NAME', expected one of: ...".
template <class E>
E parse_name(const std::string& name, const std::vector<E>& allowed, const std::string& key, const std::string& source) {
  for (auto& [v, n] : EnumNames<E>::values) {
    bool ok = allowed.empty();
    for (E a : allowed) ok = ok || a == v;
    if (ok && name == n) return v;
  }
  fail(source, ": '", key, "' is '", name, "', expected one of: ", names_list(allowed));
}

namespace detail {

template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};

// A JSON value as a T; a value of another type is "SOURCE: 'KEY' has the wrong type (VALUE)".
template <class T>
T decode(const nlohmann::json& v, const std::string& key, const std::string& source, const std::vector<T>& allowed) {
  auto wrong = [&]() -> T { fail(source, ": '", key, "' has the wrong type (", v.dump(), ")"); };
  if constexpr (std::is_same_v<T, bool>) {
    return v.is_boolean() ? v.get<bool>() : wrong();
  } else if constexpr (std::is_enum_v<T>) {
    return v.is_string() ? parse_name<T>(v.get<std::string>(), allowed, key, source) : wrong();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) return wrong();
    if constexpr (std::is_unsigned_v<T>) {
      QKV_CHECK(v.is_number_unsigned(), source, ": '", key, "' must not be negative, got ", v.dump());
      return v.get<T>();
    } else {
      QKV_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= (uint64_t)std::numeric_limits<T>::max(), source,
                ": '", key, "' is too large (", v.dump(), ")");
      return v.get<T>();
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return wrong();
    const T x = v.get<T>();
    QKV_CHECK(std::isfinite(x), source, ": '", key, "' is out of range (", v.dump(), ")");
    return x;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v.is_string() ? v.get<std::string>() : wrong();
  } else {
    static_assert(IsVector<T>::value, "Fields: unsupported member type");
    if (!v.is_array()) return wrong();
    T out;
    for (auto& e : v) out.push_back(decode<typename T::value_type>(e, key, source, {}));
    return out;
  }
}

// The shortest decimal that reads back as the same float: 1e-05, not 9.999999747378752e-06.
inline double shortest(float value) {
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, (double)value);
    if (std::strtof(text, nullptr) == value) break;
  }
  return std::strtod(text, nullptr);
}

template <class T>
nlohmann::ordered_json encode(const T& value) {
  if constexpr (std::is_same_v<T, float>) {
    return shortest(value);
  } else if constexpr (std::is_enum_v<T>) {
    return name_of(value);
  } else if constexpr (IsVector<T>::value) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (auto& e : value) a.push_back(encode(e));
    return a;
  } else {
    return value;
  }
}

}  // namespace detail

// Upper bounds of the size keys: above them a config is refused with the key
// named, before anything is allocated (a typo of 10^9 layers would otherwise
// build layers until the machine runs out of memory). Each is far above any
// published model of its kind.
namespace limits {
constexpr int64_t kWidth = 1 << 18;      // d_model, dim_feedforward, hidden sizes
constexpr int64_t kHeadDim = 1 << 14;    // head_dim
constexpr int64_t kHeads = 1 << 10;      // nhead, num_kv_heads
constexpr int64_t kLayers = 1 << 10;     // layers of one stack
constexpr int64_t kExperts = 1 << 12;    // num_experts
constexpr int64_t kVocab = 1 << 24;      // vocab_size
constexpr int64_t kPositions = 1 << 24;  // context, max_len
constexpr int64_t kClasses = 1 << 20;    // num_classes
constexpr int64_t kBatch = 1 << 30;      // batch_size, batch_tokens
}  // namespace limits

template <class C>
class Fields {
public:
  // `prefix` names the object the keys sit in, in errors: "train." for a config's "train" object.
  explicit Fields(std::string prefix = "") : prefix_(std::move(prefix)) {}

  // Key `key` fills `member` (of C or of a base of C).
  template <class T, class S>
  Fields& add(const char* key, T S::*member) {
    static_assert(std::is_base_of_v<S, C>, "Fields: the member must belong to the config or a base of it");
    return add_accessor<T>(key, [member](C& c) -> T& { return c.*member; });
  }
  // Key `key` fills `outer.inner` (a field of a nested options struct).
  template <class T, class U, class S>
  Fields& add(const char* key, U S::*outer, T U::*inner) {
    static_assert(std::is_base_of_v<S, C>, "Fields: the member must belong to the config or a base of it");
    return add_accessor<T>(key, [outer, inner](C& c) -> T& { return (c.*outer).*inner; });
  }
  // A key whose value is fixed ("arch"): written always; when read it must be `value`.
  Fields& constant(const char* key, const char* value) {
    std::string k = prefix_ + key, v = value;
    keys_.insert(key);
    Entry e;
    e.key = key;
    e.read = [k, v](const nlohmann::json& j, C&, const std::string& source) {
      QKV_CHECK(j.is_string(), source, ": '", k, "' has the wrong type (", j.dump(), ")");
      QKV_CHECK(j.get<std::string>() == v, source, ": '", k, "' is '", j.get<std::string>(), "', expected '", v, "'");
    };
    e.write = [v](const C&, nlohmann::ordered_json& out, const std::string& k2) { out[k2] = v; };
    entries_.push_back(std::move(e));
    return *this;
  }
  // A key another reader owns ("train", "tokenizer"): allowed, not read, not written.
  Fields& skip(const char* key) {
    keys_.insert(key);
    return *this;
  }
  // Every field of another table (shared block fields), in its order.
  template <class S>
  Fields& include(const Fields<S>& other) {
    static_assert(std::is_base_of_v<S, C>, "Fields: an included table must be of a base of the config");
    for (auto& e : other.entries_) {
      QKV_CHECK(!keys_.count(e.key), "Fields: key '", prefix_ + e.key, "' listed twice");
      keys_.insert(e.key);
      Entry mine;
      mine.key = e.key;
      mine.read = [r = e.read](const nlohmann::json& j, C& c, const std::string& s) { r(j, c, s); };
      if (e.write)
        mine.write = [w = e.write](const C& c, nlohmann::ordered_json& out, const std::string& k) { w(c, out, k); };
      entries_.push_back(std::move(mine));
    }
    return *this;
  }

  // Modifiers of the field added last.
  Fields& at_least(double low) { return range(low, std::numeric_limits<double>::infinity(), false); }
  Fields& positive() { return range(0, std::numeric_limits<double>::infinity(), true); }
  Fields& at_most(double high) { return range(-std::numeric_limits<double>::infinity(), high, false, false); }
  // low <= value < high (a probability such as dropout).
  Fields& fraction() { return range(0, 1, false, true); }
  // Only these values of an enum member (right after its add, before any other modifier).
  template <class E>
  Fields& only(std::initializer_list<E> allowed) {
    Entry& e = entries_.back();
    std::string k = prefix_ + e.key;
    auto get = std::any_cast<std::function<E&(C&)>>(e.accessor);
    std::vector<E> list(allowed);
    e.read = [k, get, list](const nlohmann::json& j, C& c, const std::string& source) {
      get(c) = detail::decode<E>(j, k, source, list);
    };
    return *this;
  }
  // Write the last field only when `when` holds (MoE keys only for an MoE MLP).
  Fields& written_if(std::function<bool(const C&)> when) {
    Entry& e = entries_.back();
    e.write = [w = e.write, when](const C& c, nlohmann::ordered_json& out, const std::string& k) {
      if (when(c)) w(c, out, k);
    };
    return *this;
  }

  // Reads the keys of object `j` into `c` (absent keys keep c's values).
  void read(const nlohmann::json& j, C& c, const std::string& source) const {
    QKV_CHECK(j.is_object(), source, ": ",
              prefix_.empty() ? "expected a JSON object" : "'" + prefix_.substr(0, prefix_.size() - 1) + "' must be an object");
    json_known_keys(j, keys_, source, prefix_.c_str());
    for (auto& e : entries_)
      if (e.read && j.contains(e.key)) e.read(j.at(e.key), c, source);
  }
  // A C{} with the keys of `text` read into it.
  C parse(const std::string& text, const std::string& source) const {
    C c;
    read(parse_json(text, source), c, source);
    return c;
  }
  nlohmann::ordered_json write(const C& c) const {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (auto& e : entries_)
      if (e.write) e.write(c, out, e.key);
    return out;
  }
  bool has(const std::string& key) const { return keys_.count(key) > 0; }

private:
  template <class>
  friend class Fields;
  using Reader = std::function<void(const nlohmann::json&, C&, const std::string&)>;
  using Writer = std::function<void(const C&, nlohmann::ordered_json&, const std::string&)>;
  struct Entry {
    std::string key;
    Reader read;
    Writer write;
    std::any accessor;  // std::function<T&(C&)>, for the modifiers
    std::function<double(C&)> number;  // the value as a number, for range checks
  };

  template <class T>
  Fields& add_accessor(const char* key, std::function<T&(C&)> get) {
    std::string k = prefix_ + key;
    QKV_CHECK(!keys_.count(key), "Fields: key '", k, "' listed twice");
    keys_.insert(key);
    Entry e;
    e.key = key;
    e.read = [k, get](const nlohmann::json& j, C& c, const std::string& source) {
      get(c) = detail::decode<T>(j, k, source, {});
    };
    e.write = [get](const C& c, nlohmann::ordered_json& out, const std::string& k2) {
      out[k2] = detail::encode<T>(get(const_cast<C&>(c)));
    };
    e.accessor = get;
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
      e.number = [get](C& c) { return (double)get(c); };
    entries_.push_back(std::move(e));
    return *this;
  }

  Fields& range(double low, double high, bool open_low, bool open_high = false) {
    Entry& e = entries_.back();
    QKV_CHECK(e.number, "Fields: a range on the non-numeric key '", e.key, "'");
    e.read = [r = e.read, num = e.number, k = prefix_ + e.key, low, high, open_low, open_high](const nlohmann::json& j, C& c,
                                                                                    const std::string& source) {
      r(j, c, source);
      const double v = num(c);
      const bool ok = (open_low ? v > low : v >= low) && (open_high ? v < high : v <= high) && !std::isnan(v);
      if (ok) return;
      auto text = [](double x) {
        return x == std::floor(x) && std::fabs(x) < 1e15 ? std::to_string((int64_t)x) : nlohmann::json(x).dump();
      };
      std::string want;
      if (std::isinf(high)) {
        want = open_low && low == 0 ? "positive" : "at least " + text(low);
      } else if (std::isinf(low)) {
        want = "at most " + text(high);
      } else {
        want = std::string("in ") + (open_low ? "(" : "[") + text(low) + ", " + text(high) + (open_high ? ")" : "]");
      }
      fail(source, ": '", k, "' must be ", want, ", got ", j.dump());
    };
    return *this;
  }

  std::string prefix_;
  std::vector<Entry> entries_;
  std::set<std::string> keys_;
};

// Options from the "train" object of a config's text, through `fields`
// (made with the prefix "train."); defaults when there is none.
template <class O>
O read_train_section(const Fields<O>& fields, const std::string& text, const std::string& source) {
  nlohmann::json j = parse_json(text, source);
  O o;
  if (j.is_object() && j.contains("train")) fields.read(j.at("train"), o, source);
  return o;
}

}  // namespace qkv::config
