// The tokenizers: a character vocabulary and SentencePiece, one interface.
#include "qkv/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/utf8.h"
#include "src/config/fields.h"
#include "src/data/sentencepiece_files.h"

template <>
struct qkv::config::EnumNames<qkv::TokenizerKind> {
  static constexpr std::pair<TokenizerKind, const char*> values[] = {
      {TokenizerKind::Char, "char"}, {TokenizerKind::SentencePiece, "sentencepiece"}, {TokenizerKind::Bytes, "bytes"},
      {TokenizerKind::HuggingFace, "huggingface"}, {TokenizerKind::Marian, "marian"},
      {TokenizerKind::HuggingFaceSentencePiece, "huggingface_sentencepiece"}};
};

template <>
struct qkv::config::EnumNames<qkv::SentencePieceModel> {
  static constexpr std::pair<SentencePieceModel, const char*> values[] = {{SentencePieceModel::Unigram, "unigram"},
                                                                          {SentencePieceModel::Bpe, "bpe"}};
};

namespace qkv {

static const char* kSpecials[] = {"<pad>", "<bos>", "<eos>", "<unk>"};

const Tokenizer::Specials& Tokenizer::specials() const {
  static const Specials qkv_numbering;
  return qkv_numbering;
}

std::vector<int64_t> Tokenizer::encode_prompt(const std::string& text) const {
  std::vector<int64_t> ids = specials().prefix;
  for (int64_t id : encode(text)) ids.push_back(id);
  return ids;
}

bool Tokenizer::is_eos(int64_t id) const {
  const std::vector<int64_t>& eos = specials().eos;
  return std::find(eos.begin(), eos.end(), id) != eos.end();
}

CharTokenizer CharTokenizer::build(const std::vector<std::string>& texts) {
  std::map<std::string, int64_t> counts;
  for (auto& t : texts)
    for (auto& c : utf8_chars(t)) counts[c]++;
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.second > b.second; });
  CharTokenizer tok;
  for (const char* s : kSpecials) tok.itos_.push_back(s);
  for (auto& [c, n] : sorted) tok.itos_.push_back(c);
  for (size_t i = 0; i < tok.itos_.size(); ++i) tok.stoi_[tok.itos_[i]] = (int64_t)i;
  return tok;
}

std::vector<int64_t> CharTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (auto& c : utf8_chars(text)) {
    auto it = stoi_.find(c);
    ids.push_back(it == stoi_.end() || it->second < 4 ? kUnk : it->second);
  }
  return ids;
}

std::vector<std::string> CharTokenizer::pieces(const std::vector<int64_t>& ids) const {
  std::vector<std::string> out;
  for (int64_t id : ids) out.push_back(id >= 0 && id < size() ? itos_[id] : "<unk>");
  return out;
}

std::string CharTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id == kEos) break;
    if (id == kPad || id == kBos) continue;
    out += id == kUnk || id < 0 || id >= size() ? "\xEF\xBF\xBD" : itos_[id];
  }
  return out;
}

std::string CharTokenizer::to_json() const {
  nlohmann::ordered_json j;
  j["type"] = "char";
  j["vocab"] = itos_;
  return j.dump(1) + "\n";
}

CharTokenizer CharTokenizer::from_json(const std::string& text, const std::string& source) {
  nlohmann::json j = parse_json(text, source);
  QKV_CHECK(j.is_object() && j.contains("type") && j["type"] == "char" && j.contains("vocab") && j["vocab"].is_array(),
            source, ": expected {\"type\": \"char\", \"vocab\": [...]}");
  CharTokenizer tok;
  QKV_CHECK(j["vocab"].size() <= (size_t)config::limits::kVocab, source, ": ", j["vocab"].size(),
            " vocabulary entries, more than the limit of ", config::limits::kVocab);
  for (auto& v : j["vocab"]) {
    QKV_CHECK(v.is_string(), source, ": vocabulary entries must be strings");
    tok.itos_.push_back(v.get<std::string>());
  }
  QKV_CHECK(tok.itos_.size() >= 4, source, ": vocabulary lacks the four special tokens");
  // After the specials, each entry is one character: what encode() looks up.
  for (size_t i = 4; i < tok.itos_.size(); ++i) {
    const std::string& t = tok.itos_[i];
    QKV_CHECK(invalid_utf8_offset(t) == std::string::npos && utf8_chars(t).size() == 1, source, ": vocabulary entry ",
              i, " is ", t.empty() ? "empty" : "not one character", "; a char tokenizer's entries are single characters");
  }
  for (int i = 0; i < 4; ++i)
    QKV_CHECK(tok.itos_[i] == kSpecials[i], source, ": token ", i, " must be ", kSpecials[i], ", found '",
              tok.itos_[i], "'");
  for (size_t i = 0; i < tok.itos_.size(); ++i) {
    QKV_CHECK(tok.stoi_.emplace(tok.itos_[i], (int64_t)i).second, source, ": token '", tok.itos_[i],
              "' appears twice");
  }
  return tok;
}

// SentencePiece with qkv's special ids: <pad>=0, <bos>=1, <eos>=2, <unk>=3.
// The model travels as its serialized protobuf (tokenizer.model), the file
// SentencePiece's own tools read.
class SentencePieceTokenizer final : public Tokenizer {
public:
  SentencePieceTokenizer(const std::string& model_proto, std::string model_type, const std::string& source)
      : proto_(model_proto), model_type_(std::move(model_type)) {
    load_sentencepiece_model(sp_, proto_, source);
    QKV_CHECK(sp_.pad_id() == kPad && sp_.bos_id() == kBos && sp_.eos_id() == kEos && sp_.unk_id() == kUnk, source,
              ": a SentencePiece model for qkv numbers <pad>, <bos>, <eos>, <unk> as 0, 1, 2, 3; this one has ",
              sp_.pad_id(), ", ", sp_.bos_id(), ", ", sp_.eos_id(), ", ", sp_.unk_id());
  }

  std::vector<int64_t> encode(const std::string& text) const override {
    size_t bad = invalid_utf8_offset(text);
    QKV_CHECK(bad == std::string::npos, "invalid UTF-8 at byte ", bad + 1, " of '", replace_invalid_utf8(text), "'");
    std::vector<int> ids;
    auto status = sp_.Encode(text, &ids);
    QKV_CHECK(status.ok(), "SentencePiece cannot encode '", text, "': ", status.ToString());
    return {ids.begin(), ids.end()};
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> kept;
    for (int64_t id : ids) {
      if (id == kEos) break;
      if (id == kPad || id == kBos) continue;
      kept.push_back(id >= 0 && id < size() ? (int)id : (int)kUnk);
    }
    return sentencepiece_decode(sp_, kept);
  }

  std::vector<std::string> pieces(const std::vector<int64_t>& ids) const override {
    return sentencepiece_pieces(sp_, ids);
  }

  int64_t size() const override { return sp_.GetPieceSize(); }
  std::string config_json() const override {
    nlohmann::ordered_json j = {{"type", "sentencepiece"}, {"model_type", model_type_}, {"vocab_size", size()}};
    return j.dump();
  }
  std::string file_name() const override { return "tokenizer.model"; }
  std::string serialize() const override { return proto_; }

private:
  std::string proto_;
  std::string model_type_;
  sentencepiece::SentencePieceProcessor sp_;
};

// Bytes: id 4 + b for byte b. Nothing to learn and nothing to save.
class ByteTokenizer final : public Tokenizer {
public:
  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> ids;
    for (unsigned char c : text) ids.push_back(4 + (int64_t)c);
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string out;
    for (int64_t id : ids) {
      if (id == kEos) break;
      if (id >= 4 && id < 260) out += (char)(id - 4);
      else if (id == kUnk || id >= 260 || id < 0) out += "\xEF\xBF\xBD";
    }
    return out;
  }
  std::vector<std::string> pieces(const std::vector<int64_t>& ids) const override {
    static const char* kNames[] = {"<pad>", "<bos>", "<eos>", "<unk>"};
    std::vector<std::string> out;
    for (int64_t id : ids) {
      if (id >= 0 && id < 4) {
        out.push_back(kNames[id]);
      } else if (id >= 4 + 0x20 && id < 4 + 0x7f) {
        out.push_back(std::string(1, (char)(id - 4)));
      } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02X", (unsigned)((id - 4) & 0xff));
        out.push_back(hex);
      }
    }
    return out;
  }
  int64_t size() const override { return 260; }
  std::string config_json() const override { return R"({"type": "bytes"})"; }
  std::string file_name() const override { return ""; }
  std::string serialize() const override { return ""; }
};

TokenizerConfig TokenizerConfig::from_json(const std::string& text, const std::string& source) {
  using C = TokenizerConfig;
  static const config::Fields<C> fields =
      config::Fields<C>("tokenizer.")
          .add("type", &C::type)
          .add("model_type", &C::model_type)
          .add("vocab_size", &C::vocab_size).at_least(8).at_most(config::limits::kVocab)
          .add("character_coverage", &C::character_coverage).positive().at_most(1);
  nlohmann::json j = parse_json(text, source);
  if (j.is_string()) j = nlohmann::json{{"type", j}};
  QKV_CHECK(j.is_object(), source, ": \"tokenizer\" must be \"char\" or an object with a \"type\"");
  TokenizerConfig c;
  const nlohmann::json eos = j.contains("eos") ? j["eos"] : nlohmann::json::array();
  j.erase("eos");
  fields.read(j, c, source);
  const bool hf = c.type == TokenizerKind::HuggingFace || c.type == TokenizerKind::HuggingFaceSentencePiece;
  QKV_CHECK(eos.is_array() && (eos.empty() || hf), source,
            ": tokenizer.eos must be a list of ids, and only for types huggingface and huggingface_sentencepiece");
  for (const nlohmann::json& id : eos) {
    QKV_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, source, ": tokenizer.eos must be a list of ids");
    c.eos.push_back(id.get<int64_t>());
  }
  QKV_CHECK((!hf && c.type != TokenizerKind::Marian) || !j.contains("vocab_size"),
            source, ": a ", config::name_of(c.type),
            " tokenizer's vocabulary is in its files; tokenizer.vocab_size does not apply");
  return c;
}

namespace {

class VectorSentences : public sentencepiece::SentenceIterator {
public:
  explicit VectorSentences(const std::vector<std::string>& texts) : texts_(texts) {}
  bool done() const override { return at_ >= texts_.size(); }
  void Next() override { ++at_; }
  const std::string& value() const override { return texts_[at_]; }
  sentencepiece::util::Status status() const override { return {}; }

private:
  const std::vector<std::string>& texts_;
  size_t at_ = 0;
};

// SentencePiece's trainer logs its command line to stderr whatever the log
// level; qkv prints its own progress, so stderr is closed while it trains.
// Errors come back in the returned status, not on stderr.
class QuietStderr {
public:
  QuietStderr() {
    std::fflush(stderr);
    saved_ = dup(2);
    int null = open("/dev/null", O_WRONLY);
    if (saved_ >= 0 && null >= 0) dup2(null, 2);
    if (null >= 0) close(null);
  }
  ~QuietStderr() {
    std::fflush(stderr);
    if (saved_ >= 0) dup2(saved_, 2), close(saved_);
  }

private:
  int saved_;
};

}  // namespace

std::unique_ptr<Tokenizer> train_tokenizer(const TokenizerConfig& config, const std::vector<std::string>& texts) {
  if (config.type == TokenizerKind::Bytes) return std::make_unique<ByteTokenizer>();
  QKV_CHECK(config.type != TokenizerKind::HuggingFace && config.type != TokenizerKind::Marian &&
                config.type != TokenizerKind::HuggingFaceSentencePiece,
            "a ",
            config::name_of(config.type),
            " tokenizer is read from a model folder's files, not learnt: choose char, bytes or sentencepiece");
  QKV_CHECK(!texts.empty(), "cannot build a tokenizer from no text");
  if (config.type == TokenizerKind::Char) return std::make_unique<CharTokenizer>(CharTokenizer::build(texts));
  // One thread and no sampling: the same text gives the same model. No
  // normalization: decode(encode(x)) gives x back, full-width punctuation and
  // spaces included, so scores compare against the references as written.
  std::string args = "model_type=" + std::string(config::name_of(config.model_type)) + " vocab_size=" + std::to_string(config.vocab_size) +
                     " character_coverage=" + std::to_string(config.character_coverage) +
                     " pad_id=0 bos_id=1 eos_id=2 unk_id=3 bos_piece=<bos> eos_piece=<eos> hard_vocab_limit=false num_threads=1"
                     " normalization_rule_name=identity remove_extra_whitespaces=false"
                     " input_sentence_size=0 minloglevel=2";
  VectorSentences sentences(texts);
  std::string proto;
  sentencepiece::util::Status status;
  {
    QuietStderr quiet;
    status = sentencepiece::SentencePieceTrainer::Train(args, &sentences, &proto);
  }
  QKV_CHECK(status.ok(), "training the SentencePiece ", config::name_of(config.model_type), " tokenizer (vocab_size ",
            config.vocab_size, ") failed: ", status.ToString());
  return std::make_unique<SentencePieceTokenizer>(proto, config::name_of(config.model_type), "the trained SentencePiece model");
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& config_json, const std::string& dir) {
  TokenizerConfig c = TokenizerConfig::from_json(config_json, dir + "/config.json");
  if (c.type == TokenizerKind::Bytes) return std::make_unique<ByteTokenizer>();
  if (c.type == TokenizerKind::Char) {
    std::string path = dir + "/tokenizer.json";
    return std::make_unique<CharTokenizer>(CharTokenizer::from_json(read_file(path), path));
  }
  if (c.type == TokenizerKind::HuggingFace) return load_hf_tokenizer(dir + "/tokenizer.json", c.eos);
  if (c.type == TokenizerKind::Marian) return load_marian_tokenizer(dir);
  if (c.type == TokenizerKind::HuggingFaceSentencePiece) return load_sentencepiece_folder_tokenizer(dir, c.eos);
  std::string path = dir + "/tokenizer.model";
  return std::make_unique<SentencePieceTokenizer>(read_file(path), config::name_of(c.model_type), path);
}

}  // namespace qkv
