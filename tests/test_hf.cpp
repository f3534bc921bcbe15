// Hugging Face folders (tests/fixtures/hf, from scripts/make_hf_fixtures.py):
// a tiny random LlamaForCausalLM (float32, GQA, rope_theta 500000, untied) and
// Qwen2ForCausalLM (bfloat16, q/k/v bias, head_dim 12, tied) load as qkv
// decoders whose logits match transformers' to 1e-4 and whose greedy tokens
// through the KV cache are transformers' exactly; options qkv does not
// implement are one error naming the field.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "qkv/infer.h"
#include "qkv/io.h"
#include "qkv/lm.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::error_of;

std::string hf(const std::string& name) { return std::string(QKV_FIXTURES_DIR) + "/hf/" + name; }

// A copy of a fixture folder whose config.json has `changes` merged in.
std::string with_config(const std::string& name, const nlohmann::json& changes) {
  const std::string dir = testing::temp_dir("hf");
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(hf(name) + "/" + f, dir + "/" + f);
  nlohmann::json c = nlohmann::json::parse(read_file(dir + "/config.json"));
  c.merge_patch(changes);
  write_file_atomic(dir + "/config.json", c.dump(2));
  return dir;
}

class HfParity : public ::testing::TestWithParam<const char*> {};

TEST_P(HfParity, LogitsAndGreedyTokensMatchTransformers) {
  const std::string name = GetParam();
  LanguageModel m = load_language_model(hf(name));
  EXPECT_EQ(m.tokenizer, nullptr);  // tokenizer.json is not read yet
  SafetensorsFile expected = load_safetensors(hf(name + ".expected.safetensors"));
  const Tensor ids = *expected.find("ids");
  NoGradGuard no_grad;
  EXPECT_TRUE(testing::all_close(m.model->forward(ids), *expected.find("logits"), 1e-4f, 1e-4f)) << name;
  // Greedy through the KV cache: the prompt at once, then one token at a time.
  std::vector<KVCache> caches = m.model->make_caches(1, m.model->config().context);
  Tensor logits = m.model->forward_cached(ids, caches);
  std::vector<int64_t> greedy;
  for (int i = 0; i < 16; ++i) {
    const int64_t V = logits.size(-1);
    const std::vector<float> last = logits.slice(1, logits.size(1) - 1, logits.size(1)).reshape({V}).to_vector();
    const int64_t next = std::max_element(last.begin(), last.end()) - last.begin();
    greedy.push_back(next);
    logits = m.model->forward_cached(Tensor::from_ints({next}, {1, 1}), caches);
  }
  EXPECT_EQ(greedy, expected.find("greedy")->to_ints()) << name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity, ::testing::Values("llama", "qwen2"));

TEST(Hf, TheConfigMapsOntoTheDecoderFields) {
  const DecoderConfig llama = load_language_model(hf("llama")).model->config();
  EXPECT_EQ(llama.rope_theta, 500000.0f);
  EXPECT_EQ(llama.num_kv_heads, 2);
  EXPECT_FALSE(llama.tie_output);
  EXPECT_FALSE(llama.bias.q);
  const DecoderConfig qwen = load_language_model(hf("qwen2")).model->config();
  EXPECT_EQ(qwen.head_dim, 12);
  EXPECT_TRUE(qwen.tie_output);
  EXPECT_TRUE(qwen.bias.q && qwen.bias.k && qwen.bias.v);
  EXPECT_FALSE(qwen.bias.out);
  EXPECT_EQ(qwen.rope_theta, 1000000.0f);
}

// What would silently change the model is refused, naming the field.
TEST(Hf, OptionsQkvDoesNotImplementAreOneErrorNamingTheField) {
  auto error_with = [](const nlohmann::json& changes) {
    const std::string dir = with_config("llama", changes);
    return error_of([&] { load_language_model(dir); }).substr(dir.size() + 1);
  };
  EXPECT_EQ(error_with({{"rope_parameters", {{"rope_type", "llama3"}, {"factor", 8.0}}}}),
            "config.json: 'rope_parameters' of type 'llama3' is not supported yet (a different model would run)");
  EXPECT_EQ(error_with({{"hidden_act", "gelu"}}),
            "config.json: 'hidden_act' is \"gelu\"; the SwiGLU MLP of these models uses silu");
  EXPECT_EQ(error_with({{"mlp_bias", true}}),
            "config.json: 'mlp_bias': true is not supported yet (a different model would run)");
  EXPECT_EQ(error_with({{"vocab_size", nullptr}}), "config.json: 'vocab_size' is missing");
  EXPECT_EQ(error_with({{"hidden_size", "wide"}}).rfind("config.json: a field has the wrong type (", 0), 0u);
  EXPECT_EQ(error_with({{"num_key_value_heads", 3}}).rfind("config.json: ", 0), 0u);  // 4 heads over 3: the decoder's check
  EXPECT_EQ(error_with({{"architectures", {"GPT2LMHeadModel"}}}),
            "config.json: a Hugging Face model of architecture GPT2LMHeadModel; qkv reads LlamaForCausalLM, "
            "MistralForCausalLM, Qwen2ForCausalLM");
  // The wrong task names what the folder holds, as for qkv's own folders.
  EXPECT_NE(error_of([] { load_translation_model(hf("llama"), "translate"); }).find("a decoder-only language model"),
            std::string::npos);
  // A weight of the wrong shape, or one the model has no place for, names the file.
  const std::string dir = with_config("llama", {{"intermediate_size", 48}});
  EXPECT_EQ(error_of([&] { load_language_model(dir); }),
            dir + "/model.safetensors: load_state_dict: tensor 'layers.0.mlp.w1.weight' has shape [64,32], model "
                  "expects [48,32]");
}

TEST(Hf, ShardedWeightsAreOneClearError) {
  const std::string dir = with_config("llama", nlohmann::json::object());
  std::filesystem::rename(dir + "/model.safetensors", dir + "/model-00001-of-00002.safetensors");
  write_file_atomic(dir + "/model.safetensors.index.json", "{}");
  EXPECT_EQ(error_of([&] { load_language_model(dir); }),
            dir + ": weights sharded over several files (model.safetensors.index.json) are not read yet");
}

}  // namespace
}  // namespace qkv
