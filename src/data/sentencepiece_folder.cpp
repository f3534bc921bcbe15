// A Hugging Face folder whose tokenizer is a SentencePiece model,
// tokenizer.model, with no tokenizer.json beside it (Llama 2 and Mistral
// 7B v0.1 folders saved before the fast tokenizers, and the ones
// scripts/make_bench_llama.py writes), run as the slow LlamaTokenizer and
// llama.cpp run such a model: SentencePiece's own library encodes and
// decodes (its normalization, dummy prefix and byte fallback included), its
// ids are the model's, and tokenizer_config.json says whether <s> goes
// first (add_bos_token, default true) and </s> last (add_eos_token, default
// false). Also the helpers sentencepiece_files.h declares.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/tokenizer.h"
#include "qkv/utf8.h"
#include "src/core/json.h"
#include "src/data/sentencepiece_files.h"

namespace qkv {

void load_sentencepiece_model(sentencepiece::SentencePieceProcessor& sp, const std::string& proto,
                              const std::string& path) {
  sentencepiece::util::Status status;
  try {
    status = sp.LoadFromSerializedProto(proto);
  } catch (const std::exception& e) {  // its trie builder throws on some broken models (found by fuzzing)
    fail(path, ": not a SentencePiece model (", e.what(), ")");
  }
  QKV_CHECK(status.ok(), path, ": not a SentencePiece model (", status.ToString(), ")");
}

void split_at_specials(const std::string& text, const std::vector<std::pair<std::string, int64_t>>& specials,
                       const std::function<void(const std::string&)>& on_text,
                       const std::function<void(int64_t)>& on_special) {
  size_t at = 0;
  while (true) {
    size_t next = std::string::npos, length = 0;
    int64_t id = -1;
    for (const auto& [t, i] : specials) {
      const size_t found = t.empty() ? std::string::npos : text.find(t, at);
      if (found == std::string::npos) continue;
      if (found < next || (found == next && t.size() > length)) next = found, length = t.size(), id = i;
    }
    on_text(text.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) return;
    on_special(id);
    at = next + length;
  }
}

std::string boundaries_as_spaces(const std::string& s) {
  static const std::string kBoundary = "\xE2\x96\x81";  // U+2581
  std::string out;
  for (size_t at = 0; at < s.size();) {
    const bool boundary = s.compare(at, kBoundary.size(), kBoundary) == 0;
    out += boundary ? ' ' : s[at];
    at += boundary ? kBoundary.size() : 1;
  }
  return out;
}

std::string sentencepiece_decode(const sentencepiece::SentencePieceProcessor& sp, const std::vector<int>& ids) {
  std::string text;
  const auto status = sp.Decode(ids, &text);
  QKV_CHECK(status.ok(), "SentencePiece cannot decode: ", status.ToString());
  return text;
}

std::vector<std::string> sentencepiece_pieces(const sentencepiece::SentencePieceProcessor& sp,
                                              const std::vector<int64_t>& ids) {
  std::vector<std::string> out;
  for (int64_t id : ids)
    out.push_back(boundaries_as_spaces(id >= 0 && id < sp.GetPieceSize() ? sp.IdToPiece((int)id) : "<unk>"));
  return out;
}

nlohmann::json read_tokenizer_config(const std::string& dir, std::string* text) {
  const std::string path = dir + "/tokenizer_config.json";
  text->clear();
  if (!std::filesystem::exists(path)) return nlohmann::json::object();
  *text = read_file(path);
  nlohmann::json config = parse_json(*text, path);
  QKV_CHECK(config.is_object(), path, ": expected a JSON object");
  return config;
}

std::string config_token(const nlohmann::json& config, const char* key, const std::string& fallback,
                         const std::string& source) {
  if (!config.is_object() || !config.contains(key) || config[key].is_null()) return fallback;
  const nlohmann::json& v = config[key];
  const nlohmann::json s = v.is_object() ? v.value("content", nlohmann::json()) : v;
  QKV_CHECK(s.is_string(), source, ": '", key, "' must be a string");
  return s.get<std::string>();
}

namespace {

class SentencePieceFolderTokenizer final : public Tokenizer {
public:
  SentencePieceFolderTokenizer(const std::string& dir, std::vector<int64_t> eos) {
    const std::string path = dir + "/tokenizer.model", config_path = dir + "/tokenizer_config.json";
    proto_ = read_file(path);
    load_sentencepiece_model(sp_, proto_, path);
    const nlohmann::json config = read_tokenizer_config(dir, &config_text_);
    auto flag = [&](const char* key, bool fallback) {
      const nlohmann::json v = config.value(key, nlohmann::json(fallback));
      QKV_CHECK(v.is_boolean(), config_path, ": '", key, "' must be true or false");
      return v.get<bool>();
    };
    // The specials: SentencePiece's control and unknown pieces, found by the
    // names tokenizer_config.json gives them (or SentencePiece's own).
    auto id_of = [&](const char* key, int fallback_id) -> int64_t {
      const std::string fallback = fallback_id >= 0 ? sp_.IdToPiece(fallback_id) : "";
      const std::string t = config_token(config, key, fallback, config_path);
      if (t.empty()) return -1;
      const int id = sp_.PieceToId(t);
      QKV_CHECK(sp_.IdToPiece(id) == t, config_path, ": the ", key, " '", t, "' is not a piece of ", path);
      specials_by_text_.emplace_back(t, id);
      special_ids_.push_back(id);
      return id;
    };
    const int64_t bos = id_of("bos_token", sp_.bos_id()), eos_id = id_of("eos_token", sp_.eos_id());
    id_of("unk_token", sp_.unk_id());
    id_of("pad_token", sp_.pad_id());
    specials_.prefix.clear(), specials_.suffix.clear(), specials_.never_sampled.clear();
    if (flag("add_bos_token", true) && bos >= 0) specials_.prefix = {bos};
    if (flag("add_eos_token", false) && eos_id >= 0) specials_.suffix = {eos_id};
    specials_.eos = eos.empty() && eos_id >= 0 ? std::vector<int64_t>{eos_id} : std::move(eos);
  }

  std::vector<int64_t> encode(const std::string& raw) const override {
    const std::string text = replace_invalid_utf8(raw);  // as Python reads bytes with errors="replace"
    std::vector<int64_t> ids;
    split_at_specials(
        text, specials_by_text_,
        [&](const std::string& chunk) {
          if (chunk.empty()) return;
          std::vector<int> part;
          const auto status = sp_.Encode(chunk, &part);
          QKV_CHECK(status.ok(), "SentencePiece cannot encode '", chunk, "': ", status.ToString());
          ids.insert(ids.end(), part.begin(), part.end());
        },
        [&](int64_t id) { ids.push_back(id); });
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> kept;
    for (int64_t id : ids)
      if (id >= 0 && id < size() && std::find(special_ids_.begin(), special_ids_.end(), id) == special_ids_.end())
        kept.push_back((int)id);
    return sentencepiece_decode(sp_, kept);
  }

  std::vector<std::string> pieces(const std::vector<int64_t>& ids) const override {
    return sentencepiece_pieces(sp_, ids);
  }

  int64_t size() const override { return sp_.GetPieceSize(); }
  const Specials& specials() const override { return specials_; }
  std::string config_json() const override {
    return nlohmann::json{{"type", "huggingface_sentencepiece"}, {"eos", specials_.eos}}.dump();
  }
  std::string file_name() const override { return "tokenizer.model"; }
  std::string serialize() const override { return proto_; }
  std::vector<std::pair<std::string, std::string>> extra_files() const override {
    if (config_text_.empty()) return {};
    return {{"tokenizer_config.json", config_text_}};
  }

private:
  std::string proto_, config_text_;
  sentencepiece::SentencePieceProcessor sp_;
  std::vector<std::pair<std::string, int64_t>> specials_by_text_;
  std::vector<int64_t> special_ids_;
  Specials specials_;
};

}  // namespace

bool is_sentencepiece_tokenizer_folder(const std::string& dir) {
  return std::filesystem::exists(dir + "/tokenizer.model");
}

std::unique_ptr<Tokenizer> load_sentencepiece_folder_tokenizer(const std::string& dir, std::vector<int64_t> eos) {
  return std::make_unique<SentencePieceFolderTokenizer>(dir, std::move(eos));
}

}  // namespace qkv
