// The Jinja subset of chat templates (qkv/jinja.h): a lexer that splits the
// source into text and tags (applying whitespace control, trim_blocks and
// lstrip_blocks), a recursive-descent parser to a tree of statements and
// expressions, and an evaluator over Python-like values.
#include "qkv/jinja.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "qkv/error.h"

namespace qkv::jinja {

// Renderer::filter and Renderer::test below run each of these.
const std::set<std::string>& filter_names() {
  static const std::set<std::string> names = {
      "trim",       "length", "count",   "tojson", "upper",    "lower",  "capitalize", "title",
      "string",     "safe",   "default", "d",      "first",    "last",   "list",       "reverse",
      "join",       "items",  "int",     "float",  "replace",  "unique", "sort",       "selectattr",
      "rejectattr", "map",    "select",  "reject", "dictsort", "min",    "max",        "indent"};
  return names;
}
const std::set<std::string>& test_names() {
  static const std::set<std::string> names = {"defined",  "undefined", "none",    "string", "number",  "integer",
                                              "float",    "boolean",   "true",    "false",  "mapping", "sequence",
                                              "iterable", "callable",  "equalto", "eq",     "==",      "sameas",
                                              "ne",       "!=",        "in",      "odd",    "even",    "divisibleby"};
  return names;
}

// Named rather than anonymous: Template::Impl holds the tree.
namespace detail {

// Bounds that keep a hostile template finite.
constexpr size_t kMaxOutput = 16u << 20;  // bytes of rendered text
constexpr int64_t kMaxRange = 1 << 20;    // items range() may make
constexpr int kMaxDepth = 64;             // nested macro calls
constexpr int kMaxNesting = 256;          // nested expressions and blocks while parsing
constexpr int64_t kMaxSteps = 1 << 20;    // loop iterations and macro calls of one render
// Lists, dicts and namespaces inside one another, the context's JSON among
// them: printing, comparing, converting and freeing a value go down it a
// call a level. A template could otherwise nest without end
// ({% set ns.l = [ns.l] %} in a loop).
constexpr int kMaxValueDepth = 128;

// Errors are one line; a template's own text (a key, a raised message) may not be.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

// ---------------------------------------------------------------- values

struct Value;
using List = std::vector<Value>;
// In insertion order, as Python's dicts; keys are strings, numbers, booleans
// or none (Python's hashable scalars), one entry per key as Python compares
// them (1, 1.0 and True are one key).
using Dict = std::vector<std::pair<Value, Value>>;
bool equal(const Value& a, const Value& b);
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};
using Function = std::function<Value(Args&)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, Str, List, Dict, Function };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;               // Str; Undefined: the name that was not defined
  std::shared_ptr<List> list;  // shared: a list is one object, as in Python
  std::shared_ptr<Dict> dict;  // a namespace() too, whose attributes `set` may change
  bool is_namespace = false;
  // A list's or dict's levels (1 + its deepest element's), at most
  // kMaxValueDepth. Lists and dicts do not change once made, so it stays
  // true; a namespace does, so no list, dict or namespace may hold one (no
  // value then holds itself, and none is deeper than its depth says).
  int depth = 0;
  bool is_tuple = false;  // a list written (a, b): printed with parentheses
  // Str: jinja2's Markup, what |safe returns. `+` with a plain string beside
  // it escapes that string for HTML (markupsafe's rule), and the sum is
  // Markup too; everything else treats it as the string it is.
  bool markup = false;
  std::shared_ptr<Function> fn;

  static Value undefined(std::string name) {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() { return make(Kind::None); }
  static Value boolean(bool x) {
    Value v = make(Kind::Bool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Kind::Int);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = make(Kind::Float);
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v = make(Kind::Str);
    v.s = std::move(x);
    return v;
  }
  static Value of_list(List x) {
    Value v = make(Kind::List);
    for (const Value& e : x) v.hold(e);
    v.list = std::make_shared<List>(std::move(x));
    return v;
  }
  static Value of_dict(Dict x) {
    Value v = make(Kind::Dict);
    for (const auto& [key, value] : x) v.hold(key), v.hold(value);
    v.dict = std::make_shared<Dict>(std::move(x));
    return v;
  }
  // Checks that this container (depth 0 until its first element) may hold e.
  void hold(const Value& e) {
    QKV_CHECK(!e.is_namespace, "a namespace() cannot be put in a list, a dict or another namespace");
    QKV_CHECK(e.depth < kMaxValueDepth, "lists and dicts nested deeper than ", kMaxValueDepth, " levels");
    depth = std::max(depth, e.depth + 1);
  }
  static Value function(Function f) {
    Value v = make(Kind::Function);
    v.fn = std::make_shared<Function>(std::move(f));
    return v;
  }
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }

  bool defined() const { return kind != Kind::Undefined; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  double number() const { return kind == Kind::Float ? f : kind == Kind::Bool ? (double)b : (double)i; }
  const Value* find(const std::string& key) const {
    if (kind != Kind::Dict) return nullptr;
    for (const auto& [k, v] : *dict)
      if (k.kind == Kind::Str && k.s == key) return &v;
    return nullptr;
  }
  const Value* find(const Value& key) const {
    if (kind != Kind::Dict) return nullptr;
    for (const auto& [k, v] : *dict)
      if (equal(k, key)) return &v;
    return nullptr;
  }
};

Value from_json(const nlohmann::ordered_json& j, int depth = 1) {
  if (j.is_structured() && depth > kMaxValueDepth)
    fail("the context is nested deeper than ", kMaxValueDepth, " levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e, depth + 1));
      return Value::of_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, v] : j.items()) d.emplace_back(Value::str(k), from_json(v, depth + 1));
      return Value::of_dict(std::move(d));
    }
    default: fail("a JSON value of a type Jinja has no counterpart for");
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i != 0;
    case Value::Kind::Float: return v.f != 0;
    case Value::Kind::Str: return !v.s.empty();
    case Value::Kind::List: return !v.list->empty();
    case Value::Kind::Dict: return !v.dict->empty();
    case Value::Kind::Function: return true;
  }
  return false;
}

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "undefined";
    case Value::Kind::None: return "none";
    case Value::Kind::Bool: return "a boolean";
    case Value::Kind::Int: return "an integer";
    case Value::Kind::Float: return "a float";
    case Value::Kind::Str: return "a string";
    case Value::Kind::List: return "a list";
    case Value::Kind::Dict: return "a dict";
    case Value::Kind::Function: return "a function";
  }
  return "?";
}

std::string format_float(double x) {  // Python's repr of a float
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string quote_python(const std::string& s) {  // Python's repr of a str (without its escapes of non-ASCII)
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else
      out += c;
  }
  return out + q;
}

std::string repr(const Value& v);

// What {{ v }} prints: Python's str().
// A dict's (key, value) pair, as Python's items() gives it: a tuple.
Value key_value(const Value& key, const Value& value) {
  Value pair = Value::of_list({key, value});
  pair.is_tuple = true;
  return pair;
}

std::string to_string(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.b ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return format_float(v.f);
    case Value::Kind::Str: return v.s;
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Str: return quote_python(v.s);
    case Value::Kind::List: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      if (v.is_tuple && v.list->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case Value::Kind::Dict: {
      std::string out = v.is_namespace ? "<Namespace {" : "{";
      for (size_t k = 0; k < v.dict->size(); ++k)
        out += (k ? ", " : "") + repr((*v.dict)[k].first) + ": " + repr((*v.dict)[k].second);
      return out + (v.is_namespace ? "}>" : "}");
    }
    case Value::Kind::Function: return "<function>";
    default: return to_string(v);
  }
}

// A dict key as json.dumps writes it: a string as it is, 1 as "1", 1.5 as
// "1.5", true as "true", none as "null".
std::string json_key(const Value& k) {
  switch (k.kind) {
    case Value::Kind::Str: return k.s;
    case Value::Kind::Int: return std::to_string(k.i);
    case Value::Kind::Float: return format_float(k.f);
    case Value::Kind::Bool: return k.b ? "true" : "false";
    default: return "null";
  }
}

nlohmann::ordered_json to_json(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return nullptr;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i;
    case Value::Kind::Float: return v.f;
    case Value::Kind::Str: return v.s;
    case Value::Kind::List: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const Value& e : *v.list) a.push_back(to_json(e));
      return a;
    }
    case Value::Kind::Dict: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [k, e] : *v.dict) o[json_key(k)] = to_json(e);
      return o;
    }
    case Value::Kind::Function: fail("tojson: a function has no JSON form");
  }
  return nullptr;
}

// Python's json.dumps (ensure_ascii=False; separators ", " and ": "; with
// an indent, one item per line), which transformers' tojson filter calls.
void dump_json(const nlohmann::ordered_json& j, int indent, int level, std::string& out) {
  const std::string pad = indent > 0 ? "\n" + std::string((size_t)(indent * (level + 1)), ' ') : "";
  const std::string end = indent > 0 ? "\n" + std::string((size_t)(indent * level), ' ') : "";
  const char* comma = indent > 0 ? "," : ", ";
  if (j.is_array() && !j.empty()) {
    out += '[';
    for (size_t k = 0; k < j.size(); ++k) {
      out += (k ? comma : "") + pad;
      dump_json(j[k], indent, level + 1, out);
    }
    out += end + "]";
  } else if (j.is_object() && !j.empty()) {
    out += '{';
    size_t k = 0;
    for (const auto& [key, e] : j.items()) {
      out += (k++ ? comma : "") + pad + nlohmann::ordered_json(key).dump(-1, ' ', false) + ": ";
      dump_json(e, indent, level + 1, out);
    }
    out += end + "}";
  } else if (j.is_number_float()) {
    out += format_float(j.get<double>());
  } else {
    out += j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.number() == b.number();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::Str: return a.s == b.s;
    case Value::Kind::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Kind::Dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* w = b.find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    case Value::Kind::Function: return a.fn == b.fn;
    default: return false;
  }
}

// ---------------------------------------------------------------- lexing

// The source as text pieces and tags, whitespace control applied.
struct Piece {
  enum class Kind { Text, Output, Block } kind;
  std::string text;  // the text, or the tag's inside
  int line = 1;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The first "{{", "{%" or "{#" at or after `from`, or npos.
size_t find_open(const std::string& src, size_t from) {
  for (size_t k = src.find('{', from); k != std::string::npos && k + 1 < src.size(); k = src.find('{', k + 1))
    if (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#') return k;
  return std::string::npos;
}

// Where the tag whose inside starts at `inner` closes ("}}", "%}" or "#}");
// in an output tag, a "}}" inside a string literal does not close it.
size_t find_close(const std::string& src, size_t inner, char kind) {
  const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
  if (kind == '#') return src.find(close, inner);
  char quote = 0;
  for (size_t k = inner; k + 1 < src.size(); ++k) {
    if (quote) {
      if (src[k] == '\\')
        ++k;
      else if (src[k] == quote)
        quote = 0;
    } else if (src[k] == '\'' || src[k] == '"') {
      quote = src[k];
    } else if (src[k] == close[0] && src[k + 1] == '}') {
      return k;
    }
  }
  return std::string::npos;
}

std::vector<Piece> split(const std::string& src) {
  std::vector<Piece> pieces;
  size_t at = 0;
  int line = 1;
  bool trim_next = false;     // "-" closed the last tag: the next text loses its leading whitespace
  bool newline_next = false;  // a block or comment tag closed: one newline after it goes (trim_blocks)
  while (true) {
    const size_t open = find_open(src, at);
    const size_t text_end = open == std::string::npos ? src.size() : open;
    std::string text = src.substr(at, text_end - at);
    const int text_line = line;
    line += (int)std::count(text.begin(), text.end(), '\n');
    size_t dropped = 0;  // characters taken from the text's front
    if (trim_next) {
      while (dropped < text.size() && is_space(text[dropped])) ++dropped;
    } else if (newline_next && text.rfind("\n", 0) == 0) {
      dropped = 1;
    } else if (newline_next && text.rfind("\r\n", 0) == 0) {
      dropped = 2;
    }
    text.erase(0, dropped);
    if (open == std::string::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::Text, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    size_t inner = open + 2;
    const bool minus_left = inner < src.size() && src[inner] == '-';
    const bool plus_left = inner < src.size() && src[inner] == '+';
    if (minus_left || plus_left) ++inner;
    if (minus_left) {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (kind != '{' && !plus_left) {  // lstrip_blocks: spaces and tabs before it, on its own line
      size_t k = open;
      while (k > at && (src[k - 1] == ' ' || src[k - 1] == '\t')) --k;
      if (k == 0 || src[k - 1] == '\n') text.erase(text.size() - std::min(text.size(), open - k));
    }
    if (!text.empty()) pieces.push_back({Piece::Kind::Text, text, text_line});
    const size_t end = find_close(src, inner, kind);
    QKV_CHECK(end != std::string::npos, "line ", line, ": '{", std::string(1, kind), "' is never closed");
    size_t inner_end = end;
    const bool minus_right = inner_end > inner && src[inner_end - 1] == '-';
    if (minus_right) --inner_end;
    if (kind == '{') pieces.push_back({Piece::Kind::Output, src.substr(inner, inner_end - inner), line});
    if (kind == '%') pieces.push_back({Piece::Kind::Block, src.substr(inner, inner_end - inner), line});
    line += (int)std::count(src.begin() + (ptrdiff_t)open, src.begin() + (ptrdiff_t)end, '\n');
    trim_next = minus_right;
    newline_next = !minus_right && kind != '{';
    at = end + 2;
  }
  return pieces;
}

// Tokens of an expression or statement.
struct Token {
  enum class Kind { Name, String, Int, Float, Op, End } kind;
  std::string text;
  int64_t i = 0;
  double f = 0;
};

std::vector<Token> tokenize(const std::string& s, int line) {
  std::vector<Token> out;
  size_t k = 0;
  while (true) {
    while (k < s.size() && is_space(s[k])) ++k;
    if (k >= s.size()) break;
    const char c = s[k];
    if (std::isalpha((unsigned char)c) || c == '_') {
      size_t e = k;
      while (e < s.size() && (std::isalnum((unsigned char)s[e]) || s[e] == '_')) ++e;
      out.push_back({Token::Kind::Name, s.substr(k, e - k)});
      k = e;
    } else if (std::isdigit((unsigned char)c)) {
      size_t e = k;
      while (e < s.size() && (std::isdigit((unsigned char)s[e]) || s[e] == '_')) ++e;
      bool real = false;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit((unsigned char)s[e + 1])) {
        real = true;
        for (++e; e < s.size() && std::isdigit((unsigned char)s[e]);) ++e;
      }
      if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
        size_t x = e + 1;
        if (x < s.size() && (s[x] == '+' || s[x] == '-')) ++x;
        if (x < s.size() && std::isdigit((unsigned char)s[x])) {
          real = true;
          for (e = x; e < s.size() && std::isdigit((unsigned char)s[e]);) ++e;
        }
      }
      std::string digits = s.substr(k, e - k);
      digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
      Token t{real ? Token::Kind::Float : Token::Kind::Int, digits};
      if (real) {
        t.f = std::strtod(digits.c_str(), nullptr);
      } else {
        errno = 0;
        t.i = std::strtoll(digits.c_str(), nullptr, 10);
        QKV_CHECK(errno == 0, "line ", line, ": the number ", digits, " is too large");
      }
      out.push_back(t);
      k = e;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t e = k + 1;
      for (; e < s.size() && s[e] != c; ++e) {
        if (s[e] != '\\' || e + 1 >= s.size()) {
          v += s[e];
          continue;
        }
        const char x = s[++e];
        switch (x) {
          case 'n': v += '\n'; break;
          case 't': v += '\t'; break;
          case 'r': v += '\r'; break;
          case '\\': v += '\\'; break;
          case '\'': v += '\''; break;
          case '"': v += '"'; break;
          default: v += '\\', v += x;
        }
      }
      QKV_CHECK(e < s.size(), "line ", line, ": a string is never closed");
      out.push_back({Token::Kind::String, v});
      k = e + 1;
    } else {
      static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                   ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ":", ".", "|"};
      bool found = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (s.compare(k, n, op) == 0) {
          out.push_back({Token::Kind::Op, op});
          k += n;
          found = true;
          break;
        }
      }
      QKV_CHECK(found, "line ", line, ": unexpected character '", std::string(1, c), "'");
    }
  }
  out.push_back({Token::Kind::End, ""});
  return out;
}

// ---------------------------------------------------------------- syntax tree

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  enum class Kind {
    Literal,
    Name,
    Attr,
    Index,
    Slice,
    Call,
    Filter,
    Test,
    Not,
    Neg,
    Binary,
    And,
    Or,
    Cond,
    ListLit,
    TupleLit,
    DictLit
  } kind;
  int line = 0;
  Value literal;
  std::string name;            // Name, Attr, Filter, Test, Binary's operator
  std::vector<ExprPtr> items;  // operands; Call/Filter/Test: the callee or input first, then args
  std::vector<std::pair<std::string, ExprPtr>> named;  // keyword arguments; DictLit: key expr in items
  bool negated = false;                                // Test: "is not"
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;
struct Stmt {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue } kind;
  int line = 0;
  std::string text;                                // Text; Set: the name; Macro: its name
  std::string attr;                                // Set of ns.attr: the attribute
  ExprPtr expr;                                    // Output, Set's value, For's iterable
  ExprPtr filter;                                  // For's "if"
  std::vector<std::string> vars;                   // For's loop variables; Macro's parameters
  std::vector<ExprPtr> defaults;                   // Macro: one per parameter (null: none)
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body)...
  Body body, otherwise;                            // For, SetBlock, Macro; For's else, If's else
};

class Parser {
public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (at_ < pieces_.size()) fail_at(pieces_[at_].line, "unexpected '{% " + first_word(pieces_[at_]) + " %}'");
    return body;
  }
  // Whether any expression of the template reads the name `loop`.
  bool reads_loop() const { return reads_loop_; }

private:
  [[noreturn]] static void fail_at(int line, const std::string& what) { fail("line ", line, ": ", one_line(what)); }

  static std::string first_word(const Piece& p) {
    std::vector<Token> t = tokenize(p.text, p.line);
    return t[0].kind == Token::Kind::Name ? t[0].text : "";
  }

  // Statements until a block tag whose first word is in `ends` (left unread).
  Body parse_body(const std::set<std::string>& ends) {
    QKV_CHECK(++blocks_ <= kMaxNesting, "line ", at_ < pieces_.size() ? pieces_[at_].line : 0,
              ": blocks nested too deep");
    Body body;
    while (at_ < pieces_.size()) {
      const Piece& p = pieces_[at_];
      if (p.kind == Piece::Kind::Text) {
        body.push_back(text_stmt(p));
        ++at_;
        continue;
      }
      tokens_ = tokenize(p.text, p.line);
      pos_ = 0;
      line_ = p.line;
      if (p.kind == Piece::Kind::Output) {
        auto s = stmt(Stmt::Kind::Output);
        s->expr = expression();
        expect_end();
        body.push_back(std::move(s));
        ++at_;
        continue;
      }
      const std::string word = peek().kind == Token::Kind::Name ? peek().text : "";
      if (ends.count(word)) break;
      ++at_;
      next();
      if (word == "if")
        body.push_back(parse_if());
      else if (word == "for")
        body.push_back(parse_for());
      else if (word == "set")
        body.push_back(parse_set());
      else if (word == "macro")
        body.push_back(parse_macro());
      else if (word == "break" || word == "continue")
        body.push_back(parse_loop_control(word));
      else if (word == "generation")
        body.push_back(parse_generation());
      else if (word.empty())
        fail_at(line_, "a block tag without a statement");
      else if (word.rfind("end", 0) == 0 || word == "elif" || word == "else")
        fail_at(line_, "unexpected '{% " + word + " %}'");
      else
        fail_at(line_, "'{% " + word + " %}' is not supported (qkv runs the chat-template subset of Jinja)");
    }
    --blocks_;
    return body;
  }

  std::unique_ptr<Stmt> stmt(Stmt::Kind k) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line_;
    return s;
  }

  std::unique_ptr<Stmt> text_stmt(const Piece& p) {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::Text;
    s->text = p.text;
    s->line = p.line;
    return s;
  }

  // Reads the block tag that ends a body, whose first word is one of `words`; returns it.
  std::string end_tag(const std::set<std::string>& words, const char* opened, int line) {
    if (at_ >= pieces_.size()) fail_at(line, std::string("'{% ") + opened + " %}' is never closed");
    const Piece& p = pieces_[at_++];
    tokens_ = tokenize(p.text, p.line);
    pos_ = 0;
    line_ = p.line;
    const std::string word = next().text;
    QKV_CHECK(words.count(word), "line ", p.line, ": unexpected '", word, "'");
    return word;
  }

  std::unique_ptr<Stmt> parse_if() {
    auto s = stmt(Stmt::Kind::If);
    const int line = line_;
    ++if_depth_;
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{if_depth_};
    ExprPtr cond = expression();
    expect_end();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      const std::string word = end_tag({"elif", "else", "endif"}, "if", line);
      if (word == "endif") {
        expect_end();
        return s;
      }
      if (word == "else") {
        expect_end();
        s->otherwise = parse_body({"endif"});
        end_tag({"endif"}, "if", line);
        expect_end();
        return s;
      }
      cond = expression();
      expect_end();
    }
  }

  // {% generation %} ... {% endgeneration %}: transformers' mark of the
  // assistant's tokens (for return_assistant_tokens_mask); its body renders
  // as it stands, as an if whose condition is true.
  std::unique_ptr<Stmt> parse_generation() {
    auto s = stmt(Stmt::Kind::If);
    const int line = line_;
    expect_end();
    ExprPtr always = node(Expr::Kind::Literal);
    always->literal = Value::boolean(true);
    Body body = parse_body({"endgeneration"});
    end_tag({"endgeneration"}, "generation", line);
    expect_end();
    s->branches.emplace_back(std::move(always), std::move(body));
    return s;
  }

  std::unique_ptr<Stmt> parse_for() {
    auto s = stmt(Stmt::Kind::For);
    const int line = line_;
    do {
      s->vars.push_back(name_token("a loop variable"));
    } while (accept(","));
    expect_name("in");
    s->expr = expression(/*allow_cond=*/false);
    if (accept_name("if")) s->filter = expression();
    if (accept_name("recursive")) fail_at(line_, "recursive loops are not supported");
    expect_end();
    ++loops_;
    s->body = parse_body({"else", "endfor"});
    --loops_;
    if (end_tag({"else", "endfor"}, "for", line) == "else") {
      expect_end();
      s->otherwise = parse_body({"endfor"});
      end_tag({"endfor"}, "for", line);
    }
    expect_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_set() {
    const int line = line_;
    std::string name = name_token("a name");
    std::string attr;
    if (accept(".")) attr = name_token("an attribute");
    if (!accept("=")) {  // {% set x %} ... {% endset %}
      QKV_CHECK(attr.empty(), "line ", line_, ": a block set takes a plain name");
      auto s = stmt(Stmt::Kind::SetBlock);
      s->text = name;
      expect_end();
      s->body = parse_body({"endset"});
      end_tag({"endset"}, "set", line);
      expect_end();
      return s;
    }
    auto s = stmt(Stmt::Kind::Set);
    s->text = name;
    s->attr = attr;
    s->expr = expression();
    expect_end();
    return s;
  }

  // {% break %} and {% continue %} (jinja2.ext.loopcontrols, which
  // apply_chat_template enables), inside a for loop.
  std::unique_ptr<Stmt> parse_loop_control(const std::string& word) {
    QKV_CHECK(loops_ > 0, "line ", line_, ": '{% ", word, " %}' outside a loop");
    expect_end();
    return stmt(word == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue);
  }

  std::unique_ptr<Stmt> parse_macro() {
    auto s = stmt(Stmt::Kind::Macro);
    const int line = line_;
    s->text = name_token("the macro's name");
    expect("(");
    if (!accept(")")) {
      do {
        s->vars.push_back(name_token("a parameter"));
        s->defaults.push_back(accept("=") ? expression() : nullptr);
      } while (accept(","));
      expect(")");
    }
    expect_end();
    const int loops = std::exchange(loops_, 0);  // a loop around a macro is not the macro's loop
    s->body = parse_body({"endmacro"});
    loops_ = loops;
    end_tag({"endmacro"}, "macro", line);
    expect_end();
    return s;
  }

  // ---- expressions

  const Token& peek() const { return tokens_[pos_]; }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (t.kind != Token::Kind::End) ++pos_;
    return t;
  }
  bool is_op(const char* op) const { return peek().kind == Token::Kind::Op && peek().text == op; }
  bool accept(const char* op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool is_name(const char* n) const { return peek().kind == Token::Kind::Name && peek().text == n; }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    ++pos_;
    return true;
  }
  std::string describe(const Token& t) const {
    if (t.kind == Token::Kind::End) return "the end of the tag";
    return t.kind == Token::Kind::String ? "a string" : "'" + t.text + "'";
  }
  void expect(const char* op) {
    if (!accept(op)) fail_at(line_, std::string("expected '") + op + "', found " + describe(peek()));
  }
  void expect_name(const char* n) {
    if (!accept_name(n)) fail_at(line_, std::string("expected '") + n + "', found " + describe(peek()));
  }
  void expect_end() {
    if (peek().kind != Token::Kind::End) fail_at(line_, "unexpected " + describe(peek()));
  }
  std::string name_token(const char* what) {
    if (peek().kind != Token::Kind::Name)
      fail_at(line_, std::string("expected ") + what + ", found " + describe(peek()));
    return next().text;
  }

  ExprPtr node(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }

  struct Depth {
    explicit Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) fail_at(p_.line_, "an expression nested too deep");
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };

  ExprPtr expression(bool allow_cond = true) {
    Depth d(*this);
    ExprPtr e = or_expr();
    if (allow_cond && accept_name("if")) {
      auto c = node(Expr::Kind::Cond);
      c->items.push_back(std::move(e));
      c->items.push_back(or_expr());
      if (accept_name("else")) c->items.push_back(expression());
      return c;
    }
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (accept_name("or")) e = operands(Expr::Kind::Or, std::move(e), and_expr());
    return e;
  }

  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (accept_name("and")) e = operands(Expr::Kind::And, std::move(e), not_expr());
    return e;
  }

  ExprPtr not_expr() {
    if (accept_name("not")) {
      Depth d(*this);
      auto n = node(Expr::Kind::Not);
      n->items.push_back(not_expr());
      return n;
    }
    return compare();
  }

  // A node of kind k over l and r.
  ExprPtr operands(Expr::Kind k, ExprPtr l, ExprPtr r) {
    auto n = node(k);
    n->items.push_back(std::move(l));
    n->items.push_back(std::move(r));
    return n;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r) {
    auto b = operands(Expr::Kind::Binary, std::move(l), std::move(r));
    b->name = std::move(op);
    return b;
  }

  ExprPtr compare() {
    ExprPtr e = math1();
    while (true) {
      std::string op;
      for (const char* o : {"==", "!=", "<", "<=", ">", ">="})
        if (is_op(o)) op = o;
      if (!op.empty()) {
        next();
        e = binary(op, std::move(e), math1());
      } else if (accept_name("in")) {
        e = binary("in", std::move(e), math1());
      } else if (is_name("not") && tokens_[pos_ + 1].kind == Token::Kind::Name && tokens_[pos_ + 1].text == "in") {
        pos_ += 2;
        e = binary("not in", std::move(e), math1());
      } else {
        return e;
      }
    }
  }

  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      e = binary(op, std::move(e), concat());
    }
    return e;
  }

  ExprPtr concat() {
    ExprPtr e = math2();
    while (accept("~")) e = binary("~", std::move(e), math2());
    return e;
  }

  ExprPtr math2() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      e = binary(op, std::move(e), power());
    }
    return e;
  }

  ExprPtr power() {
    ExprPtr e = unary();
    while (accept("**")) e = binary("**", std::move(e), unary());
    return e;
  }

  ExprPtr unary() {
    Depth d(*this);
    if (accept("-")) {
      auto n = node(Expr::Kind::Neg);
      n->items.push_back(unary());
      return n;
    }
    if (accept("+")) return unary();
    return postfix(primary());
  }

  void arguments(Expr& call) {  // after "(": positional and name=value arguments, then ")"
    if (accept(")")) return;
    do {
      if (peek().kind == Token::Kind::Name && tokens_[pos_ + 1].kind == Token::Kind::Op &&
          tokens_[pos_ + 1].text == "=") {
        std::string key = next().text;
        next();
        call.named.emplace_back(std::move(key), expression());
      } else {
        call.items.push_back(expression());
      }
    } while (accept(","));
    expect(")");
  }

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (accept(".")) {
        auto a = node(Expr::Kind::Attr);
        a->name = name_token("an attribute");
        a->items.push_back(std::move(e));
        e = std::move(a);
      } else if (accept("[")) {
        ExprPtr parts[3];
        bool slice = false;
        int part = 0;
        while (true) {
          if (!is_op(":") && !is_op("]")) parts[part] = expression();
          if (accept(":")) {
            slice = true;
            QKV_CHECK(++part < 3, "line ", line_, ": a slice has at most two ':'");
            continue;
          }
          break;
        }
        expect("]");
        auto x = node(slice ? Expr::Kind::Slice : Expr::Kind::Index);
        x->items.push_back(std::move(e));
        if (!slice && !parts[0]) fail_at(line_, "an empty subscript");
        for (int k = 0; k < (slice ? 3 : 1); ++k) x->items.push_back(std::move(parts[k]));
        e = std::move(x);
      } else if (accept("(")) {
        auto c = node(Expr::Kind::Call);
        c->items.push_back(std::move(e));
        arguments(*c);
        e = std::move(c);
      } else if (accept("|")) {
        auto f = node(Expr::Kind::Filter);
        f->name = name_token("a filter");
        // Unknown inside an if (its condition or branches) fails only if it runs, as in jinja2
        // (templates test for their filters that way); elsewhere, now.
        if (!filter_names().count(f->name) && if_depth_ == 0)
          fail_at(line_, "the filter '" + f->name + "' is not supported");
        f->items.push_back(std::move(e));
        if (accept("(")) arguments(*f);
        e = std::move(f);
      } else if (accept_name("is")) {
        auto t = node(Expr::Kind::Test);
        t->negated = accept_name("not");
        t->name = peek().kind == Token::Kind::Name ? next().text : "";
        if (t->name.empty() && (is_op("==") || is_op("!="))) t->name = next().text;
        if (t->name.empty()) fail_at(line_, "expected a test after 'is'");
        if (!test_names().count(t->name) && if_depth_ == 0)
          fail_at(line_, "the test '" + t->name + "' is not supported");
        t->items.push_back(std::move(e));
        if (accept("(")) {
          arguments(*t);
        } else if (peek().kind == Token::Kind::String || peek().kind == Token::Kind::Int ||
                   peek().kind == Token::Kind::Float ||
                   (peek().kind == Token::Kind::Name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("in") && !is_name("not"))) {
          t->items.push_back(primary());  // "is divisibleby 3", "is equalto 'x'"
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  ExprPtr primary() {
    const Token& t = next();
    auto lit = [&](Value v) {
      auto e = node(Expr::Kind::Literal);
      e->literal = std::move(v);
      return e;
    };
    switch (t.kind) {
      case Token::Kind::String: {
        std::string s = t.text;
        while (peek().kind == Token::Kind::String) s += next().text;  // adjacent literals join
        return lit(Value::str(s));
      }
      case Token::Kind::Int: return lit(Value::integer(t.i));
      case Token::Kind::Float: return lit(Value::real(t.f));
      case Token::Kind::Name:
        if (t.text == "true" || t.text == "True") return lit(Value::boolean(true));
        if (t.text == "false" || t.text == "False") return lit(Value::boolean(false));
        if (t.text == "none" || t.text == "None") return lit(Value::none());
        {
          auto e = node(Expr::Kind::Name);
          e->name = t.text;
          if (t.text == "loop") reads_loop_ = true;
          return e;
        }
      case Token::Kind::Op:
        if (t.text == "(") {
          ExprPtr e = expression();
          if (accept(",")) {  // a tuple: a list that prints with parentheses
            auto l = node(Expr::Kind::TupleLit);
            l->items.push_back(std::move(e));
            while (!is_op(")")) {
              l->items.push_back(expression());
              if (!accept(",")) break;
            }
            e = std::move(l);
          }
          expect(")");
          return e;
        }
        if (t.text == "[") {
          auto l = node(Expr::Kind::ListLit);
          while (!is_op("]")) {
            l->items.push_back(expression());
            if (!accept(",")) break;
          }
          expect("]");
          return l;
        }
        if (t.text == "{") {
          auto d = node(Expr::Kind::DictLit);
          while (!is_op("}")) {
            d->items.push_back(expression());
            expect(":");
            d->items.push_back(expression());
            if (!accept(",")) break;
          }
          expect("}");
          return d;
        }
        break;
      case Token::Kind::End: break;
    }
    fail_at(line_, "unexpected " + describe(t));
  }

  const std::vector<Piece> pieces_;
  size_t at_ = 0;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int line_ = 1;
  int if_depth_ = 0;  // if statements being parsed around the present token
  int depth_ = 0;   // expressions being read, one inside another
  int blocks_ = 0;  // blocks being read, one inside another
  int loops_ = 0;   // for loops around the statement being read
  bool reads_loop_ = false;
};

// ---------------------------------------------------------------- evaluation

struct Macro {
  const Stmt* def;
};

class Renderer {
public:
  // loop_variable: whether for loops bind `loop` (a template that never
  // reads it skips building the nine-field dict each iteration, which was
  // most of an empty iteration's time).
  Renderer(const nlohmann::ordered_json& context, bool loop_variable) : loop_variable_(loop_variable) {
    QKV_CHECK(context.is_object(), "render: the context must be a JSON object");
    scopes_.emplace_back();
    for (const auto& [k, v] : context.items()) scopes_.back()[k] = from_json(v);
    builtins();
  }

  // What a {% break %} or {% continue %} asks of the loop around it.
  enum class Flow { Next, Break, Continue };

  Flow run(const Body& body, std::string& out) {
    for (const auto& s : body)
      if (Flow f = exec(*s, out); f != Flow::Next) return f;
    return Flow::Next;
  }

private:
  using Scope = std::map<std::string, Value>;

  [[noreturn]] static void fail_at(int line, const std::string& what) { fail("line ", line, ": ", one_line(what)); }

  void builtins() {
    Scope& g = scopes_.front();
    auto set = [&](const char* name, Function f) {
      if (!g.count(name)) g[name] = Value::function(std::move(f));
    };
    set("raise_exception", [](Args& a) -> Value {
      fail(one_line(a.positional.empty() ? std::string("raise_exception") : to_string(a.positional[0])));
    });
    set("namespace", [](Args& a) {
      Dict d;
      for (auto& [k, v] : a.named) d.emplace_back(Value::str(k), v);
      Value v = Value::of_dict(std::move(d));
      v.is_namespace = true;
      return v;
    });
    set("range", [](Args& a) {
      std::vector<int64_t> n;
      for (const Value& v : a.positional) {
        QKV_CHECK(v.kind == Value::Kind::Int, "range: expects integers, got ", kind_name(v));
        n.push_back(v.i);
      }
      QKV_CHECK(n.size() >= 1 && n.size() <= 3, "range: expects 1 to 3 integers");
      const int64_t start = n.size() > 1 ? n[0] : 0, stop = n.size() > 1 ? n[1] : n[0], step = n.size() > 2 ? n[2] : 1;
      QKV_CHECK(step != 0, "range: a step of 0");
      List l;
      for (int64_t x = start; step > 0 ? x < stop : x > stop;) {
        QKV_CHECK((int64_t)l.size() < kMaxRange, "range: more than ", kMaxRange, " items");
        l.push_back(Value::integer(x));
        if (__builtin_add_overflow(x, step, &x)) break;  // the next would be past 64 bits, so past stop
      }
      return Value::of_list(std::move(l));
    });
    set("strftime_now", [](Args& a) {
      QKV_CHECK(a.positional.size() == 1 && a.positional[0].kind == Value::Kind::Str, "strftime_now: expects a format");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, a.positional[0].s.c_str(), &tm);
      return Value::str(std::string(buf, n));
    });
  }

  Value lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s)
      if (auto it = s->find(name); it != s->end()) return it->second;
    return Value::undefined(name);
  }

  void emit(std::string& out, const std::string& text) {
    QKV_CHECK(out.size() + text.size() <= kMaxOutput, "render: the output passed ", kMaxOutput >> 20, " MiB");
    out += text;
  }

  Flow exec(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text: emit(out, s.text); return Flow::Next;
      case Stmt::Kind::Output: emit(out, to_string(eval(*s.expr))); return Flow::Next;
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
      case Stmt::Kind::If:
        for (const auto& [cond, body] : s.branches)
          if (truthy(eval(*cond))) return run(body, out);
        return run(s.otherwise, out);
      case Stmt::Kind::For: exec_for(s, out); return Flow::Next;
      case Stmt::Kind::Set: {
        Value v = eval(*s.expr);
        if (s.attr.empty()) {
          scopes_.back()[s.text] = std::move(v);
          return Flow::Next;
        }
        Value ns = lookup(s.text);
        if (!ns.is_namespace) fail_at(s.line, "'" + s.text + "' is not a namespace: set " + s.text + "." + s.attr);
        try {
          ns.hold(v);  // ns's own depth is not kept (nothing holds a namespace): this checks v
        } catch (const Error& e) {
          fail_at(s.line, std::string(e.what()) + ": set " + s.text + "." + s.attr);
        }
        for (auto& [k, old] : *ns.dict)
          if (k.kind == Value::Kind::Str && k.s == s.attr) {
            old = std::move(v);
            return Flow::Next;
          }
        ns.dict->emplace_back(Value::str(s.attr), std::move(v));
        return Flow::Next;
      }
      case Stmt::Kind::SetBlock: {
        std::string text;
        run(s.body, text);
        scopes_.back()[s.text] = Value::str(std::move(text));
        return Flow::Next;
      }
      case Stmt::Kind::Macro: {
        const Stmt* def = &s;
        scopes_.back()[s.text] = Value::function([this, def](Args& a) { return call_macro(*def, a); });
        return Flow::Next;
      }
    }
    return Flow::Next;
  }

  void step(int line) {
    if (++steps_ > kMaxSteps) fail_at(line, "the template runs too long (" + std::to_string(kMaxSteps) + " steps)");
  }

  Value call_macro(const Stmt& def, Args& a) {
    step(def.line);
    QKV_CHECK(++depth_ <= kMaxDepth, "line ", def.line, ": macros call each other more than ", kMaxDepth, " deep");
    QKV_CHECK(a.positional.size() <= def.vars.size(), "line ", def.line, ": macro '", def.text, "' takes ",
              def.vars.size(), " arguments, got ", a.positional.size());
    Scope scope;
    for (size_t k = 0; k < def.vars.size(); ++k) {
      if (k < a.positional.size())
        scope[def.vars[k]] = a.positional[k];
      else if (def.defaults[k])
        scope[def.vars[k]] = eval(*def.defaults[k]);
      else
        scope[def.vars[k]] = Value::undefined(def.vars[k]);
    }
    for (auto& [k, v] : a.named) {
      QKV_CHECK(std::find(def.vars.begin(), def.vars.end(), k) != def.vars.end(), "line ", def.line, ": macro '",
                def.text, "' has no parameter '", k, "'");
      scope[k] = v;
    }
    scopes_.push_back(std::move(scope));
    std::string text;
    run(def.body, text);
    scopes_.pop_back();
    --depth_;
    return Value::str(std::move(text));
  }

  List iterate(const Value& v, int line) {
    switch (v.kind) {
      case Value::Kind::List: return *v.list;
      case Value::Kind::Dict: {
        List keys;
        for (const auto& [k, x] : *v.dict) keys.push_back(k);
        return keys;
      }
      case Value::Kind::Str: {  // its characters (UTF-8 sequences)
        List chars;
        for (size_t k = 0; k < v.s.size();) {
          size_t n = 1;
          const unsigned char c = (unsigned char)v.s[k];
          if (c >= 0xF0)
            n = 4;
          else if (c >= 0xE0)
            n = 3;
          else if (c >= 0xC0)
            n = 2;
          chars.push_back(Value::str(v.s.substr(k, n)));
          k += n;
        }
        return chars;
      }
      case Value::Kind::Undefined: return {};  // as jinja2's Undefined: an empty loop
      default: fail_at(line, std::string("cannot loop over ") + kind_name(v));
    }
  }

  void exec_for(const Stmt& s, std::string& out) {
    List items = iterate(eval(*s.expr), s.line);
    auto bind = [&](Scope& scope, const Value& item) {
      if (s.vars.size() == 1) {
        scope[s.vars[0]] = item;
        return;
      }
      const List parts = iterate(item, s.line);
      QKV_CHECK(parts.size() == s.vars.size(), "line ", s.line, ": cannot unpack ", parts.size(), " values into ",
                s.vars.size(), " loop variables");
      for (size_t k = 0; k < parts.size(); ++k) scope[s.vars[k]] = parts[k];
    };
    if (s.filter) {  // "for x in xs if cond": the loop runs over those that pass
      List kept;
      for (const Value& item : items) {
        step(s.line);
        scopes_.emplace_back();
        bind(scopes_.back(), item);
        const bool keep = truthy(eval(*s.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      run(s.otherwise, out);
      return;
    }
    const int64_t n = (int64_t)items.size();
    for (int64_t k = 0; k < n; ++k) {
      step(s.line);
      scopes_.emplace_back();
      Scope& scope = scopes_.back();
      bind(scope, items[(size_t)k]);
      if (loop_variable_) {
        Dict fields;
        for (auto& [name, value] : std::initializer_list<std::pair<const char*, Value>>{
                 {"index", Value::integer(k + 1)},
                 {"index0", Value::integer(k)},
                 {"revindex", Value::integer(n - k)},
                 {"revindex0", Value::integer(n - k - 1)},
                 {"first", Value::boolean(k == 0)},
                 {"last", Value::boolean(k == n - 1)},
                 {"length", Value::integer(n)},
                 {"previtem", k > 0 ? items[(size_t)k - 1] : Value::undefined("previtem")},
                 {"nextitem", k + 1 < n ? items[(size_t)k + 1] : Value::undefined("nextitem")}})
          fields.emplace_back(Value::str(name), value);
        scope["loop"] = Value::of_dict(std::move(fields));
      }
      const Flow f = run(s.body, out);
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
  }

  Args arguments(const Expr& e, size_t first) {
    Args a;
    for (size_t k = first; k < e.items.size(); ++k) a.positional.push_back(eval(*e.items[k]));
    for (const auto& [name, x] : e.named) a.named.emplace_back(name, eval(*x));
    return a;
  }

  Value attribute(const Value& obj, const std::string& name, int line) {
    if (!obj.defined()) fail_at(line, "'" + obj.s + "' is undefined (reading ." + name + ")");
    if (obj.kind == Value::Kind::Dict) {
      if (const Value* v = obj.find(name)) return *v;
    }
    if (Value m = method(obj, name); m.defined()) return m;
    return Value::undefined(name);
  }

  Value item(const Value& obj, const Value& key, int line) {
    if (!obj.defined()) fail_at(line, "'" + obj.s + "' is undefined (reading an item)");
    if (obj.kind == Value::Kind::List || obj.kind == Value::Kind::Str) {
      if (key.kind != Value::Kind::Int)
        fail_at(line, std::string("an index must be an integer, got ") + kind_name(key));
      const int64_t n = obj.kind == Value::Kind::List ? (int64_t)obj.list->size() : (int64_t)obj.s.size();
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value::undefined("[" + std::to_string(key.i) + "]");
      return obj.kind == Value::Kind::List ? (*obj.list)[(size_t)k] : Value::str(obj.s.substr((size_t)k, 1));
    }
    if (obj.kind == Value::Kind::Dict) {
      if (const Value* v = obj.find(key)) return *v;
      return Value::undefined(key.kind == Value::Kind::Str ? key.s : "[" + repr(key) + "]");
    }
    return Value::undefined("[?]");
  }

  Value slice(const Value& obj, const Expr& e) {
    auto bound = [&](size_t k) -> std::optional<int64_t> {  // none when left out or none
      if (!e.items[k]) return std::nullopt;
      const Value v = eval(*e.items[k]);
      if (v.kind == Value::Kind::None) return std::nullopt;
      if (v.kind != Value::Kind::Int) fail_at(e.line, "a slice bound must be an integer");
      return v.i;
    };
    const int64_t step = bound(3).value_or(1);
    if (step == 0) fail_at(e.line, "a slice step of 0");
    List src;
    if (obj.kind == Value::Kind::List)
      src = *obj.list;
    else if (obj.kind == Value::Kind::Str)
      src = iterate(obj, e.line);
    else
      fail_at(e.line, std::string("cannot slice ") + kind_name(obj));
    const int64_t n = (int64_t)src.size();
    auto clamp = [&](int64_t x) {  // as Python clamps a slice's bounds
      if (x < 0) x += n;
      return step > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
    };
    const std::optional<int64_t> from = bound(1), to = bound(2);
    const int64_t start = from ? clamp(*from) : (step > 0 ? 0 : n - 1);
    const int64_t stop = to ? clamp(*to) : (step > 0 ? n : -1);
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
      out.push_back(src[(size_t)k]);
      if (__builtin_add_overflow(k, step, &k)) break;  // a step past 64 bits leaves the bounds
    }
    if (obj.kind == Value::Kind::Str) {
      std::string s;
      for (const Value& c : out) s += c.s;
      return Value::str(s);
    }
    return Value::of_list(std::move(out));
  }

  static std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
    size_t a = 0, b = s.size();
    auto strip = [&](char c) { return chars.empty() ? is_space(c) : chars.find(c) != std::string::npos; };
    if (left)
      while (a < b && strip(s[a])) ++a;
    if (right)
      while (b > a && strip(s[b - 1])) --b;
    return s.substr(a, b - a);
  }

  static std::string replace_all(std::string s, const std::string& from, const std::string& to, int64_t count = -1) {
    if (from.empty()) return s;
    size_t at = 0;
    for (int64_t n = 0; (count < 0 || n < count) && (at = s.find(from, at)) != std::string::npos; ++n) {
      s.replace(at, from.size(), to);
      at += to.size();
    }
    return s;
  }

  static std::string title_case(const std::string& s, bool only_first) {
    std::string out = s;
    bool start = true;
    for (size_t k = 0; k < out.size(); ++k) {
      const unsigned char c = (unsigned char)out[k];
      if (std::isalpha(c)) {
        out[k] = start ? (char)std::toupper(c) : (char)std::tolower(c);
        start = false;
      } else {
        if (!only_first) start = !std::isalnum(c);
      }
    }
    return out;
  }

  static std::string lower(std::string s) {
    for (char& c : s) c = (char)std::tolower((unsigned char)c);
    return s;
  }
  static std::string upper(std::string s) {
    for (char& c : s) c = (char)std::toupper((unsigned char)c);
    return s;
  }

  static const Value& arg(Args& a, size_t k, const char* what) {
    QKV_CHECK(k < a.positional.size(), what, ": missing argument ", k + 1);
    return a.positional[k];
  }
  static std::string str_arg(Args& a, size_t k, const char* what) {
    const Value& v = arg(a, k, what);
    QKV_CHECK(v.kind == Value::Kind::Str, what, ": argument ", k + 1, " must be a string, got ", kind_name(v));
    return v.s;
  }

  // A bound method of a string or a dict, or undefined.
  Value method(const Value& obj, const std::string& name) {
    if (obj.kind == Value::Kind::Str) {
      const std::string s = obj.s;
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return Value::function([s, name](Args& a) {
          const std::string chars = a.positional.empty() || a.positional[0].kind == Value::Kind::None
                                        ? std::string()
                                        : str_arg(a, 0, "strip");
          return Value::str(strip_chars(s, chars, name != "rstrip", name != "lstrip"));
        });
      if (name == "startswith" || name == "endswith")
        return Value::function([s, name](Args& a) {
          const Value& p = arg(a, 0, name.c_str());
          List options = p.kind == Value::Kind::List ? *p.list : List{p};
          for (const Value& o : options) {
            QKV_CHECK(o.kind == Value::Kind::Str, name, ": expects a string");
            const bool hit = name == "startswith"
                                 ? s.rfind(o.s, 0) == 0
                                 : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0;
            if (hit) return Value::boolean(true);
          }
          return Value::boolean(false);
        });
      if (name == "format")  // "{}", "{0}", "{name}" and "{{" "}}"; no format specs
        return Value::function([s](Args& a) {
          std::string out;
          size_t next_auto = 0;
          for (size_t i = 0; i < s.size(); ++i) {
            const char c = s[i];
            if ((c == '{' || c == '}') && i + 1 < s.size() && s[i + 1] == c) {
              out += c, ++i;
              continue;
            }
            QKV_CHECK(c != '}', "format: a single '}' in ", s);
            if (c != '{') {
              out += c;
              continue;
            }
            const size_t end = s.find('}', i);
            QKV_CHECK(end != std::string::npos, "format: a '{' without its '}' in ", s);
            const std::string field = s.substr(i + 1, end - i - 1);
            QKV_CHECK(field.find_first_of(":!.[") == std::string::npos, "format: the field '{", field,
                      "}' (qkv's format takes {}, {N} and {name}, without specs)");
            const Value* v = nullptr;
            if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
              QKV_CHECK(field.size() <= 9, "format: no argument ", field, " for ", s);
              const size_t k = field.empty() ? next_auto++ : std::stoul(field);
              QKV_CHECK(k < a.positional.size(), "format: no argument ", k, " for ", s);
              v = &a.positional[k];
            } else {
              for (auto& [key, x] : a.named)
                if (key == field) v = &x;
              QKV_CHECK(v != nullptr, "format: no argument '", field, "' for ", s);
            }
            out += to_string(*v);
            i = end;
          }
          return Value::str(out);
        });
      if (name == "split")
        return Value::function([s](Args& a) {
          List parts;
          if (a.positional.empty() || a.positional[0].kind == Value::Kind::None) {
            std::istringstream in(s);
            std::string w;
            while (in >> w) parts.push_back(Value::str(w));
          } else {
            const std::string sep = str_arg(a, 0, "split");
            QKV_CHECK(!sep.empty(), "split: an empty separator");
            size_t at = 0, next;
            while ((next = s.find(sep, at)) != std::string::npos) {
              parts.push_back(Value::str(s.substr(at, next - at)));
              at = next + sep.size();
            }
            parts.push_back(Value::str(s.substr(at)));
          }
          return Value::of_list(std::move(parts));
        });
      if (name == "upper") return Value::function([s](Args&) { return Value::str(upper(s)); });
      if (name == "lower") return Value::function([s](Args&) { return Value::str(lower(s)); });
      if (name == "title") return Value::function([s](Args&) { return Value::str(title_case(s, false)); });
      if (name == "capitalize") return Value::function([s](Args&) { return Value::str(title_case(lower(s), true)); });
      if (name == "replace")
        return Value::function([s](Args& a) {
          const int64_t count =
              a.positional.size() > 2 && a.positional[2].kind == Value::Kind::Int ? a.positional[2].i : -1;
          return Value::str(replace_all(s, str_arg(a, 0, "replace"), str_arg(a, 1, "replace"), count));
        });
    }
    if (obj.kind == Value::Kind::Dict && !obj.is_namespace) {
      const Value d = obj;
      if (name == "get")
        return Value::function([d](Args& a) {
          if (const Value* v = d.find(arg(a, 0, "get"))) return *v;
          return a.positional.size() > 1 ? a.positional[1] : Value::none();
        });
      if (name == "items")
        return Value::function([d](Args&) {
          List l;
          for (const auto& [k, v] : *d.dict) l.push_back(key_value(k, v));
          return Value::of_list(std::move(l));
        });
      if (name == "keys")
        return Value::function([d](Args&) {
          List l;
          for (const auto& [k, v] : *d.dict) l.push_back(k);
          return Value::of_list(std::move(l));
        });
      if (name == "values")
        return Value::function([d](Args&) {
          List l;
          for (const auto& [k, v] : *d.dict) l.push_back(v);
          return Value::of_list(std::move(l));
        });
    }
    return Value::undefined(name);
  }

  int64_t length(const Value& v, int line) {
    switch (v.kind) {
      case Value::Kind::Str: return (int64_t)iterate(v, line).size();
      case Value::Kind::List: return (int64_t)v.list->size();
      case Value::Kind::Dict: return (int64_t)v.dict->size();
      case Value::Kind::Undefined: return 0;
      default: fail_at(line, std::string("length of ") + kind_name(v));
    }
  }

  bool test(const std::string& name, const Value& v, Args& a, int line) {
    if (name == "defined") return v.defined();
    if (name == "undefined") return !v.defined();
    if (name == "none") return v.kind == Value::Kind::None;
    if (name == "string") return v.kind == Value::Kind::Str;
    if (name == "number") return v.kind == Value::Kind::Int || v.kind == Value::Kind::Float;
    if (name == "integer") return v.kind == Value::Kind::Int;
    if (name == "float") return v.kind == Value::Kind::Float;
    if (name == "boolean") return v.kind == Value::Kind::Bool;
    if (name == "true") return v.kind == Value::Kind::Bool && v.b;
    if (name == "false") return v.kind == Value::Kind::Bool && !v.b;
    if (name == "mapping") return v.kind == Value::Kind::Dict;
    if (name == "sequence")
      return v.kind == Value::Kind::List || v.kind == Value::Kind::Str || v.kind == Value::Kind::Dict;
    if (name == "iterable")
      return v.kind == Value::Kind::List || v.kind == Value::Kind::Str || v.kind == Value::Kind::Dict;
    if (name == "callable") return v.kind == Value::Kind::Function;
    if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return equal(v, arg(a, 0, "equalto"));
    if (name == "ne" || name == "!=") return !equal(v, arg(a, 0, "ne"));
    if (name == "in") return contains(arg(a, 0, "in"), v, line);
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (v.kind != Value::Kind::Int) fail_at(line, "'" + name + "' tests an integer, got " + kind_name(v));
      if (name == "odd") return v.i % 2 != 0;
      if (name == "even") return v.i % 2 == 0;
      const Value& d = arg(a, 0, "divisibleby");
      if (d.kind != Value::Kind::Int || d.i == 0) fail_at(line, "divisibleby takes a nonzero integer");
      return v.i % d.i == 0;
    }
    fail_at(line, "the test '" + name + "' is not supported");
  }

  bool contains(const Value& container, const Value& x, int line) {
    switch (container.kind) {
      case Value::Kind::Str:
        if (x.kind != Value::Kind::Str) fail_at(line, "'in <string>' needs a string on the left");
        return container.s.find(x.s) != std::string::npos;
      case Value::Kind::List:
        return std::any_of(container.list->begin(), container.list->end(), [&](const Value& e) { return equal(e, x); });
      case Value::Kind::Dict: return container.find(x) != nullptr;
      case Value::Kind::Undefined: return false;  // jinja2's Undefined: an empty container
      default: fail_at(line, std::string("'in' ") + kind_name(container));
    }
  }

  Value filter(const std::string& name, const Value& v, Args& a, int line) {
    if (name == "trim") {
      const std::string chars = a.positional.empty() ? "" : str_arg(a, 0, "trim");
      return like(v, strip_chars(to_string(v), chars, true, true));
    }
    if (name == "length" || name == "count") return Value::integer(length(v, line));
    if (name == "tojson") {
      int indent = 0;
      for (auto& [k, x] : a.named)
        if (k == "indent" && x.kind == Value::Kind::Int) indent = (int)std::clamp<int64_t>(x.i, 0, 64);
      if (!a.positional.empty() && a.positional[0].kind == Value::Kind::Int)
        indent = (int)std::clamp<int64_t>(a.positional[0].i, 0, 64);
      std::string out;
      dump_json(to_json(v), indent, 0, out);
      return Value::str(out);  // (transformers' own tojson: a plain string, not jinja2's Markup)
    }
    // (Markup's own methods return Markup: a Markup stays one through these.)
    if (name == "upper") return like(v, upper(to_string(v)));
    if (name == "lower") return like(v, lower(to_string(v)));
    if (name == "capitalize") return like(v, title_case(lower(to_string(v)), true));
    if (name == "title") return like(v, title_case(to_string(v), false));
    if (name == "string") return like(v, to_string(v));
    if (name == "safe") return v.defined() ? markup(Value::str(to_string(v))) : v;
    if (name == "default" || name == "d") {
      const bool boolean = a.positional.size() > 1 && truthy(a.positional[1]);
      if (boolean ? !truthy(v) : !v.defined()) return a.positional.empty() ? Value::str("") : a.positional[0];
      return v;
    }
    if (name == "first" || name == "last") {
      List l = iterate(v, line);
      if (l.empty()) return Value::undefined(name);
      return name == "first" ? l.front() : l.back();
    }
    if (name == "list") return Value::of_list(iterate(v, line));
    if (name == "reverse") {
      if (v.kind == Value::Kind::Str) {
        List l = iterate(v, line);
        std::string s;
        for (auto it = l.rbegin(); it != l.rend(); ++it) s += it->s;
        return Value::str(s);
      }
      List l = iterate(v, line);
      std::reverse(l.begin(), l.end());
      return Value::of_list(std::move(l));
    }
    if (name == "join") {
      const std::string sep = a.positional.empty() ? "" : to_string(a.positional[0]);
      std::string attr;
      for (auto& [k, x] : a.named)
        if (k == "attribute") attr = to_string(x);
      std::string out;
      bool first = true;
      for (const Value& e : iterate(v, line)) {
        out += (first ? "" : sep) + to_string(attr.empty() ? e : attribute(e, attr, line));
        first = false;
      }
      return Value::str(out);
    }
    if (name == "items") {
      if (v.kind != Value::Kind::Dict) fail_at(line, std::string("items of ") + kind_name(v));
      List l;
      for (const auto& [k, x] : *v.dict) l.push_back(key_value(k, x));
      return Value::of_list(std::move(l));
    }
    if (name == "int") {
      if (v.kind == Value::Kind::Int) return v;
      if (v.kind == Value::Kind::Float) {
        // Python's int() of a float: toward zero; beyond 64 bits (or inf, nan) qkv has no such integer.
        if (!(std::abs(v.f) < 0x1p63)) fail_at(line, "int of " + format_float(v.f) + ": past 64 bits");
        return Value::integer((int64_t)v.f);
      }
      if (v.kind == Value::Kind::Bool) return Value::integer(v.b);
      if (v.kind == Value::Kind::Str) {
        char* end = nullptr;
        const long long x = std::strtoll(v.s.c_str(), &end, 10);
        return Value::integer(end && *end == 0 && !v.s.empty() ? x : 0);
      }
      return Value::integer(0);
    }
    if (name == "float") {
      if (v.is_number()) return Value::real(v.number());
      if (v.kind == Value::Kind::Str) return Value::real(std::strtod(v.s.c_str(), nullptr));
      return Value::real(0);
    }
    if (name == "replace")
      return Value::str(replace_all(to_string(v), str_arg(a, 0, "replace"), str_arg(a, 1, "replace")));
    if (name == "unique") {
      List out;
      for (const Value& e : iterate(v, line))
        if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equal(o, e); })) out.push_back(e);
      return Value::of_list(std::move(out));
    }
    if (name == "sort") {
      List l = iterate(v, line);
      std::string attr;
      bool reverse = false;
      for (auto& [k, x] : a.named) {
        if (k == "attribute") attr = to_string(x);
        if (k == "reverse") reverse = truthy(x);
      }
      auto key = [&](const Value& e) { return attr.empty() ? e : attribute(e, attr, line); };
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
        return less(key(x), key(y), line) != reverse && !equal(key(x), key(y));
      });
      return Value::of_list(std::move(l));
    }
    // jinja2 skips a false value (none, an empty list) in these, whatever its kind.
    if ((name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject" || name == "map") &&
        !truthy(v))
      return Value::of_list({});
    if (name == "dictsort") {  // [key, value] pairs by key (or by="value"), strings without case by default
      if (v.kind != Value::Kind::Dict) fail_at(line, std::string("dictsort of ") + kind_name(v));
      bool case_sensitive = false, by_value = false, reverse = false;
      if (!a.positional.empty()) case_sensitive = truthy(a.positional[0]);
      if (a.positional.size() > 1) by_value = to_string(a.positional[1]) == "value";
      if (a.positional.size() > 2) reverse = truthy(a.positional[2]);
      for (auto& [k, x] : a.named) {
        if (k == "case_sensitive") case_sensitive = truthy(x);
        if (k == "by") by_value = to_string(x) == "value";
        if (k == "reverse") reverse = truthy(x);
      }
      List l;
      for (const auto& [k, x] : *v.dict) l.push_back(key_value(k, x));
      auto key = [&](const Value& pair) {
        const Value& x = (*pair.list)[by_value ? 1 : 0];
        return !case_sensitive && x.kind == Value::Kind::Str ? Value::str(lower(x.s)) : x;
      };
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
        return reverse ? less(key(y), key(x), line) : less(key(x), key(y), line);
      });
      return Value::of_list(std::move(l));
    }
    if (name == "min" || name == "max") {  // strings compared without case unless case_sensitive
      bool case_sensitive = false;
      std::string attr;
      for (auto& [k, x] : a.named) {
        if (k == "case_sensitive") case_sensitive = truthy(x);
        if (k == "attribute") attr = to_string(x);
      }
      const List l = iterate(v, line);
      if (l.empty()) return Value::undefined(name);
      auto key = [&](const Value& e) {
        const Value x = attr.empty() ? e : attribute(e, attr, line);
        return !case_sensitive && x.kind == Value::Kind::Str ? Value::str(lower(x.s)) : x;
      };
      const Value* best = &l.front();
      for (const Value& e : l)
        if (name == "min" ? less(key(e), key(*best), line) : less(key(*best), key(e), line)) best = &e;
      return *best;
    }
    if (name == "indent") {  // the lines after the first (with first=true, it too); blank lines left alone
      Value width = Value::integer(4);
      bool first = false, blank = false;
      if (!a.positional.empty()) width = a.positional[0];
      if (a.positional.size() > 1) first = truthy(a.positional[1]);
      if (a.positional.size() > 2) blank = truthy(a.positional[2]);
      for (auto& [k, x] : a.named) {
        if (k == "width") width = x;
        if (k == "first") first = truthy(x);
        if (k == "blank") blank = truthy(x);
      }
      std::string pad;
      if (width.kind == Value::Kind::Str)
        pad = width.s;
      else if (width.kind == Value::Kind::Int)
        pad.assign((size_t)std::clamp<int64_t>(width.i, 0, 1024), ' ');
      else
        fail_at(line, "indent's width must be a number or a string");
      // The text's lines at each "\n" (jinja2 adds a newline, then splitlines: the same pieces).
      const std::string s = to_string(v);
      std::vector<std::string> lines;
      for (size_t at = 0;;) {
        const size_t nl = s.find('\n', at);
        lines.push_back(s.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
        if (nl == std::string::npos) break;
        at = nl + 1;
      }
      std::string out = lines[0];
      for (size_t i = 1; i < lines.size(); ++i) out += "\n" + (blank || !lines[i].empty() ? pad : "") + lines[i];
      return Value::str(first ? pad + out : out);
    }
    // The items (select, reject) or the dicts whose attribute (selectattr,
    // rejectattr: its name first) pass a test: its name and arguments next;
    // without one, that are true.
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attribute = name.ends_with("attr");
      const size_t at = by_attribute ? 1 : 0;  // where the test's name is
      const std::string attr = by_attribute ? str_arg(a, 0, name.c_str()) : "";
      List out;
      for (const Value& e : iterate(v, line)) {
        const Value x = !by_attribute                 ? e
                        : e.kind == Value::Kind::Dict ? attribute(e, attr, line)
                                                      : Value::undefined(attr);
        bool pass;
        if (a.positional.size() <= at) {
          pass = truthy(x);
        } else {
          Args rest;
          rest.positional.assign(a.positional.begin() + (std::ptrdiff_t)at + 1, a.positional.end());
          pass = test(str_arg(a, at, name.c_str()), x, rest, line);
        }
        if (pass == name.starts_with("select")) out.push_back(e);
      }
      return Value::of_list(std::move(out));
    }
    if (name == "map") {
      std::string attr;
      for (auto& [k, x] : a.named)
        if (k == "attribute") attr = to_string(x);
      List out;
      for (const Value& e : iterate(v, line)) {
        if (!attr.empty()) {
          out.push_back(attribute(e, attr, line));
        } else {
          Args rest;
          rest.positional.assign(a.positional.begin() + (a.positional.empty() ? 0 : 1), a.positional.end());
          out.push_back(filter(str_arg(a, 0, "map"), e, rest, line));
        }
      }
      return Value::of_list(std::move(out));
    }
    fail_at(line, "the filter '" + name + "' is not supported");
  }

  bool less(const Value& x, const Value& y, int line) {
    if (x.is_number() && y.is_number()) return x.number() < y.number();
    if (x.kind == Value::Kind::Str && y.kind == Value::Kind::Str) return x.s < y.s;
    fail_at(line, std::string("cannot order ") + kind_name(x) + " and " + kind_name(y));
  }

  // `text` as a string, Markup when `from` is (as Markup's methods return).
  static Value like(const Value& from, std::string text) {
    Value out = Value::str(std::move(text));
    out.markup = from.kind == Value::Kind::Str && from.markup;
    return out;
  }
  static Value markup(Value v) {
    v.markup = true;
    return v;
  }
  // markupsafe's escape of a plain string: & < > ' " as HTML entities.
  static std::string html_escaped(const std::string& x) {
    std::string out;
    for (char c : x) switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '\'': out += "&#39;"; break;
        case '"': out += "&#34;"; break;
        default: out += c;
      }
    return out;
  }

  Value arithmetic(const std::string& op, const Value& l, const Value& r, int line) {
    // (jinja2 joins `~` as plain strings when autoescape is off, as in transformers.)
    if (op == "~") return Value::str(to_string(l) + to_string(r));
    if (op == "+") {
      if (l.kind == Value::Kind::Str && r.kind == Value::Kind::Str) {
        if (!l.markup && !r.markup) return Value::str(l.s + r.s);
        return markup(Value::str((l.markup ? l.s : html_escaped(l.s)) + (r.markup ? r.s : html_escaped(r.s))));
      }
      if (l.kind == Value::Kind::List && r.kind == Value::Kind::List) {
        List out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return Value::of_list(std::move(out));
      }
    }
    if (op == "*" && l.kind == Value::Kind::Str && r.kind == Value::Kind::Int) {
      QKV_CHECK(r.i <= 0 || l.s.empty() || r.i <= (int64_t)kMaxOutput / (int64_t)l.s.size(), "line ", line,
                ": a string too long");
      std::string out;
      for (int64_t k = 0; k < r.i; ++k) out += l.s;
      return Value::str(out);
    }
    if (!l.is_number() || !r.is_number()) fail_at(line, "'" + op + "' of " + kind_name(l) + " and " + kind_name(r));
    const bool ints = l.kind != Value::Kind::Float && r.kind != Value::Kind::Float;
    if (ints && op != "/")
      return integer_arithmetic(op, l.kind == Value::Kind::Bool ? l.b : l.i, r.kind == Value::Kind::Bool ? r.b : r.i,
                                line);
    const double a = l.number(), b = r.number();
    if (op == "/") {
      if (b == 0) fail_at(line, "division by zero");
      return Value::real(a / b);
    }
    if (op == "//" || op == "%") {
      if (b == 0) fail_at(line, "division by zero");
      const double q = std::floor(a / b);
      return Value::real(op == "//" ? q : a - q * b);
    }
    if (op == "**") return Value::real(std::pow(a, b));
    return Value::real(op == "+" ? a + b : op == "-" ? a - b : a * b);
  }

  // +, -, *, //, % and ** of two integers, exactly (Python's floor division
  // and modulo; a negative power is a float). Python's integers have no
  // bound; past 64 bits here is an error, never a wrapped number.
  static Value integer_arithmetic(const std::string& op, int64_t x, int64_t y, int line) {
    int64_t out = 0;
    bool overflow = false;
    if (op == "+") {
      overflow = __builtin_add_overflow(x, y, &out);
    } else if (op == "-") {
      overflow = __builtin_sub_overflow(x, y, &out);
    } else if (op == "*") {
      overflow = __builtin_mul_overflow(x, y, &out);
    } else if (op == "//" || op == "%") {
      if (y == 0) fail_at(line, "division by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) {
        overflow = op == "//";  // (the remainder is 0)
      } else {
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;  // Python floors
        out = op == "//" ? q : m;
      }
    } else {  // **, by squaring
      if (y < 0) return Value::real(std::pow((double)x, (double)y));
      out = 1;
      for (int64_t base = x, e = y; e > 0 && !overflow;) {
        if (e & 1) overflow = __builtin_mul_overflow(out, base, &out);
        // A square past 64 bits is a factor of the result (|base| >= 2 then) while e has bits left.
        if ((e >>= 1) > 0 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
      }
    }
    if (overflow) fail_at(line, "integer overflow: '" + op + "' past 64 bits");
    return Value::integer(out);
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: return lookup(e.name);
      case Expr::Kind::Attr: return attribute(eval(*e.items[0]), e.name, e.line);
      case Expr::Kind::Index: return item(eval(*e.items[0]), eval(*e.items[1]), e.line);
      case Expr::Kind::Slice: return slice(eval(*e.items[0]), e);
      case Expr::Kind::Call: {
        const Value f = eval(*e.items[0]);
        if (f.kind != Value::Kind::Function)
          fail_at(e.line, (f.defined() ? std::string("cannot call ") + kind_name(f) : "'" + f.s + "' is undefined") +
                              (e.items[0]->kind == Expr::Kind::Attr ? " (." + e.items[0]->name + ")" : ""));
        Args a = arguments(e, 1);
        return (*f.fn)(a);
      }
      case Expr::Kind::Filter: {
        const Value v = eval(*e.items[0]);
        Args a = arguments(e, 1);
        return filter(e.name, v, a, e.line);
      }
      case Expr::Kind::Test: {
        const Value v = eval(*e.items[0]);
        Args a = arguments(e, 1);
        return Value::boolean(test(e.name, v, a, e.line) != e.negated);
      }
      case Expr::Kind::Not: return Value::boolean(!truthy(eval(*e.items[0])));
      case Expr::Kind::Neg: {
        const Value v = eval(*e.items[0]);
        if (v.kind == Value::Kind::Int) {
          if (v.i == std::numeric_limits<int64_t>::min()) fail_at(e.line, "integer overflow: '-' past 64 bits");
          return Value::integer(-v.i);
        }
        if (v.kind == Value::Kind::Float) return Value::real(-v.f);
        fail_at(e.line, std::string("'-' of ") + kind_name(v));
      }
      case Expr::Kind::And: {
        Value l = eval(*e.items[0]);
        return truthy(l) ? eval(*e.items[1]) : l;
      }
      case Expr::Kind::Or: {
        Value l = eval(*e.items[0]);
        return truthy(l) ? l : eval(*e.items[1]);
      }
      case Expr::Kind::Cond:
        if (truthy(eval(*e.items[1]))) return eval(*e.items[0]);
        return e.items.size() > 2 ? eval(*e.items[2]) : Value::undefined("");
      case Expr::Kind::ListLit:
      case Expr::Kind::TupleLit: {
        List l;
        for (const auto& x : e.items) l.push_back(eval(*x));
        Value v = Value::of_list(std::move(l));
        v.is_tuple = e.kind == Expr::Kind::TupleLit;
        return v;
      }
      case Expr::Kind::DictLit: {
        Dict d;
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
          const Value key = eval(*e.items[k]);
          if (key.kind != Value::Kind::Str && !key.is_number() && key.kind != Value::Kind::None)
            fail_at(e.line, std::string("a dict key must be a string, a number or none, got ") + kind_name(key));
          Value value = eval(*e.items[k + 1]);
          const auto same = std::find_if(d.begin(), d.end(), [&](const auto& kv) { return equal(kv.first, key); });
          if (same != d.end()) {
            same->second = std::move(value);  // a key given twice: the last value, in the first place
          } else {
            d.emplace_back(key, std::move(value));
          }
        }
        return Value::of_dict(std::move(d));
      }
      case Expr::Kind::Binary: {
        const Value l = eval(*e.items[0]), r = eval(*e.items[1]);
        const std::string& op = e.name;
        if (op == "==") return Value::boolean(equal(l, r));
        if (op == "!=") return Value::boolean(!equal(l, r));
        if (op == "<") return Value::boolean(less(l, r, e.line));
        if (op == ">") return Value::boolean(less(r, l, e.line));
        if (op == "<=") return Value::boolean(!less(r, l, e.line));
        if (op == ">=") return Value::boolean(!less(l, r, e.line));
        if (op == "in") return Value::boolean(contains(r, l, e.line));
        if (op == "not in") return Value::boolean(!contains(r, l, e.line));
        return arithmetic(op, l, r, e.line);
      }
    }
    return Value();
  }

  std::vector<Scope> scopes_;
  int depth_ = 0;
  int64_t steps_ = 0;
  bool loop_variable_ = true;
};

}  // namespace detail

struct Template::Impl {
  detail::Body body;
  bool reads_loop = true;
};

Template::Template(const std::string& source) : impl_(std::make_unique<Impl>()) {
  // One newline at the very end is dropped, as jinja2 drops it (keep_trailing_newline false).
  std::string text = source;
  if (text.ends_with("\r\n"))
    text.resize(text.size() - 2);
  else if (text.ends_with('\n'))
    text.pop_back();
  detail::Parser parser(detail::split(text));
  impl_->body = parser.parse_all();
  impl_->reads_loop = parser.reads_loop();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context) const {
  detail::Renderer r(context, impl_->reads_loop);
  std::string out;
  r.run(impl_->body, out);
  return out;
}

}  // namespace qkv::jinja
