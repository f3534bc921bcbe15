// A model folder's tokenizer.model (SentencePiece's serialized protobuf), as
// load_tokenizer reads it, then used: a sentence encoded and decoded, every
// id's piece shown.
#include <filesystem>

#include "qkv/tokenizer.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = qkv::fuzz::scratch_file("tokenizer.model", qkv::fuzz::as_string(data, size));
  const std::string dir = std::filesystem::path(path).parent_path().string();
  for (const char* type : {"unigram", "bpe"})
    qkv::fuzz::expect_clean([&] {
      const std::string config = std::string(R"({"type": "sentencepiece", "model_type": ")") + type + "\"}";
      std::unique_ptr<qkv::Tokenizer> tok = qkv::load_tokenizer(config, dir);
      const std::vector<int64_t> ids = tok->encode("我是中国人 私は中国人です");
      for (int64_t id : ids)
        if (id < 0 || id >= tok->size()) std::abort();
      tok->decode(ids);
      std::vector<int64_t> all;
      for (int64_t id = 0; id < std::min<int64_t>(tok->size(), 4096); ++id) all.push_back(id);
      tok->pieces(all);
    });
  return 0;
}
