// A Hugging Face tokenizer.json, read as the `tokenizers` library runs it:
//
//   text -> added tokens split out -> normalizer -> pre-tokenizer -> model (BPE)
//        -> post-processor (the ids around the text); ids -> decoder -> text
//
// Read here: normalizers NFC/NFD/NFKC/NFKD (utf8proc), Prepend, Replace,
// BertNormalizer, Lowercase, StripAccents, Precompiled and Sequence; pre-tokenizers
// ByteLevel (GPT-2's byte-to-character table and, with use_regex, its split
// pattern), Split (a regex run by PCRE2, or a string), Metaspace,
// BertPreTokenizer and Sequence; the models BPE (merges by rank,
// ignore_merges, unk_token, byte_fallback), WordPiece (longest match
// first, "##" continuations) and Unigram (Viterbi over piece scores);
// post-processors ByteLevel, TemplateProcessing, BertProcessing,
// RobertaProcessing and Sequence; the decoders ByteLevel, ByteFallback,
// Replace, Fuse, Strip, Metaspace, WordPiece and Sequence (byte-level BPE as
// GPT-2, Llama 3 and Qwen2 use it; SentencePiece BPE with byte fallback as
// Llama 2 and Mistral do; WordPiece as BERT does; SentencePiece's Unigram
// behind its compiled normalization rules as T5 and XLM-R do).
// Anything else is one error naming the field, never a different tokenizer.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "qkv/base64.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/tokenizer.h"
#include "qkv/utf8.h"
#include "src/config/fields.h"
#include "src/core/json.h"

namespace qkv {
namespace {

using Json = nlohmann::json;

// ---------------------------------------------------------------- Unicode --

// The length in bytes of the character that ends at s[i - 1] (s is valid UTF-8, i > 0).
size_t char_before(const std::string& s, size_t i) {
  size_t k = 1;
  while (k < i && ((uint8_t)s[i - k] & 0xC0) == 0x80) ++k;
  return k;
}

// The text in a Unicode normalization form: utf8proc's `options` (NFC:
// COMPOSE, NFD: DECOMPOSE, with COMPAT for NFKC and NFKD).
std::string utf8proc_normalize(const std::string& s, int options) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t*)s.data(), (utf8proc_ssize_t)s.size(), &out,
                                          (utf8proc_option_t)(UTF8PROC_STABLE | options));
  QKV_CHECK(n >= 0, "tokenizer: cannot normalize the text (", utf8proc_errmsg(n), ")");
  std::string r((const char*)out, (size_t)n);
  std::free(out);
  return r;
}

void append_utf8(std::string& out, uint32_t cp) {
  utf8proc_uint8_t buf[4];
  out.append((const char*)buf, (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, buf));
}

// Unicode White_Space, what Rust's char::is_whitespace (and so `tokenizers`) tests.
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// Unicode punctuation (P*), what Rust's is_punctuation tests, or ASCII punctuation.
bool is_punctuation(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
                        (cp >= 0x7B && cp <= 0x7E);
  const utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

bool is_alphanumeric(uint32_t cp) {
  const utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

// GPT-2's table: the printable bytes ! .. ~, ¡ .. ¬ and ® .. ÿ stand for
// themselves; the other 68 bytes take the code points from U+0100 on, in byte
// order. Every byte becomes one visible character, so BPE works on text.
struct ByteTable {
  std::string to_char[256];
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteTable() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? (uint32_t)b : next++;
      append_utf8(to_char[b], cp);
      to_byte[cp] = (uint8_t)b;
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

// A pattern as `tokenizers` runs it (Oniguruma), compiled by PCRE2 with
// Unicode properties. One difference matters in the patterns these files
// use: PCRE2's \s matches U+180E (Mongolian vowel separator, white space
// before Unicode 6.3) and Oniguruma's does not. So \s becomes
// (?:(?!\x{180E})\s), \S (?:\x{180E}|\S), a class with \s in it
// (?:(?!\x{180E})[...]) and a negated one (?:\x{180E}|[^...]). The parity
// text has U+180E in it.
std::string pcre2_pattern(const std::string& onig) {
  std::string out;
  for (size_t i = 0; i < onig.size(); ++i) {
    const char c = onig[i];
    if (c == '\\' && i + 1 < onig.size()) {
      const char e = onig[++i];
      if (e == 's') out += "(?:(?!\\x{180E})\\s)";
      else if (e == 'S') out += "(?:\\x{180E}|\\S)";
      else out += c, out += e;
    } else if (c == '[') {
      size_t end = i + 1;
      if (end < onig.size() && onig[end] == '^') ++end;
      if (end < onig.size() && onig[end] == ']') ++end;  // a leading ] is a character
      bool space = false, nested = false;
      for (; end < onig.size() && onig[end] != ']'; ++end) {
        if (onig[end] == '[') nested = true;
        if (onig[end] == '\\' && end + 1 < onig.size()) space |= onig[++end] == 's';
      }
      const std::string cls = onig.substr(i, end + 1 - i);
      if (!space || nested || end >= onig.size()) out += cls;
      else if (cls[1] == '^') out += "(?:\\x{180E}|" + cls + ")";
      else out += "(?:(?!\\x{180E})" + cls + ")";
      i = end;
    } else {
      out += c;
    }
  }
  return out;
}

class Regex {
public:
  Regex(const std::string& pattern, const std::string& source) {
    int code = 0;
    PCRE2_SIZE at = 0;
    const std::string p = pcre2_pattern(pattern);
    code_ = pcre2_compile((PCRE2_SPTR)p.data(), p.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &code, &at,
                          nullptr);
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(code, message, sizeof message);
      fail(source, ": the pattern '", pattern, "' does not compile (", (const char*)message, " at ", at, ")");
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // faster where the JIT exists; the interpreter otherwise
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [begin, end) of every match, left to right (s is valid UTF-8).
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& s) const {
    std::vector<std::pair<size_t, size_t>> out;
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code_, nullptr), &pcre2_match_data_free);
    for (size_t at = 0; at <= s.size();) {
      const int rc = pcre2_match(code_, (PCRE2_SPTR)s.data(), s.size(), at, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        fail("tokenizer: the split pattern failed on a text of ", s.size(), " bytes (", (const char*)message, ")");
      }
      const PCRE2_SIZE* v = pcre2_get_ovector_pointer(md.get());
      if (v[1] > v[0]) out.push_back({v[0], v[1]});
      if (v[1] > at) {
        at = v[1];
      } else {  // an empty match: step over one character
        int len = 1;
        if (at < s.size()) utf8_code_point(s, at, &len);
        at += (size_t)len;
      }
    }
    return out;
  }

private:
  pcre2_code* code_ = nullptr;
};

// ------------------------------------------------------------ the parts --

// Field access that names the field in its error.
const Json& field(const Json& j, const char* key, const std::string& where) {
  QKV_CHECK(j.is_object() && j.contains(key), where, ": no '", key, "'");
  return j[key];
}
bool flag(const Json& j, const char* key, bool fallback) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}
// Calls add(part, where) for each part of a Sequence (the list j[key]).
template <typename Add>
void each_part(const Json& j, const char* key, const std::string& where, const Add& add) {
  const Json& list = field(j, key, where);
  QKV_CHECK(list.is_array(), where, ".", key, " must be an array");
  for (size_t i = 0; i < list.size(); ++i) add(list[i], where + "." + key + "[" + std::to_string(i) + "]");
}

std::string type_of(const Json& j, const std::string& where) {
  const Json& t = field(j, "type", where);
  QKV_CHECK(t.is_string(), where, ".type must be a string");
  return t.get<std::string>();
}

// Every non-overlapping occurrence of `from` in s replaced by `to`, left to right.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  size_t at = 0;
  for (size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, at)) {
    out.append(s, at, hit - at).append(to);
    at = hit + from.size();
  }
  return out.append(s, at, std::string::npos);
}

// A pattern as tokenizer.json writes it, {"Regex": r} (run by PCRE2) or
// {"String": s} (found as it is), read from `owner`'s "pattern".
struct Pattern {
  std::shared_ptr<Regex> regex;  // or
  std::string literal;           // neither: no pattern

  Pattern() = default;
  Pattern(const Json& owner, const std::string& where) {
    const Json& pattern = field(owner, "pattern", where);
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex = std::make_shared<Regex>(pattern["Regex"].get<std::string>(), where + ".pattern");
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      literal = pattern["String"].get<std::string>();
      QKV_CHECK(!literal.empty(), where, ".pattern.String is empty");
    } else {
      fail(where, ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
  }
  bool empty() const { return !regex && literal.empty(); }
  // The [begin, end) of every match, left to right, none overlapping.
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& s) const {
    if (regex) return regex->find_all(s);
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t at = s.find(literal); at != std::string::npos; at = s.find(literal, at + literal.size()))
      out.push_back({at, at + literal.size()});
    return out;
  }
};

// A Replace step (normalizer or decoder): {"pattern": ..., "content": c}.
struct Replacement {
  Pattern pattern;
  std::string content;

  Replacement(const Json& j, const std::string& where) : pattern(j, where) {
    QKV_CHECK(field(j, "content", where).is_string(), where, ".content must be a string");
    content = j["content"].get<std::string>();
  }
  std::string apply(const std::string& s) const {
    std::string out;
    size_t at = 0;
    for (auto [b, e] : pattern.find_all(s)) out.append(s, at, b - at).append(content), at = e;
    return out.append(s, at, std::string::npos);
  }
};

// Metaspace's options, which its pre-tokenizer and its decoder share: the
// character that stands for a space, and when it goes in front
// (prepend_scheme from tokenizers 0.15 on, add_prefix_space before it).
struct Metaspace {
  std::string replacement;
  std::string scheme;  // always, first or never

  Metaspace(const Json& j, const std::string& where)
      : replacement(j.value("replacement", std::string("\xE2\x96\x81"))),  // U+2581
        scheme(j.contains("prepend_scheme") ? field(j, "prepend_scheme", where).get<std::string>()
               : flag(j, "add_prefix_space", true) ? "always"
                                                   : "never") {
    QKV_CHECK(!replacement.empty(), where, ".replacement is empty");
    QKV_CHECK(scheme == "always" || scheme == "first" || scheme == "never", where, ".prepend_scheme '", scheme,
              "' is not one of always, first, never");
  }
};

// BertNormalizer's steps, in the order `tokenizers` runs them: clean the
// text (drop NUL, U+FFFD and other control and format characters; every white
// space becomes ' '), put spaces around CJK ideographs, strip accents (NFD,
// then no nonspacing marks), lowercase (per character, full mapping).
// Lowercase and StripAccents are the last two alone (StripAccents without
// the NFD).
struct BertSteps {
  bool clean_text = false, chinese = false, nfd = false, strip_accents = false, lowercase = false;

  std::string apply(const std::string& in) const {
    std::string s = in;
    if (clean_text || chinese) s = map_chars(s, [&](uint32_t cp, std::string& out) {
      if (clean_text) {
        if (cp == 0 || cp == 0xFFFD || is_control(cp)) return;
        if (cp == '\t' || cp == '\n' || cp == '\r' || is_white_space(cp)) cp = ' ';
      }
      const bool ideograph = chinese && is_chinese_char(cp);
      if (ideograph) out += ' ';
      append_utf8(out, cp);
      if (ideograph) out += ' ';
    });
    if (nfd) s = utf8proc_normalize(s, UTF8PROC_DECOMPOSE);
    if (strip_accents) s = map_chars(s, [](uint32_t cp, std::string& out) {
      if (utf8proc_category((utf8proc_int32_t)cp) != UTF8PROC_CATEGORY_MN) append_utf8(out, cp);
    });
    if (lowercase) s = map_chars(s, [](uint32_t cp, std::string& out) {
      if (cp == 0x130) out += "i\xCC\x87";  // İ: the one character whose lowercase is two (i + U+0307)
      else append_utf8(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
    });
    return s;
  }

private:
  template <typename F>
  static std::string map_chars(const std::string& s, const F& f) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      int len = 1;
      const uint32_t cp = utf8_code_point(s, i, &len);
      f(cp, out);
      i += (size_t)len;
    }
    return out;
  }
  // Other (C*): control, format, surrogate, private use, unassigned; but not
  // tab, newline and carriage return, which count as white space.
  static bool is_control(uint32_t cp) {
    if (cp == '\t' || cp == '\n' || cp == '\r') return false;
    const utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_CS || c == UTF8PROC_CATEGORY_CO;
  }
  // The CJK Unified Ideographs blocks and their extensions, as BERT's code lists them.
  static bool is_chinese_char(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
  }
};

// SentencePiece's normalization rules as a tokenizer.json carries them: the
// `Precompiled` normalizer (T5's, ALBERT's, XLM-R's), its
// precompiled_charsmap the base64 of SentencePiece's compiled rules:
//
//   [n: uint32, little-endian] [n bytes: a double-array trie, darts-clone's
//   32-bit units, over the UTF-8 bytes of the texts to replace]
//   [their replacements, each ended by a NUL; a key's value is the offset
//   of its replacement]
//
// `tokenizers` applies it per extended grapheme cluster: a cluster of fewer
// than 6 bytes is replaced whole when some key begins it (by the shortest
// such key's replacement, even when that key covers only part of the
// cluster: "\r\n" goes as "\r" does); otherwise each of its characters
// is, or stays as it is. qkv does the same, the clusters from utf8proc.
class Precompiled {
public:
  Precompiled(const Json& j, const std::string& where) {
    const Json& field_json = field(j, "precompiled_charsmap", where);
    QKV_CHECK(field_json.is_string(), where, ".precompiled_charsmap must be a base64 string");
    std::string blob, error;
    QKV_CHECK(base64_decode(field_json.get<std::string>(), &blob, &error), where,
              ".precompiled_charsmap is not base64 (", error, ")");
    static_assert(std::endian::native == std::endian::little, "the charsmap is little-endian; so is this code");
    uint32_t n = 0;
    if (blob.size() >= 4) std::memcpy(&n, blob.data(), 4);
    QKV_CHECK(blob.size() >= 4 && n >= 4 && n % 4 == 0 && n <= blob.size() - 4, where,
              ".precompiled_charsmap is not SentencePiece's compiled rules (", blob.size(), " bytes, the trie's size ",
              n, ")");
    trie_.resize(n / 4);
    std::memcpy(trie_.data(), blob.data() + 4, n);
    replacements_ = blob.substr(4 + n);
    QKV_CHECK(invalid_utf8_offset(replacements_) == std::string::npos, where,
              ".precompiled_charsmap: its replacements are not UTF-8");
  }

  std::string apply(const std::string& s) const {
    std::string out;
    out.reserve(s.size());
    std::string_view text(s), rule;
    utf8proc_int32_t state = 0, prev = -1;
    size_t cluster = 0;  // where the current grapheme cluster began
    auto finish = [&](size_t end) {
      const std::string_view g = text.substr(cluster, end - cluster);
      if (g.size() < 6 && lookup(g, &rule)) return (void)out.append(rule);
      for (size_t i = 0; i < g.size();) {
        int len = 1;
        utf8_code_point(s, cluster + i, &len);
        const std::string_view c = g.substr(i, (size_t)len);
        out.append(lookup(c, &rule) ? rule : c);
        i += (size_t)len;
      }
    };
    for (size_t i = 0; i < s.size();) {
      int len = 1;
      const utf8proc_int32_t cp = (utf8proc_int32_t)utf8_code_point(s, i, &len);
      if (prev >= 0 && utf8proc_grapheme_break_stateful(prev, cp, &state)) {
        finish(i);
        cluster = i;
      }
      prev = cp;
      i += (size_t)len;
    }
    if (cluster < s.size()) finish(s.size());
    return out;
  }

private:
  // The replacement of the shortest key that begins `text` (read up to a
  // NUL byte), if there is one. Units: bits 0-7 the label (bit 31 set on a
  // value unit, so no label matches it), bit 8 "has a value", bits 10-31
  // the offset to the children (shifted 8 more when bit 9 is set).
  bool lookup(std::string_view text, std::string_view* out) const {
    const auto offset = [](uint32_t unit) { return (size_t)(unit >> 10) << ((unit & (1u << 9)) >> 6); };
    size_t node = offset(trie_[0]);
    for (const char ch : text) {
      const uint8_t c = (uint8_t)ch;
      if (c == 0) return false;
      node ^= c;
      if (node >= trie_.size()) return false;
      const uint32_t unit = trie_[node];
      if ((unit & ((1u << 31) | 0xFF)) != c) return false;
      node ^= offset(unit);
      if (!((unit >> 8) & 1)) continue;
      if (node >= trie_.size()) return false;
      const size_t at = trie_[node] & ((1u << 31) - 1);
      // (a broken file's offset past the end or inside a character: no rule)
      if (at > replacements_.size() || (at < replacements_.size() && ((uint8_t)replacements_[at] & 0xC0) == 0x80))
        return false;
      const size_t end = std::min(replacements_.find('\0', at), replacements_.size());
      *out = std::string_view(replacements_).substr(at, end - at);
      return true;
    }
    return false;
  }

  std::vector<uint32_t> trie_;
  std::string replacements_;
};

class Normalizer {
public:
  Normalizer(const Json& j, const std::string& where) { add(j, where); }
  bool empty() const { return steps_.empty(); }
  std::string apply(std::string s) const {
    for (const Step& step : steps_) {
      if (step.replace) {
        s = step.replace->apply(s);
      } else if (step.bert) {
        s = step.bert->apply(s);
      } else if (step.precompiled) {
        s = step.precompiled->apply(s);
      } else if (step.utf8proc == 0) {  // Prepend, to a text that is not empty
        if (!s.empty()) s.insert(0, step.prepend);
      } else {
        s = utf8proc_normalize(s, step.utf8proc);
      }
    }
    return s;
  }

private:
  struct Step {
    int utf8proc = 0;                      // NFC, NFD, NFKC, NFKD: utf8proc options; or
    std::string prepend;                   // Prepend; or
    std::shared_ptr<Replacement> replace;  // Replace; or
    std::shared_ptr<BertSteps> bert;       // BertNormalizer, Lowercase, StripAccents; or
    std::shared_ptr<Precompiled> precompiled;
  };

  void add(const Json& j, const std::string& where) {
    if (j.is_null()) return;
    const std::string type = type_of(j, where);
    if (type == "Sequence") {
      each_part(j, "normalizers", where, [&](const Json& part, const std::string& w) { add(part, w); });
    } else if (type == "NFC") {
      steps_.push_back({UTF8PROC_COMPOSE});
    } else if (type == "NFD") {
      steps_.push_back({UTF8PROC_DECOMPOSE});
    } else if (type == "NFKC") {
      steps_.push_back({UTF8PROC_COMPOSE | UTF8PROC_COMPAT});
    } else if (type == "NFKD") {
      steps_.push_back({UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT});
    } else if (type == "Prepend") {
      QKV_CHECK(field(j, "prepend", where).is_string(), where, ".prepend must be a string");
      steps_.push_back({0, j["prepend"].get<std::string>()});
    } else if (type == "Replace") {
      steps_.push_back({0, "", std::make_shared<Replacement>(j, where)});
    } else if (type == "BertNormalizer") {
      auto b = std::make_shared<BertSteps>();
      b->clean_text = flag(j, "clean_text", true);
      b->chinese = flag(j, "handle_chinese_chars", true);
      b->lowercase = flag(j, "lowercase", true);
      const Json strip = j.value("strip_accents", Json());
      QKV_CHECK(strip.is_null() || strip.is_boolean(), where, ".strip_accents must be true, false or null");
      b->nfd = b->strip_accents = strip.is_null() ? b->lowercase : strip.get<bool>();  // null: as lowercase
      steps_.push_back({0, "", nullptr, b});
    } else if (type == "Lowercase") {
      steps_.push_back({0, "", nullptr, std::make_shared<BertSteps>(BertSteps{.lowercase = true})});
    } else if (type == "StripAccents") {
      steps_.push_back({0, "", nullptr, std::make_shared<BertSteps>(BertSteps{.strip_accents = true})});
    } else if (type == "Precompiled") {
      steps_.push_back({0, "", nullptr, nullptr, std::make_shared<Precompiled>(j, where)});
    } else {
      fail(where, ": normalizer type '", type, "' is not supported yet");
    }
  }
  std::vector<Step> steps_;  // applied in order
};

// GPT-2's split pattern, what ByteLevel with use_regex runs.
const char* kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
public:
  PreTokenizer(const Json& j, const std::string& where) { add(j, where); }
  bool byte_level() const { return byte_level_; }

  // The pieces of `text` BPE sees, each on its own. `at_start`: the text
  // begins the input (no added token before it), where Metaspace's "first"
  // scheme puts its replacement character.
  std::vector<std::string> split(const std::string& text, bool at_start) const {
    std::vector<std::string> pieces = {text};
    for (const Step& step : steps_) {
      std::vector<std::string> next;
      for (size_t i = 0; i < pieces.size(); ++i) {
        std::string& p = pieces[i];
        if (step.prefix_space && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');  // a char, not " ": GCC 12 warns falsely (-Wrestrict) on the string insert
        if (step.metaspace) {
          const std::string& rep = step.pattern.literal;
          p = replace_all(p, " ", rep);
          const bool prepend =
              step.prepend == Prepend::Always || (step.prepend == Prepend::First && at_start && i == 0);
          if (prepend && p.compare(0, rep.size(), rep) != 0) p.insert(0, rep);
          if (!step.metaspace_split) {
            next.push_back(std::move(p));
            continue;
          }
        }
        if (step.bert) {
          bert_split(p, next);
          continue;
        }
        if (step.pattern.empty()) {
          next.push_back(std::move(p));
          continue;
        }
        split_one(step, p, next);
      }
      pieces.swap(next);
    }
    pieces.erase(std::remove(pieces.begin(), pieces.end(), std::string()), pieces.end());
    return pieces;
  }

private:
  enum class Prepend { Never, First, Always };
  struct Step {
    Pattern pattern;  // where to split (Metaspace: at its replacement); empty: no split
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool prefix_space = false;  // ByteLevel's add_prefix_space
    // Metaspace: spaces become pattern.literal, which is prepended as
    // `prepend` says; with metaspace_split, each piece then begins at one.
    bool metaspace = false, metaspace_split = false;
    Prepend prepend = Prepend::Never;
    bool bert = false;  // BertPreTokenizer: split at white space (dropped) and around each punctuation character
  };

  static void bert_split(const std::string& p, std::vector<std::string>& out) {
    std::string word;
    auto flush = [&] {
      if (!word.empty()) out.push_back(std::move(word));
      word.clear();
    };
    for (size_t i = 0; i < p.size();) {
      int len = 1;
      const uint32_t cp = utf8_code_point(p, i, &len);
      if (is_white_space(cp)) {
        flush();
      } else if (is_punctuation(cp)) {
        flush();
        out.push_back(p.substr(i, (size_t)len));
      } else {
        word.append(p, i, (size_t)len);
      }
      i += (size_t)len;
    }
    flush();
  }

  void add(const Json& j, const std::string& where) {
    if (j.is_null()) return;
    const std::string type = type_of(j, where);
    if (type == "Sequence") {
      each_part(j, "pretokenizers", where, [&](const Json& part, const std::string& w) { add(part, w); });
    } else if (type == "ByteLevel") {
      byte_level_ = true;
      Step s;
      s.prefix_space = flag(j, "add_prefix_space", true);
      if (flag(j, "use_regex", true)) s.pattern.regex = std::make_shared<Regex>(kGpt2Pattern, where);
      steps_.push_back(std::move(s));
    } else if (type == "Metaspace") {
      const Metaspace m(j, where);
      Step s;
      s.metaspace = true;
      s.pattern.literal = m.replacement;
      s.metaspace_split = flag(j, "split", true);
      s.behavior = SplitBehavior::MergedWithNext;
      s.prepend = m.scheme == "always" ? Prepend::Always : m.scheme == "first" ? Prepend::First : Prepend::Never;
      steps_.push_back(std::move(s));
    } else if (type == "BertPreTokenizer") {
      Step s;
      s.bert = true;
      steps_.push_back(std::move(s));
    } else if (type == "Split") {
      QKV_CHECK(!flag(j, "invert", false), where, ".invert: true is not supported yet");
      Step s;
      s.pattern = Pattern(j, where);
      const std::string b = field(j, "behavior", where).is_string() ? j["behavior"].get<std::string>() : "";
      static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
          {"Removed", SplitBehavior::Removed},
          {"Isolated", SplitBehavior::Isolated},
          {"MergedWithPrevious", SplitBehavior::MergedWithPrevious},
          {"MergedWithNext", SplitBehavior::MergedWithNext},
          {"Contiguous", SplitBehavior::Contiguous}};
      bool known = false;
      for (auto& [name, value] : kBehaviors)
        if (b == name) s.behavior = value, known = true;
      QKV_CHECK(known, where, ".behavior '", b, "' is not one of Removed, Isolated, MergedWithPrevious, ",
                "MergedWithNext, Contiguous");
      steps_.push_back(std::move(s));
    } else {
      fail(where, ": pre-tokenizer type '", type, "' is not supported yet");
    }
  }

  // `tokenizers`' split: the text as runs, each a match or not, then joined as the behavior says.
  static void split_one(const Step& step, const std::string& p, std::vector<std::string>& out) {
    const std::vector<std::pair<size_t, size_t>> matches = step.pattern.find_all(p);
    struct Run {
      size_t begin, end;
      bool match;
    };
    std::vector<Run> runs;
    size_t at = 0;
    for (auto [b, e] : matches) {
      if (b > at) runs.push_back({at, b, false});
      runs.push_back({b, e, true});
      at = e;
    }
    if (at < p.size()) runs.push_back({at, p.size(), false});
    std::vector<Run> joined;
    switch (step.behavior) {
      case SplitBehavior::Removed:
        for (const Run& r : runs)
          if (!r.match) joined.push_back(r);
        break;
      case SplitBehavior::Isolated:
        joined = runs;
        break;
      case SplitBehavior::MergedWithPrevious: {
        bool previous_match = false;
        for (const Run& r : runs) {
          if (r.match && !previous_match && !joined.empty()) joined.back().end = r.end;
          else joined.push_back(r);
          previous_match = r.match;
        }
        break;
      }
      case SplitBehavior::MergedWithNext: {
        bool previous_match = false;
        for (size_t i = runs.size(); i-- > 0;) {
          const Run& r = runs[i];
          if (r.match && !previous_match && !joined.empty()) joined.back().begin = r.begin;
          else joined.push_back(r);
          previous_match = r.match;
        }
        std::reverse(joined.begin(), joined.end());
        break;
      }
      case SplitBehavior::Contiguous:
        for (const Run& r : runs) {
          if (!joined.empty() && joined.back().match && r.match) joined.back().end = r.end;
          else joined.push_back(r);
        }
        break;
    }
    for (const Run& r : joined) out.push_back(p.substr(r.begin, r.end - r.begin));
  }

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

// The model: one pre-tokenized piece to its ids, and the vocabulary.
class Model {
public:
  virtual ~Model() = default;
  virtual void encode(const std::string& word, std::vector<int64_t>& out) const = 0;
  int64_t size() const { return size_; }
  const std::unordered_map<std::string, int64_t>& vocab() const { return vocab_; }

protected:
  // byte_fallback's tokens: "<0xXX>" for each byte, and whether the vocabulary has all of a text's.
  static std::string byte_token(unsigned char c) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", (unsigned)c);
    return hex;
  }
  bool bytes_known(const std::string& s) const {
    for (unsigned char c : s)
      if (!vocab_.count(byte_token(c))) return false;
    return true;
  }

  // "vocab" {token: id} and "unk_token" (a token of it, or absent).
  void read_vocab(const Json& j, const std::string& where) {
    const Json& vocab = field(j, "vocab", where);
    QKV_CHECK(vocab.is_object(), where, ".vocab must be an object of token: id");
    for (auto& [token, id] : vocab.items()) {
      QKV_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < config::limits::kVocab, where,
                ".vocab: '", token, "' has no id from 0 to ", config::limits::kVocab - 1);
      vocab_[token] = id.get<int64_t>();
      size_ = std::max(size_, id.get<int64_t>() + 1);
    }
    const Json unk = j.value("unk_token", Json());
    if (unk.is_string()) {
      auto it = vocab_.find(unk.get<std::string>());
      QKV_CHECK(it != vocab_.end(), where, ".unk_token '", unk.get<std::string>(), "' is not in the vocabulary");
      unk_ = it->second;
    }
  }

  std::unordered_map<std::string, int64_t> vocab_;
  int64_t size_ = 0, unk_ = -1;
};

// WordPiece (BERT): the longest vocabulary entry that starts the word, then
// the longest "##" entry that continues it, and so on; a word with a part no
// entry matches, or longer than max_input_chars_per_word characters, is one
// unk_token.
class WordPiece final : public Model {
public:
  WordPiece(const Json& j, const std::string& where) {
    read_vocab(j, where);
    QKV_CHECK(unk_ >= 0, where, ".unk_token must name a token of the vocabulary");
    prefix_ = j.value("continuing_subword_prefix", std::string("##"));
    const Json most = j.value("max_input_chars_per_word", Json(100));
    QKV_CHECK(most.is_number_unsigned(), where, ".max_input_chars_per_word must be a count");
    max_chars_ = most.get<size_t>();
  }

  void encode(const std::string& word, std::vector<int64_t>& out) const override {
    if (utf8_chars(word).size() > max_chars_) return out.push_back(unk_);
    std::vector<int64_t> pieces;
    for (size_t start = 0; start < word.size();) {
      size_t end = word.size();
      int64_t found = -1;
      for (; end > start; end -= char_before(word, end)) {
        auto it = vocab_.find(start > 0 ? prefix_ + word.substr(start, end - start) : word.substr(start, end - start));
        if (it != vocab_.end()) {
          found = it->second;
          break;
        }
      }
      if (found < 0) return out.push_back(unk_);
      pieces.push_back(found);
      start = end;
    }
    out.insert(out.end(), pieces.begin(), pieces.end());
  }

private:
  std::string prefix_;
  size_t max_chars_ = 100;
};

// Unigram (T5, ALBERT, XLM-R): the segmentation of the word into vocabulary
// pieces whose scores (log probabilities) sum highest, by Viterbi over the
// byte positions; among equal sums the first found stays (shorter pieces are
// tried first at each start). A character no single piece covers may be
// passed as unk_id, scored the lowest piece score less 10; runs of them are
// fused into one, which is then a piece of its own if the vocabulary has it,
// else its bytes (byte_fallback) or unk_id.
class Unigram final : public Model {
public:
  Unigram(const Json& j, const std::string& where) {
    const Json& vocab = field(j, "vocab", where);
    QKV_CHECK(vocab.is_array() && (int64_t)vocab.size() <= config::limits::kVocab, where,
              ".vocab must be a list of [piece, score]");
    for (size_t i = 0; i < vocab.size(); ++i) {
      const Json& v = vocab[i];
      QKV_CHECK(v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_number(), where, ".vocab[", i,
                "] is not [piece, score]");
      const std::string piece = v[0].get<std::string>();
      vocab_[piece] = (int64_t)i;  // a piece listed twice: the last id, as tokenizers keeps it
      scores_.push_back(v[1].get<double>());
      min_score_ = std::min(min_score_, scores_.back());
      longest_ = std::max(longest_, piece.size());
    }
    size_ = (int64_t)vocab.size();
    const Json unk = j.value("unk_id", Json());
    if (!unk.is_null()) {
      QKV_CHECK(unk.is_number_integer() && unk.get<int64_t>() >= 0 && unk.get<int64_t>() < size_, where,
                ".unk_id must be an id of the vocabulary");
      unk_ = unk.get<int64_t>();
    }
    byte_fallback_ = flag(j, "byte_fallback", false);
  }

  void encode(const std::string& word, std::vector<int64_t>& out) const override {
    const size_t n = word.size();
    if (n == 0) return;
    struct Best {
      int64_t id = -1;
      double score = 0;
      size_t start = std::string::npos;  // npos: no path ends here yet
    };
    std::vector<Best> best(n + 1);
    const double unk_score = min_score_ - 10.0;
    for (size_t s = 0; s < n;) {
      int len = 1;
      utf8_code_point(word, s, &len);
      bool single = false;
      for (size_t k = 1; k <= longest_ && s + k <= n; ++k) {
        auto it = vocab_.find(word.substr(s, k));
        if (it == vocab_.end()) continue;
        relax(best[s + k], s, it->second, scores_[(size_t)it->second] + best[s].score);
        single = single || k == (size_t)len;
      }
      if (!single) {
        QKV_CHECK(unk_ >= 0, "tokenizer: the character '", word.substr(s, (size_t)len),
                  "' is not in the vocabulary and there is no unk_id");
        relax(best[s + (size_t)len], s, unk_, unk_score + best[s].score);
      }
      s += (size_t)len;
    }
    // Back from the end: the pieces, with runs of unknown characters fused.
    std::vector<std::string> pieces;
    std::string unknown;
    for (size_t end = n; end > 0;) {
      const Best& b = best[end];
      const std::string piece = word.substr(b.start, end - b.start);
      if (b.id == unk_) {
        unknown.insert(0, piece);
      } else {
        if (!unknown.empty()) pieces.push_back(std::move(unknown)), unknown.clear();
        pieces.push_back(piece);
      }
      end = b.start;
    }
    if (!unknown.empty()) pieces.push_back(std::move(unknown));
    for (size_t i = pieces.size(); i-- > 0;) {
      const std::string& p = pieces[i];
      if (auto it = vocab_.find(p); it != vocab_.end()) {
        out.push_back(it->second);
      } else if (byte_fallback_ && bytes_known(p)) {
        for (unsigned char c : p) out.push_back(vocab_.at(byte_token(c)));
      } else {
        out.push_back(unk_);
      }
    }
  }

private:
  static void relax(auto& node, size_t start, int64_t id, double score) {
    if (node.start == std::string::npos || score > node.score) node.start = start, node.id = id, node.score = score;
  }
  std::vector<double> scores_;
  double min_score_ = INFINITY;
  size_t longest_ = 0;
  bool byte_fallback_ = false;
};

// BPE: a word starts as its characters (or, byte-level, the characters that
// stand for its bytes); the adjacent pair with the lowest merge rank is
// merged, leftmost first among equal ranks, until no pair has a merge.
class Bpe final : public Model {
public:
  Bpe(const Json& j, const std::string& where) {
    QKV_CHECK(j.value("dropout", Json()).is_null() || j["dropout"].get<double>() == 0.0, where,
              ".dropout: a tokenizer that samples its merges is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const Json v = j.value(key, Json());
      QKV_CHECK(v.is_null() || (v.is_string() && v.get<std::string>().empty()), where, ".", key,
                " is not supported yet");
    }
    ignore_merges_ = flag(j, "ignore_merges", false);
    byte_fallback_ = flag(j, "byte_fallback", false);
    fuse_unk_ = flag(j, "fuse_unk", false);
    read_vocab(j, where);
    const Json& merges = field(j, "merges", where);
    QKV_CHECK(merges.is_array(), where, ".merges must be an array");
    for (size_t r = 0; r < merges.size(); ++r) {
      std::string a, b;
      const Json& m = merges[r];
      if (m.is_string()) {  // "a b"
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ', 1);
        QKV_CHECK(space != std::string::npos, where, ".merges[", r, "]: '", s, "' is not two tokens");
        a = s.substr(0, space), b = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
        a = m[0].get<std::string>(), b = m[1].get<std::string>();
      } else {
        fail(where, ".merges[", r, "] is not a pair of tokens");
      }
      auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      QKV_CHECK(ia != vocab_.end() && ib != vocab_.end() && iab != vocab_.end(), where, ".merges[", r, "]: '", a,
                "' + '", b, "' are not all in the vocabulary");
      merges_.emplace(key(ia->second, ib->second), Merge{(int64_t)r, iab->second});
    }
  }

  void encode(const std::string& word, std::vector<int64_t>& out) const override {
    if (ignore_merges_) {
      if (auto it = vocab_.find(word); it != vocab_.end()) return out.push_back(it->second);
    }
    // The symbols, a linked list over the word's characters.
    struct Symbol {
      int64_t id;
      int prev, next;
      bool alive = true;
    };
    std::vector<Symbol> sym;
    for (size_t i = 0; i < word.size();) {
      int len = 1;
      utf8_code_point(word, i, &len);
      const std::string ch = word.substr(i, (size_t)len);
      i += (size_t)len;
      if (auto it = vocab_.find(ch); it != vocab_.end()) {
        sym.push_back({it->second, (int)sym.size() - 1, (int)sym.size() + 1});
        continue;
      }
      if (byte_fallback_ && bytes_known(ch)) {
        for (unsigned char c : ch) sym.push_back({vocab_.at(byte_token(c)), (int)sym.size() - 1, (int)sym.size() + 1});
        continue;
      }
      QKV_CHECK(unk_ >= 0, "tokenizer: the character '", ch, "' is not in the vocabulary and there is no unk_token");
      if (fuse_unk_ && !sym.empty() && sym.back().id == unk_) continue;
      sym.push_back({unk_, (int)sym.size() - 1, (int)sym.size() + 1});
    }
    if (sym.empty()) return;
    sym.back().next = -1;
    struct Candidate {
      int64_t rank;
      int pos;  // the left symbol
      int64_t left, right, merged;
      bool operator>(const Candidate& o) const { return rank > o.rank || (rank == o.rank && pos > o.pos); }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    auto consider = [&](int pos) {
      if (pos < 0 || sym[pos].next < 0) return;
      const int nxt = sym[pos].next;
      auto it = merges_.find(key(sym[pos].id, sym[nxt].id));
      if (it != merges_.end()) queue.push({it->second.rank, pos, sym[pos].id, sym[nxt].id, it->second.merged});
    };
    for (int i = 0; i + 1 < (int)sym.size(); ++i) consider(i);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol& left = sym[c.pos];
      // Skip a candidate an earlier merge has changed.
      if (!left.alive || left.id != c.left || left.next < 0 || sym[left.next].id != c.right) continue;
      Symbol& right = sym[left.next];
      left.id = c.merged;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) sym[right.next].prev = c.pos;
      consider(left.prev);
      consider(c.pos);
    }
    for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
  }

private:
  struct Merge {
    int64_t rank, merged;
  };
  static uint64_t key(int64_t a, int64_t b) { return ((uint64_t)a << 32) | (uint64_t)b; }

  std::unordered_map<uint64_t, Merge> merges_;
  bool ignore_merges_ = false, byte_fallback_ = false, fuse_unk_ = false;
};

std::unique_ptr<Model> make_model(const Json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  if (type == "BPE") return std::make_unique<Bpe>(j, where);
  if (type == "WordPiece") return std::make_unique<WordPiece>(j, where);
  if (type == "Unigram") return std::make_unique<Unigram>(j, where);
  fail(where, ": model type '", type, "' is not supported yet (BPE, WordPiece and Unigram are)");
}

struct AddedToken {
  int64_t id;
  std::string content;
  bool single_word, lstrip, rstrip, normalized, special;
};

// Added tokens are found in the text before anything else: leftmost, and the
// longest of those that start there. lstrip and rstrip take the white space
// beside the token with it; single_word needs no letter or digit beside it.
class AddedTokenMatcher {
public:
  void add(const AddedToken* t) {
    if (!t->content.empty()) by_first_[(uint8_t)t->content[0]].push_back(t);
  }
  void finish() {
    for (auto& list : by_first_)
      std::stable_sort(list.begin(), list.end(),
                       [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
  }

  struct Match {
    size_t begin, end;
    const AddedToken* token;
  };
  std::vector<Match> find_all(const std::string& s) const {
    std::vector<Match> out;
    for (size_t at = 0; at < s.size();) {
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : by_first_[(uint8_t)s[at]]) {
        if (s.compare(at, t->content.size(), t->content) == 0 && (!t->single_word || alone(s, at, t->content.size()))) {
          hit = t;
          break;
        }
      }
      if (!hit) {
        ++at;
        continue;
      }
      size_t b = at, e = at + hit->content.size();
      const size_t floor = out.empty() ? 0 : out.back().end;
      if (hit->lstrip)
        while (b > floor && space_before(s, b)) b -= char_before(s, b);
      if (hit->rstrip)
        while (e < s.size() && space_at(s, e)) e += char_at(s, e);
      out.push_back({b, e, hit});
      at = e;
    }
    return out;
  }
  bool empty() const {
    for (auto& l : by_first_)
      if (!l.empty()) return false;
    return true;
  }

private:
  static size_t char_at(const std::string& s, size_t i) {
    int len = 1;
    utf8_code_point(s, i, &len);
    return (size_t)len;
  }
  static bool space_at(const std::string& s, size_t i) {
    int len;
    return is_white_space(utf8_code_point(s, i, &len));
  }
  static bool space_before(const std::string& s, size_t i) {
    int len;
    return is_white_space(utf8_code_point(s, i - char_before(s, i), &len));
  }
  static bool alone(const std::string& s, size_t b, size_t n) {
    int len;
    if (b > 0 && is_alphanumeric(utf8_code_point(s, b - char_before(s, b), &len))) return false;
    return b + n >= s.size() || !is_alphanumeric(utf8_code_point(s, b + n, &len));
  }
  std::vector<const AddedToken*> by_first_[256];
};

// The decoders, each a map from the list of token strings to another, run
// in order and then joined, as `tokenizers` runs them:
//   ByteLevel     a token whose characters all stand for bytes becomes those
//                 bytes, any other its own text
//   ByteFallback  a run of <0xXX> tokens becomes its bytes when they are
//                 UTF-8, else one U+FFFD per byte
//   Replace       a pattern replaced in each token
//   Fuse          all tokens joined into one
//   Strip         up to `start` leading and `stop` trailing `content`
//                 characters removed from each token
//   Metaspace     the replacement character back to a space, except in
//                 the first token, where it is removed (unless
//                 prepend_scheme is never): what `tokenizers` does, so
//                 after a Fuse no space is left
// Bytes are returned as they are: a character may still be arriving while a
// stream is generated, so a run of <0xXX> tokens at the very end that could
// still become a character stays bytes (replace_invalid_utf8, which callers
// run, makes it one U+FFFD should it end there).
class Decoder {
public:
  Decoder(const Json& j, const std::string& where) { add(j, where); }
  bool empty() const { return steps_.empty(); }

  std::string decode(std::vector<std::string> tokens) const {
    for (const Step& step : steps_) {
      switch (step.kind) {
        case Kind::ByteLevel:
          for (std::string& t : tokens) t = byte_level(t);
          break;
        case Kind::ByteFallback:
          tokens = byte_fallback(tokens);
          break;
        case Kind::Replace:
          for (std::string& t : tokens) t = step.replace->apply(t);
          break;
        case Kind::Fuse: {
          std::string all;
          for (const std::string& t : tokens) all += t;
          tokens.assign(1, all);
          break;
        }
        case Kind::Strip:
          for (std::string& t : tokens) t = strip(t, step);
          break;
        case Kind::WordPiece:  // "##" continuations joined to the token before, others after a space
          for (size_t i = 0; i < tokens.size(); ++i) {
            std::string& t = tokens[i];
            if (i > 0) t = t.compare(0, step.text.size(), step.text) == 0 ? t.substr(step.text.size()) : " " + t;
            if (step.count) t = wordpiece_cleanup(t);
          }
          break;
        case Kind::Metaspace:  // in the first token every replacement goes (unless the scheme is never)
          for (size_t i = 0; i < tokens.size(); ++i)
            tokens[i] = replace_all(tokens[i], step.text, i == 0 && step.count > 0 ? "" : " ");
          break;
      }
    }
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }

private:
  enum class Kind { ByteLevel, ByteFallback, Replace, Fuse, Strip, Metaspace, WordPiece };
  struct Step {
    Kind kind;
    std::shared_ptr<Replacement> replace;  // Replace
    std::string text;                      // Strip: its character; Metaspace: the replacement; WordPiece: prefix
    int64_t count = 0, stop = 0;           // Strip: start, stop; Metaspace: 1 to drop them in the first token;
                                           // WordPiece: 1 to clean up spaces before punctuation
  };

  void add(const Json& j, const std::string& where) {
    if (j.is_null()) return;
    const std::string type = type_of(j, where);
    if (type == "Sequence") {
      each_part(j, "decoders", where, [&](const Json& part, const std::string& w) { add(part, w); });
    } else if (type == "ByteLevel") {
      steps_.push_back({Kind::ByteLevel});
    } else if (type == "ByteFallback") {
      steps_.push_back({Kind::ByteFallback});
    } else if (type == "Fuse") {
      steps_.push_back({Kind::Fuse});
    } else if (type == "Replace") {
      steps_.push_back({Kind::Replace, std::make_shared<Replacement>(j, where)});
    } else if (type == "Strip") {
      QKV_CHECK(field(j, "content", where).is_string(), where, ".content must be a character");
      const std::string c = j["content"].get<std::string>();
      QKV_CHECK(invalid_utf8_offset(c) == std::string::npos && utf8_chars(c).size() == 1, where,
                ".content must be one character");
      auto count = [&](const char* key) {
        const Json& v = field(j, key, where);
        QKV_CHECK(v.is_number_unsigned(), where, ".", key, " must be a count");
        return v.get<int64_t>();
      };
      steps_.push_back({Kind::Strip, nullptr, c, count("start"), count("stop")});
    } else if (type == "Metaspace") {
      const Metaspace m(j, where);
      steps_.push_back({Kind::Metaspace, nullptr, m.replacement, m.scheme == "never" ? 0 : 1});
    } else if (type == "WordPiece") {
      steps_.push_back({Kind::WordPiece, nullptr, j.value("prefix", std::string("##")), flag(j, "cleanup", true)});
    } else {
      fail(where, ": decoder type '", type, "' is not supported yet");
    }
  }

  // The WordPiece decoder's cleanup: no space before . ? ! , and English clitics.
  static std::string wordpiece_cleanup(std::string t) {
    static const std::pair<const char*, const char*> kFixes[] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
        {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (auto [from, to] : kFixes) t = replace_all(t, from, to);
    return t;
  }

  static std::string byte_level(const std::string& t) {
    const ByteTable& table = byte_table();
    std::string mapped;
    for (size_t i = 0; i < t.size();) {
      int len = 1;
      auto it = table.to_byte.find(utf8_code_point(t, i, &len));
      if (it == table.to_byte.end()) return t;
      mapped += (char)it->second;
      i += (size_t)len;
    }
    return mapped;
  }

  // The byte of a token "<0xXX>", or -1.
  static int byte_of(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; ++k) {
      const char c = t[k];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                           : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    return v;
  }

  // Whether s, not valid UTF-8, is valid but for a character that more bytes
  // would finish: some continuation bytes make it valid. (Three kinds are
  // tried, for the narrower second bytes after E0, ED, F0 and F4.)
  static bool ends_unfinished(const std::string& s) {
    for (const char pad : {'\x80', '\x90', '\xA0'}) {
      std::string t = s;
      for (int k = 0; k < 3; ++k)
        if (t += pad; invalid_utf8_offset(t) == std::string::npos) return true;
    }
    return false;
  }

  static std::vector<std::string> byte_fallback(const std::vector<std::string>& tokens) {
    std::vector<std::string> out;
    std::string run;  // the bytes of the <0xXX> tokens so far
    auto flush = [&](bool at_end) {
      if (run.empty()) return;
      const bool valid = invalid_utf8_offset(run) == std::string::npos;
      // At the end, bytes that are only an unfinished character stay bytes (see above).
      const bool unfinished = at_end && !valid && ends_unfinished(run);
      if (valid || unfinished) {
        out.push_back(run);
      } else {
        std::string marks;
        for (size_t k = 0; k < run.size(); ++k) marks += "\xEF\xBF\xBD";
        out.push_back(marks);
      }
      run.clear();
    };
    for (const std::string& t : tokens) {
      const int b = byte_of(t);
      if (b >= 0) {
        run += (char)b;
        continue;
      }
      flush(false);
      out.push_back(t);
    }
    flush(true);
    return out;
  }

  static std::string strip(const std::string& t, const Step& step) {
    size_t begin = 0, end = t.size();
    const size_t n = step.text.size();
    for (int64_t k = 0; k < step.count && end - begin >= n && t.compare(begin, n, step.text) == 0; ++k) begin += n;
    for (int64_t k = 0; k < step.stop && end - begin >= n && t.compare(end - n, n, step.text) == 0; ++k) end -= n;
    return t.substr(begin, end - begin);
  }

  std::vector<Step> steps_;
};

class HfTokenizer final : public Tokenizer {
public:
  HfTokenizer(const std::string& text, const std::string& path, std::vector<int64_t> eos)
      : source_(text), path_(path),
        root_(parse_root(text, path)),
        normalizer_(root_.value("normalizer", Json()), path + ": normalizer"),
        pre_(root_.value("pre_tokenizer", Json()), path + ": pre_tokenizer"),
        model_(make_model(field(root_, "model", path), path + ": model")),
        decoder_(root_.value("decoder", Json()), path + ": decoder") {
    size_ = model_->size();
    read_added_tokens(path);
    specials_.prefix.clear(), specials_.suffix.clear();
    read_post_processor(root_.value("post_processor", Json()), path + ": post_processor");
    specials_.eos = std::move(eos);
    specials_.never_sampled.clear();
    id_to_token_.assign((size_t)size_, nullptr);
    for (auto& [token, id] : model_->vocab()) id_to_token_[(size_t)id] = &token;
    for (const AddedToken& t : added_) id_to_token_[(size_t)t.id] = &t.content;
  }

  std::vector<int64_t> encode(const std::string& raw) const override {
    // Invalid UTF-8 is replaced first, as Python does when it reads the bytes as text.
    const std::string text = replace_invalid_utf8(raw);
    std::vector<int64_t> ids;
    split_added(text, raw_tokens_, [&](const std::string& gap, size_t gap_at) {
      const std::string normalized = normalizer_.empty() ? gap : normalizer_.apply(gap);
      split_added(normalized, normalized_tokens_, [&](const std::string& part, size_t part_at) {
        encode_part(part, gap_at == 0 && part_at == 0, ids);
      }, ids);
    }, ids);
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<const std::string*> tokens;
    for (int64_t id : ids) {
      if (id < 0 || id >= size_ || !id_to_token_[(size_t)id] || is_special(id)) continue;
      tokens.push_back(id_to_token_[(size_t)id]);
    }
    return decode_tokens(tokens);
  }

  std::vector<std::string> pieces(const std::vector<int64_t>& ids) const override {
    std::vector<std::string> out;
    for (int64_t id : ids) {
      if (id < 0 || id >= size_ || !id_to_token_[(size_t)id]) out.push_back("<unk>");
      else out.push_back(replace_invalid_utf8(decode_tokens({id_to_token_[(size_t)id]})));
    }
    return out;
  }

  int64_t size() const override { return size_; }
  const Specials& specials() const override { return specials_; }
  // Written into a qkv model folder (qkv convert): tokenizer.json as read,
  // and the ids that end generation, which came from the folder's configs.
  std::string config_json() const override { return Json{{"type", "huggingface"}, {"eos", specials_.eos}}.dump(); }
  std::string file_name() const override { return "tokenizer.json"; }
  std::string serialize() const override { return source_; }

private:
  static Json parse_root(const std::string& text, const std::string& path) {
    Json j = parse_json(text, path);
    QKV_CHECK(j.is_object(), path, ": not a tokenizer.json (the top level is not an object)");
    return j;
  }

  void read_added_tokens(const std::string& path) {
    const Json list = root_.value("added_tokens", Json::array());
    QKV_CHECK(list.is_array(), path, ": added_tokens must be an array");
    added_.reserve(list.size());  // the matchers keep pointers
    for (size_t i = 0; i < list.size(); ++i) {
      const Json& t = list[i];
      const std::string where = path + ": added_tokens[" + std::to_string(i) + "]";
      QKV_CHECK(field(t, "id", where).is_number_integer() && t["id"].get<int64_t>() >= 0 &&
                    t["id"].get<int64_t>() < config::limits::kVocab,
                where, ".id must be an id from 0 to ", config::limits::kVocab - 1);
      QKV_CHECK(field(t, "content", where).is_string(), where, ".content must be a string");
      added_.push_back({t["id"].get<int64_t>(), t["content"].get<std::string>(), flag(t, "single_word", false),
                        flag(t, "lstrip", false), flag(t, "rstrip", false), flag(t, "normalized", true),
                        flag(t, "special", false)});
      QKV_CHECK(invalid_utf8_offset(added_.back().content) == std::string::npos, where, ".content is not UTF-8");
      size_ = std::max(size_, added_.back().id + 1);
    }
    for (AddedToken& t : added_) {
      // A normalized token is looked for in the normalized text, as its own normalized form.
      if (t.normalized && !normalizer_.empty()) t.content = normalizer_.apply(t.content);
      (t.normalized && !normalizer_.empty() ? normalized_tokens_ : raw_tokens_).add(&t);
      if (t.special) special_ids_.push_back(t.id);
    }
    raw_tokens_.finish();
    normalized_tokens_.finish();
    std::sort(special_ids_.begin(), special_ids_.end());
  }

  void read_post_processor(const Json& j, const std::string& where) {
    if (j.is_null()) return;
    const std::string type = type_of(j, where);
    auto id_of_pair = [&](const char* key) {  // ["[CLS]", 101]
      const Json& p = field(j, key, where);
      QKV_CHECK(p.is_array() && p.size() == 2 && p[1].is_number_integer(), where, ".", key, " must be [token, id]");
      return p[1].get<int64_t>();
    };
    if (type == "Sequence") {
      each_part(j, "processors", where, [&](const Json& part, const std::string& w) { read_post_processor(part, w); });
    } else if (type == "ByteLevel") {
      // trim_offsets and add_prefix_space change offsets only; the ids stay.
    } else if (type == "BertProcessing" || type == "RobertaProcessing") {
      specials_.prefix = {id_of_pair("cls")};
      specials_.suffix = {id_of_pair("sep")};
    } else if (type == "TemplateProcessing") {
      specials_.prefix.clear(), specials_.suffix.clear();
      const Json& single = field(j, "single", where);
      const Json& tokens = field(j, "special_tokens", where);
      bool seen_text = false;
      for (const Json& item : single) {
        if (item.contains("Sequence")) {
          QKV_CHECK(!seen_text, where, ".single: the text appears twice");
          seen_text = true;
          continue;
        }
        const Json& s = field(item, "SpecialToken", where + ".single");
        const std::string name = field(s, "id", where + ".single").get<std::string>();
        QKV_CHECK(tokens.contains(name), where, ".special_tokens has no '", name, "'");
        for (const Json& id : field(tokens[name], "ids", where + ".special_tokens." + name))
          (seen_text ? specials_.suffix : specials_.prefix).push_back(id.get<int64_t>());
      }
      QKV_CHECK(seen_text, where, ".single has no place for the text ({\"Sequence\": {\"id\": \"A\"}})");
    } else {
      fail(where, ": post-processor type '", type, "' is not supported yet");
    }
  }

  bool is_special(int64_t id) const { return std::binary_search(special_ids_.begin(), special_ids_.end(), id); }

  // Calls gap(text, offset) for the text between added tokens and appends the tokens' ids in order.
  template <typename Gap>
  static void split_added(const std::string& text, const AddedTokenMatcher& m, const Gap& gap,
                          std::vector<int64_t>& ids) {
    if (m.empty()) return gap(text, 0);
    size_t at = 0;
    for (const auto& hit : m.find_all(text)) {
      if (hit.begin > at) gap(text.substr(at, hit.begin - at), at);
      ids.push_back(hit.token->id);
      at = hit.end;
    }
    if (at < text.size()) gap(text.substr(at), at);
  }

  void encode_part(const std::string& part, bool at_start, std::vector<int64_t>& ids) const {
    const ByteTable& table = byte_table();
    for (const std::string& piece : pre_.split(part, at_start)) {
      if (!pre_.byte_level()) {
        model_->encode(piece, ids);
        continue;
      }
      std::string mapped;
      for (unsigned char c : piece) mapped += table.to_char[c];
      model_->encode(mapped, ids);
    }
  }

  std::string decode_tokens(const std::vector<const std::string*>& tokens) const {
    if (decoder_.empty()) {  // tokens joined by spaces, as `tokenizers` does without a decoder
      std::string out;
      for (size_t i = 0; i < tokens.size(); ++i) out.append(i ? " " : "").append(*tokens[i]);
      return out;
    }
    std::vector<std::string> list;
    list.reserve(tokens.size());
    for (const std::string* t : tokens) list.push_back(*t);
    return decoder_.decode(std::move(list));
  }

  std::string source_, path_;
  Json root_;
  Normalizer normalizer_;
  PreTokenizer pre_;
  std::unique_ptr<Model> model_;
  Decoder decoder_;
  std::vector<AddedToken> added_;
  AddedTokenMatcher raw_tokens_, normalized_tokens_;
  std::vector<int64_t> special_ids_;
  std::vector<const std::string*> id_to_token_;
  int64_t size_ = 0;
  Specials specials_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, std::vector<int64_t> eos) {
  const std::string text = read_file(path);
  try {
    return std::make_unique<HfTokenizer>(text, path, std::move(eos));
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type where the checks above expect none
    fail(path, ": not a tokenizer.json qkv reads (", e.what(), ")");
  }
}

}  // namespace qkv
