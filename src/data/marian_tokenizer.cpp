// Marian's tokenizer, as transformers' MarianTokenizer runs it on a folder of
// the Helsinki-NLP opus-mt kind: source.spm and target.spm (SentencePiece
// models, their normalization included: SentencePiece's own library runs
// them) and vocab.json, which numbers the pieces of both for the model.
//
//   text -> </s>, <unk>, <pad> written in it split out -> a leading language
//   code ">>xx<<" split off -> source.spm's pieces -> vocab.json ids (<unk>
//   for a piece it lacks) -> ids </s>
//   ids -> pieces (specials skipped) -> SentencePiece's DecodePieces -> U+2581
//   as ' ', white space stripped at both ends
//
// Decoding uses source.spm too: transformers does so when one vocab.json
// serves both sides. With separate vocabularies (tokenizer_config.json's
// separate_vocabs, the Tatoeba-Challenge folders), the source's pieces are
// numbered by vocab.json and the target's by target_vocab.json: the
// tokenizer is the source's, and target() the target's (target.spm's pieces
// and target_vocab.json's ids, decoded with target.spm, as transformers
// decodes by default then).
#include <sentencepiece_processor.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/tokenizer.h"
#include "qkv/utf8.h"
#include "src/core/json.h"
#include "src/data/sentencepiece_files.h"

namespace qkv {

namespace {

// Python's str.isspace() code points, which str.strip() removes.
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// str.strip() of valid UTF-8.
std::string python_strip(const std::string& s) {
  const std::vector<std::string> chars = utf8_chars(s);
  size_t first = 0, last = chars.size();
  int len = 0;
  while (first < last && python_space(utf8_code_point(chars[first], 0, &len))) ++first;
  while (last > first && python_space(utf8_code_point(chars[last - 1], 0, &len))) --last;
  std::string out;
  for (size_t i = first; i < last; ++i) out += chars[i];
  return out;
}

class MarianTokenizer final : public Tokenizer {
public:
  // The source side (and, with separate vocabularies, the target's as target()).
  explicit MarianTokenizer(const std::string& dir) {
    const nlohmann::json config = read_tokenizer_config(dir, &config_text_);
    const std::string config_path = dir + "/tokenizer_config.json";
    const nlohmann::json separate = config.value("separate_vocabs", nlohmann::json(false));
    QKV_CHECK(separate.is_boolean(), config_path, ": 'separate_vocabs' must be true or false, got ", separate.dump());
    for (const char* side : {"source", "target"}) {
      const std::string path = dir + "/" + side + ".spm";
      std::string& proto = side[0] == 's' ? source_proto_ : target_proto_;
      proto = read_file(path);
      load_sentencepiece_model(side[0] == 's' ? source_ : target_, proto, path);  // target.spm: checked, kept
    }
    read_vocab(dir + "/vocab.json", config, config_path);
    if (separate.get<bool>()) {
      target_side_ = std::unique_ptr<MarianTokenizer>(new MarianTokenizer(dir, config, config_path, target_proto_));
      // One eos ends the source (the model's eos_token_id) and the output.
      QKV_CHECK(target_side_->eos_ == eos_, dir, "/target_vocab.json: '", target_side_->piece(target_side_->eos_),
                "' is id ", target_side_->eos_, ", vocab.json has it at ", eos_, "; qkv needs the two at one id");
    }
  }

  const Tokenizer& target() const override { return target_side_ ? *target_side_ : *this; }

private:
  // The target side of separate vocabularies: target_vocab.json's ids,
  // target.spm encoding and decoding.
  MarianTokenizer(const std::string& dir, const nlohmann::json& config, const std::string& config_path,
                  const std::string& target_proto)
      : target_proto_(target_proto), side_(Side::Target) {
    load_sentencepiece_model(target_, target_proto_, dir + "/target.spm");
    read_vocab(dir + "/target_vocab.json", config, config_path);
  }

  // A vocabulary file ({piece: id}, the ids 0 to its size - 1) and the
  // config's eos, unk and pad tokens in it.
  void read_vocab(const std::string& vocab_path, const nlohmann::json& config, const std::string& config_path) {
    vocab_text_ = read_file(vocab_path);
    const nlohmann::json vocab = parse_json(vocab_text_, vocab_path);
    QKV_CHECK(vocab.is_object() && !vocab.empty(), vocab_path, ": expected an object of pieces and their ids");
    for (const auto& [piece, id] : vocab.items()) {
      QKV_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t)vocab.size(),
                vocab_path, ": the id of '", piece, "' must be an integer in [0, ", vocab.size(), ")");
      QKV_CHECK(pieces_.emplace(id.get<int64_t>(), piece).second, vocab_path, ": id ", id.get<int64_t>(),
                " is given twice");
      ids_[piece] = id.get<int64_t>();
    }
    size_ = (int64_t)vocab.size();
    for (const auto& [key, fallback, out] : {std::tuple{"eos_token", "</s>", &eos_},
                                             std::tuple{"unk_token", "<unk>", &unk_},
                                             std::tuple{"pad_token", "<pad>", &pad_}}) {
      const std::string t = config_token(config, key, fallback, config_path);
      const auto it = ids_.find(t);
      QKV_CHECK(it != ids_.end(), vocab_path, ": the ", key, " '", t, "' is not in the vocabulary");
      *out = it->second;
      specials_by_text_.emplace_back(t, it->second);
    }
    specials_.prefix = {};
    specials_.suffix = {eos_};
    specials_.eos = {eos_};
    specials_.never_sampled = {pad_};
  }

public:
  std::vector<int64_t> encode(const std::string& raw) const override {
    const std::string text = replace_invalid_utf8(raw);  // as Python reads bytes with errors="replace"
    std::vector<int64_t> ids;
    split_at_specials(
        text, specials_by_text_, [&](const std::string& chunk) { encode_chunk(chunk, ids); },
        [&](int64_t id) { ids.push_back(id); });
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<std::string> kept;
    for (int64_t id : ids) {
      if (id == eos_) break;
      if (id == pad_ || id == unk_) continue;  // transformers' skip_special_tokens
      kept.push_back(piece(id));
    }
    std::string text;
    const auto status = spm().Decode(kept, &text);
    QKV_CHECK(status.ok(), "SentencePiece cannot decode: ", status.ToString());
    return python_strip(boundaries_as_spaces(text));
  }

  std::vector<std::string> pieces(const std::vector<int64_t>& ids) const override {
    std::vector<std::string> out;
    for (int64_t id : ids) out.push_back(boundaries_as_spaces(piece(id)));
    return out;
  }

  int64_t size() const override { return size_; }
  const Specials& specials() const override { return specials_; }
  // What a qkv folder keeps (the source side's; its tokenizer_config.json names separate_vocabs).
  std::string config_json() const override { return R"({"type": "marian"})"; }
  std::string file_name() const override { return side_ == Side::Target ? "target_vocab.json" : "vocab.json"; }
  std::string serialize() const override { return vocab_text_; }
  std::vector<std::pair<std::string, std::string>> extra_files() const override {
    std::vector<std::pair<std::string, std::string>> files = {{"source.spm", source_proto_},
                                                              {"target.spm", target_proto_}};
    if (!config_text_.empty()) files.emplace_back("tokenizer_config.json", config_text_);
    if (target_side_) files.emplace_back(target_side_->file_name(), target_side_->serialize());
    return files;
  }

private:
  // A piece of the text between specials: its language code, then source.spm's pieces.
  void encode_chunk(std::string text, std::vector<int64_t>& ids) const {
    if (text.rfind(">>", 0) == 0) {
      if (const size_t end = text.find("<<"); end != std::string::npos) {
        ids.push_back(id_of(text.substr(0, end + 2)));
        text = text.substr(end + 2);
      }
    }
    std::vector<std::string> pieces;
    const auto status = spm().Encode(text, &pieces);
    QKV_CHECK(status.ok(), "SentencePiece cannot encode '", text, "': ", status.ToString());
    for (const std::string& p : pieces) ids.push_back(id_of(p));
  }

  int64_t id_of(const std::string& piece) const {
    const auto it = ids_.find(piece);
    return it == ids_.end() ? unk_ : it->second;
  }

  std::string piece(int64_t id) const {
    const auto it = pieces_.find(id);
    return it == pieces_.end() ? pieces_.at(unk_) : it->second;
  }

  // The SentencePiece model this side encodes and decodes with.
  const sentencepiece::SentencePieceProcessor& spm() const { return side_ == Side::Target ? target_ : source_; }

  enum class Side { Source, Target };
  std::map<std::string, int64_t> ids_;
  std::map<int64_t, std::string> pieces_;
  std::vector<std::pair<std::string, int64_t>> specials_by_text_;
  int64_t size_ = 0, eos_ = 0, unk_ = 0, pad_ = 0;
  Specials specials_;
  std::string vocab_text_, config_text_, source_proto_, target_proto_;
  sentencepiece::SentencePieceProcessor source_, target_;
  Side side_ = Side::Source;
  std::unique_ptr<MarianTokenizer> target_side_;
};

}  // namespace

bool is_marian_tokenizer_folder(const std::string& dir) {
  return std::filesystem::exists(dir + "/vocab.json") && std::filesystem::exists(dir + "/source.spm");
}

std::unique_ptr<Tokenizer> load_marian_tokenizer(const std::string& dir) {
  return std::make_unique<MarianTokenizer>(dir);
}

}  // namespace qkv
