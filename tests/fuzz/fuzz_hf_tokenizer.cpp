// Hugging Face tokenizer.json. An input that starts with '{' is read as a
// tokenizer.json (load_hf_tokenizer), then used on a fixed text. Any other
// input is text, encoded by the gpt2, llama3 and llama2 fixtures: every id in range,
// and decoding gives the text back (invalid UTF-8 replaced) whenever it holds
// no special token (decode skips those); and by the bert (WordPiece),
// unigram and xlmr (SentencePiece's compiled rules) fixtures, which
// lowercase, fold or fuse unknown characters, so only the ids are checked
// and decoding must not fail.
#include "qkv/tokenizer.h"
#include "qkv/utf8.h"
#include "tests/fuzz/fuzz.h"

namespace {

void use(const qkv::Tokenizer& tok, const std::string& text) {
  const std::vector<int64_t> ids = tok.encode(text);
  for (int64_t id : ids)
    if (id < 0 || id >= tok.size()) std::abort();
  tok.decode(ids);
  tok.pieces(ids);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input = qkv::fuzz::as_string(data, size);
  if (!input.empty() && input[0] == '{') {
    const std::string path = qkv::fuzz::scratch_file("tokenizer.json", input);
    qkv::fuzz::expect_clean([&] { use(*qkv::load_hf_tokenizer(path, {}), "我是中国人 -> 私は中国人です. It's 2026!"); });
    return 0;
  }
  static const auto gpt2 = qkv::load_hf_tokenizer(QKV_FIXTURES_DIR "/tokenizers/gpt2.json", {});
  static const auto llama3 = qkv::load_hf_tokenizer(QKV_FIXTURES_DIR "/tokenizers/llama3.json", {});
  const std::string text = qkv::replace_invalid_utf8(input);
  const bool special = text.find("<|") != std::string::npos || text.find("<mask>") != std::string::npos;
  for (const qkv::Tokenizer* tok : {gpt2.get(), llama3.get()}) {
    qkv::fuzz::expect_clean([&] {
      use(*tok, input);
      if (!special && qkv::replace_invalid_utf8(tok->decode(tok->encode(input))) != text) std::abort();
    });
  }
  // Llama 2's kind: byte fallback makes every text come back, but for its
  // special tokens and U+2581 (which stands for a space there).
  static const auto llama2 = qkv::load_hf_tokenizer(QKV_FIXTURES_DIR "/tokenizers/llama2.json", {});
  const bool sp_special = text.find("<s>") != std::string::npos || text.find("</s>") != std::string::npos ||
                          text.find("<unk>") != std::string::npos || text.find("\xE2\x96\x81") != std::string::npos;
  qkv::fuzz::expect_clean([&] {
    use(*llama2, input);
    if (!sp_special && qkv::replace_invalid_utf8(llama2->decode(llama2->encode(input))) != text) std::abort();
  });
  static const auto bert = qkv::load_hf_tokenizer(QKV_FIXTURES_DIR "/tokenizers/bert.json", {});
  static const auto unigram = qkv::load_hf_tokenizer(QKV_FIXTURES_DIR "/tokenizers/unigram.json", {});
  static const auto xlmr = qkv::load_hf_tokenizer(QKV_FIXTURES_DIR "/tokenizers/xlmr.json", {});
  for (const qkv::Tokenizer* tok : {bert.get(), unigram.get(), xlmr.get()})
    qkv::fuzz::expect_clean([&] { use(*tok, input); });
  return 0;
}
