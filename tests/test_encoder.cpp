// The text encoder (qkv/encoder.h) on a Hugging Face BertModel saved as a
// sentence-transformers folder (tests/fixtures/hf/bert, from
// scripts/make_hf_fixtures.py): the last hidden states match transformers'
// to 1e-4, and the sentence embeddings (WordPiece tokens, mean pooling over
// the real tokens, a Normalize module, inputs cut at max_seq_length)
// match SentenceTransformer.encode() with a cosine of 0.99999 or more.
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "qkv/encoder.h"
#include "qkv/io.h"
#include "qkv/registry.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::error_of;

std::string fixture_hf(const std::string& name) { return std::string(QKV_FIXTURES_DIR) + "/hf/" + name; }

TEST(Encoder, BertHiddenStatesMatchTransformers) {
  EmbeddingModel m = load_embedding_model(fixture_hf("bert"), "embed");
  EXPECT_EQ(m.model->config().pooling, SentencePooling::Mean);
  EXPECT_TRUE(m.model->config().normalize);  // 2_Normalize in modules.json
  EXPECT_EQ(m.model->config().max_tokens, 24);
  SafetensorsFile expected = load_safetensors(fixture_hf("bert.expected.safetensors"));
  const Tensor ids = *expected.find("ids");
  NoGradGuard no_grad;
  EXPECT_TRUE(testing::all_close(m.model->forward(ids, {ids.size(1)}), *expected.find("hidden"), 1e-4f, 1e-4f));
}

TEST(Encoder, SentenceEmbeddingsMatchSentenceTransformers) {
  EmbeddingModel m = load_embedding_model(fixture_hf("bert"), "embed");
  const nlohmann::json j = nlohmann::json::parse(read_file(fixture_hf("bert.expected.json")));
  const std::vector<std::string> sentences = j["sentences"].get<std::vector<std::string>>();
  const Tensor want = load_safetensors(fixture_hf("bert.expected.safetensors")).find("embeddings")->contiguous();
  // The last sentence is longer than max_seq_length: sentence-transformers cuts it, as --truncate does.
  const std::vector<std::vector<float>> got = embed_texts(m, sentences, false, {.truncate = true});
  ASSERT_EQ(got.size(), sentences.size());
  const int64_t D = want.size(1);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ((int64_t)got[i].size(), D);
    double dot = 0, a = 0, b = 0, worst = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double x = got[i][d], y = want.data<float>()[i * D + d];
      dot += x * y, a += x * x, b += y * y, worst = std::max(worst, std::abs(x - y));
    }
    EXPECT_GE(dot / std::sqrt(a * b), 0.99999) << "sentence " << i << ": " << sentences[i];
    EXPECT_LE(worst, 1e-4) << "sentence " << i;
    EXPECT_NEAR(std::sqrt(a), 1.0, 1e-5) << "normalized";
  }
  // Without --truncate the long one is an error naming it.
  const std::string e = error_of([&] { embed_texts(m, sentences, false, {}, [](size_t i) {
    return "stdin line " + std::to_string(i + 1); }); });
  EXPECT_EQ(e.rfind("stdin line 5: ", 0), 0u) << e;
  EXPECT_NE(e.find("--truncate"), std::string::npos) << e;
}

TEST(Encoder, BertOptionsQkvDoesNotImplementAreOneErrorNamingTheField) {
  const std::string dir = testing::temp_dir("bert");
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
    std::filesystem::copy_file(fixture_hf("bert/") + f, dir + "/" + f);
  auto with = [&](const nlohmann::json& changes) {
    nlohmann::json c = nlohmann::json::parse(read_file(fixture_hf("bert/config.json")));
    c.merge_patch(changes);
    write_file_atomic(dir + "/config.json", c.dump());
    return error_of([&] { load_embedding_model(dir, "embed"); });
  };
  EXPECT_EQ(with({{"position_embedding_type", "relative_key"}}),
            dir + "/config.json: \"position_embedding_type\": \"relative_key\" is not supported yet (a different "
                  "model would run)");
  EXPECT_EQ(with({{"hidden_act", "swish"}}),
            dir + "/config.json: \"hidden_act\": \"swish\" is not supported yet (a different model would run)");
  EXPECT_EQ(with({{"is_decoder", true}}),
            dir + "/config.json: \"is_decoder\": true is not supported yet (a different model would run)");
  // Without sentence-transformers' files: mean pooling, not normalized, the whole context.
  with(nlohmann::json::object());
  EmbeddingModel plain = load_embedding_model(dir, "embed");
  EXPECT_FALSE(plain.model->config().normalize);
  EXPECT_EQ(plain.model->config().max_tokens, 0);
  // A pooling qkv does not implement.
  write_file_atomic(dir + "/modules.json",
                    R"([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                        {"idx": 1, "name": "1", "path": "p", "type": "sentence_transformers.models.Pooling"}])");
  std::filesystem::create_directories(dir + "/p");
  write_file_atomic(dir + "/p/config.json", R"({"pooling_mode_max_tokens": true})");
  EXPECT_EQ(error_of([&] { load_embedding_model(dir, "embed"); }),
            dir + "/p/config.json: \"pooling_mode_max_tokens\" is not supported yet (a different model would run)");
  // Another family's folder for embed: the registry's error.
  const std::string lm = error_of([&] { load_embedding_model(fixture_hf("gpt2"), "embed"); });
  EXPECT_NE(lm.find("embed needs a model that does (arch encoder)"), std::string::npos) << lm;
}

}  // namespace
}  // namespace qkv
