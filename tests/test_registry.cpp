// The family registry (qkv/registry.h) and the one model-folder reader and
// writer (qkv/checkpoint.h): every built-in family is found by its arch, a
// folder of the wrong kind is one error naming what it holds, and a family
// added with one register_family call (a tiny test-only one here) is saved,
// found and loaded like the built-in ones.
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "qkv/allocator.h"
#include "qkv/checkpoint.h"
#include "qkv/infer.h"
#include "qkv/io.h"
#include "qkv/lm.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::error_of;

std::string legacy(const std::string& family) { return std::string(QKV_FIXTURES_DIR) + "/folders/" + family; }

TEST(Registry, EveryBuiltInFamilyByItsArch) {
  std::vector<std::string> archs;
  for (const Family& f : families()) archs.push_back(f.arch);
  for (const char* arch : {"transformer", "rnn_attention", "conv", "decoder", "vit"})
    EXPECT_NE(std::find(archs.begin(), archs.end(), arch), archs.end()) << arch;
  EXPECT_EQ(find_family("decoder", "c").domain, Domain::Language);
  EXPECT_EQ(family_of_config(R"({"d_model": 8})", "c").arch, "transformer");  // no arch: as before, a transformer
  EXPECT_EQ(error_of([] { find_family("gpt", "c.json"); })
                .rfind("c.json: 'arch' is 'gpt', expected one of: transformer, rnn_attention, conv, decoder, vit", 0),
            0u);
  EXPECT_EQ(error_of([] { family_of_config(R"({"arch": 3})", "c.json"); }), "c.json: 'arch' has the wrong type (3)");
}

// A config within every field's bounds can still describe a model larger than
// the machine: building it stops at the allocator's limit with one error line,
// instead of filling memory until the kernel kills the process.
TEST(Registry, AModelLargerThanTheMemoryLimitIsOneError) {
  struct Restore {
    ~Restore() { set_memory_limit(0); }
  } restore;
  const uint64_t machine = memory_limit();
  set_memory_limit(64ull << 20);
  EXPECT_THROW(Tensor::empty({(int64_t)(100 << 20) / 4}), std::bad_alloc);
  Rng rng(1);
  const std::string e = testing::error_of([&] {
    find_family("transformer", "big.json")
        .build(R"({"d_model": 1024, "nhead": 8, "num_encoder_layers": 8, "num_decoder_layers": 8,
                   "dim_feedforward": 4096, "vocab_size": 1000})", "big.json", rng);
  });
  // Sized on the meta device first: refused before a byte of it is allocated.
  EXPECT_EQ(e, "big.json: the model this config describes has 236171264 parameters (901 MiB), more than qkv may "
               "use here (64.0 MiB)");
  // One whose parameters just fit but whose building does not (the allocator
  // rounds, initialisation draws into temporaries) still stops at the limit.
  const std::string small = R"({"d_model": 64, "nhead": 4, "num_encoder_layers": 1, "num_decoder_layers": 1,
                                "dim_feedforward": 128, "vocab_size": 1000})";
  const uint64_t bytes = find_family("transformer", "s").build(small, "s", rng)->parameter_bytes();
  set_memory_limit(bytes);
  const std::string e2 = testing::error_of([&] { find_family("transformer", "small.json").build(small, "small.json", rng); });
  EXPECT_EQ(e2, "small.json: the model this config describes does not fit in memory (qkv may use " +
                    format_bytes(bytes) + " here)");
  set_memory_limit(0);
  EXPECT_EQ(memory_limit(), machine);
  EXPECT_NO_THROW(Tensor::empty({(int64_t)(100 << 20) / 4}));
}

// Every shipped recipe and every family's old folder builds on the meta device
// into the same parameters (names, shapes, dtypes) as on the CPU, without
// allocating: what require_fits_in_memory relies on to size a model first.
TEST(Registry, EveryModelBuildsOnTheMetaDeviceAsOnTheCpu) {
  std::vector<std::string> configs;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(QKV_SOURCE_DIR) + "/configs"))
    if (entry.path().extension() == ".json") configs.push_back(entry.path().string());
  for (const char* f : {"transformer", "rnn_attention", "conv", "decoder", "vit"}) configs.push_back(legacy(f) + "/config.json");
  std::sort(configs.begin(), configs.end());
  int built = 0;
  for (const std::string& path : configs) {
    SCOPED_TRACE(path);
    nlohmann::json j = nlohmann::json::parse(read_file(path));
    j.erase("train");
    j.erase("tokenizer");
    const Family& family = family_of_config(j.dump(), path);
    if (family.domain != Domain::Vision) j["vocab_size"] = 300;
    Rng rng(3);
    const uint64_t before = allocator_stats().bytes_in_use;
    std::shared_ptr<Module> meta;
    {
      DefaultDeviceGuard guard(Device::Meta);
      meta = family.build(j.dump(), path, rng);
    }
    EXPECT_EQ(allocator_stats().bytes_in_use, before);
    const auto meta_params = meta->named_parameters();
    ASSERT_FALSE(meta_params.empty());
    for (const auto& [name, p] : meta_params) EXPECT_EQ(p.device(), Device::Meta) << name;
    if (meta->parameter_count() > 50'000'000) {  // lm-100m: sized only, too slow to build for a test
      EXPECT_EQ(meta->parameter_bytes(), (uint64_t)meta->parameter_count() * 4);
      continue;
    }
    const auto cpu_params = family.build(j.dump(), path, rng)->named_parameters();
    ASSERT_EQ(cpu_params.size(), meta_params.size());
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      EXPECT_EQ(meta_params[i].first, cpu_params[i].first);
      EXPECT_EQ(meta_params[i].second.shape(), cpu_params[i].second.shape()) << cpu_params[i].first;
      EXPECT_EQ(meta_params[i].second.dtype(), cpu_params[i].second.dtype()) << cpu_params[i].first;
      EXPECT_EQ(cpu_params[i].second.device(), Device::Cpu);
    }
    ++built;
  }
  EXPECT_GE(built, 13);  // the recipes but lm-100m, and the five folders
}

TEST(Registry, AFolderOfTheWrongKindNamesWhatItHolds) {
  EXPECT_EQ(error_of([] { load_language_model(legacy("transformer"), "generate"); }),
            "generate: " + legacy("transformer") +
                " holds a translation Transformer (arch 'transformer'), which serves translate and eval; generate "
                "needs a model that does (arch decoder)");
  EXPECT_EQ(error_of([] { load_translation_model(legacy("vit"), "translate"); }),
            "translate: " + legacy("vit") +
                " holds a Vision Transformer (arch 'vit'), which serves classify and eval; translate needs a model "
                "that does (arch transformer, rnn_attention or conv)");
  EXPECT_EQ(error_of([] { load_model_folder("/nonexistent/folder"); }), "model folder /nonexistent/folder does not exist");
  for (const char* f : {"transformer", "rnn_attention", "conv", "decoder", "vit"})
    EXPECT_EQ(load_model_folder(legacy(f)).family->arch, f);
}

// A family outside src/models: y = x W^T, config {"arch": "tiny_test", "width": N}.
struct TinyConfig {
  int64_t width = 2;
};

class TinyModel : public Module {
public:
  TinyModel(int64_t width, Rng& rng) : width(width) {
    weight = register_parameter("weight", Tensor::randn({width, width}, rng));
  }
  int64_t width;
  Tensor weight;
};

Family tiny_family() {
  return {.arch = "tiny_test",
          .description = "a tiny test model",
          .domain = Domain::Vision,  // no tokenizer
          .tasks = {Task::Eval},
          .build = [](const std::string& config, const std::string& source, Rng& rng) -> std::shared_ptr<Module> {
            nlohmann::json j = nlohmann::json::parse(config);
            QKV_CHECK(j.value("width", 0) > 0, source, ": width must be positive");
            return std::make_shared<TinyModel>(j.at("width").get<int64_t>(), rng);
          },
          .config_json = [](const Module& m) {
            return nlohmann::json{{"arch", "tiny_test"}, {"width", dynamic_cast<const TinyModel&>(m).width}}.dump();
          }};
}

TEST(Registry, AFamilyAddedWithOneRegistrationIsSavedFoundAndLoaded) {
  if (std::none_of(families().begin(), families().end(), [](const Family& f) { return f.arch == "tiny_test"; }))
    register_family(tiny_family());  // the one line a new family needs
  EXPECT_THROW(register_family(tiny_family()), Error);  // an arch is registered once
  const Family& tiny = find_family("tiny_test", "test");
  Rng rng(3);
  TinyModel model(3, rng);
  const std::string dir = ::testing::TempDir() + "/qkv_tiny_family";
  std::filesystem::remove_all(dir);
  save_model_folder(dir, tiny, model, nullptr, "{}\n");
  for (const char* f : {"config.json", "model.safetensors", "trainer_state.json"})
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + f)) << f;
  EXPECT_EQ(load_safetensors(dir + "/model.safetensors").metadata.at("arch"), "tiny_test");
  ModelFolder back = load_model_folder(dir);
  EXPECT_EQ(back.family->arch, "tiny_test");
  EXPECT_EQ(back.tokenizer, nullptr);
  EXPECT_FALSE(back.model->is_training());
  EXPECT_TRUE(testing::all_close(dynamic_cast<TinyModel&>(*back.model).weight, model.weight, 0, 0));
  EXPECT_EQ(error_of([&] { load_model_folder(dir, Task::Generate, "generate"); }),
            "generate: " + dir + " holds a tiny test model (arch 'tiny_test'), which serves eval; generate needs a "
            "model that does (arch decoder)");
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, TextFamiliesKeepTheirTokenizerAndCheckItsSize) {
  const std::string dir = ::testing::TempDir() + "/qkv_checkpoint_text";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(legacy("transformer"), dir);
  TranslationModel m = load_translation_model(dir);
  save_model_folder(dir, find_family("transformer", dir), *m.model, m.tokenizer.get(), "");
  TranslationModel again = load_translation_model(dir);
  EXPECT_EQ(again.tokenizer->size(), m.tokenizer->size());
  nlohmann::json config = nlohmann::json::parse(read_file(dir + "/config.json"));
  config["vocab_size"] = m.tokenizer->size() + 1;
  write_file_atomic(dir + "/config.json", config.dump());
  EXPECT_EQ(error_of([&] { load_translation_model(dir); }),
            dir + ": tokenizer has " + std::to_string(m.tokenizer->size()) + " tokens, config.json says vocab_size " +
                std::to_string(m.tokenizer->size() + 1));
  std::filesystem::remove_all(dir);
}

// A model converted to bf16 or int8 (as qkv convert does) and saved loads
// back in that dtype with the same weights and the same outputs; a Hugging
// Face folder's tokenizer.json travels with it. The load takes no more memory
// on the way than the model holds after it plus two tensors as float32 (the
// tied head's copy is made from the float32 embedding): building the Linear
// weights in float32 first, as until 2026-12-05, fails that for every dtype
// (peaks of 341, 341 and 311 KB against bounds of 271, 267 and 236 KB; the
// 100M Llama's bf16 folder peaked at 674 MB resident, now 338 MB). An int8 weight without
// its scales, or with a value the format does not hold, is one error naming
// the file and the tensor.
TEST(Checkpoint, ConvertedFoldersLoadInTheirDtype) {
  const std::string dir = ::testing::TempDir() + "/qkv_checkpoint_converted";
  const std::string hf = std::string(QKV_FIXTURES_DIR) + "/hf/llama";
  NoGradGuard no_grad;
  const Tensor ids = Tensor::from_ints({1, 7, 30, 4, 9, 2}, {1, 6});
  for (DType dtype : {DType::BF16, DType::F16, DType::I8}) {
    std::filesystem::remove_all(dir);
    ModelFolder m = load_model_folder(hf);
    m.model->convert_linear_weights(dtype);
    save_model_folder(dir, *m.family, *m.model, m.tokenizer.get(), "");
    uint64_t largest = 0;
    const SafetensorsReader file(dir + "/model.safetensors");
    for (const SafetensorsEntry& e : file.entries())
      largest = std::max<uint64_t>(largest, (uint64_t)shape_numel(e.shape) * sizeof(float));
    const uint64_t base = allocator_stats().bytes_in_use;
    reset_peak_bytes();
    ModelFolder again = load_model_folder(dir);
    const uint64_t held = allocator_stats().bytes_in_use - base, peak = allocator_stats().peak_bytes_in_use - base;
    EXPECT_LE(peak, held + 2 * largest) << dtype_name(dtype) << ": the load took " << peak
                                        << " bytes at its peak for a " << held << "-byte model, largest tensor "
                                        << largest << " bytes as float32";
    EXPECT_EQ(again.model->linear_weight_dtype(), dtype);
    const StateDict before = m.model->state_dict(), after = again.model->state_dict();
    ASSERT_EQ(before.size(), after.size());
    for (const auto& [name, t] : before) {
      ASSERT_EQ(after.at(name).dtype(), t.dtype()) << name;
      EXPECT_EQ(std::memcmp(after.at(name).raw_data(), t.contiguous().raw_data(), t.numel() * dtype_size(t.dtype())), 0)
          << name;
    }
    auto& lm = dynamic_cast<DecoderLM&>(*m.model);
    auto& lm_again = dynamic_cast<DecoderLM&>(*again.model);
    EXPECT_TRUE(testing::all_close(lm_again.forward(ids), lm.forward(ids), 0, 0)) << dtype_name(dtype);
    const std::string text = "hello 世界 🙂";
    EXPECT_EQ(again.tokenizer->encode(text), m.tokenizer->encode(text));
    EXPECT_EQ(again.tokenizer->specials().eos, m.tokenizer->specials().eos);
    const Metadata meta = load_safetensors(dir + "/model.safetensors").metadata;
    EXPECT_EQ(meta.at("linear_weights"), dtype_name(dtype));
    EXPECT_EQ(meta.count("int8_format"), dtype == DType::I8 ? 1u : 0u);
  }
  // The int8 folder, broken two ways.
  const std::string weights = dir + "/model.safetensors";
  StateDict state = load_safetensors(weights).as_map();
  const Tensor scale = state.at("layers.0.self_attn.q_proj.weight_scale");
  state.erase("layers.0.self_attn.q_proj.weight_scale");
  save_safetensors(weights, state);
  EXPECT_EQ(error_of([&] { load_model_folder(dir); }),
            weights + ": load_state_dict: the int8 weight 'layers.0.self_attn.q_proj.weight' has no "
                      "'layers.0.self_attn.q_proj.weight_scale'");
  state["layers.0.self_attn.q_proj.weight_scale"] = scale;
  Tensor q = state.at("layers.1.mlp.w3.weight").clone();
  q.data<int8_t>()[5] = -128;
  state["layers.1.mlp.w3.weight"] = q;
  save_safetensors(weights, state);
  EXPECT_EQ(error_of([&] { load_model_folder(dir); }),
            weights + ": load_state_dict: 'layers.1.mlp.w3.weight': int8 weight value -128 at [0, 5] (the format "
                      "holds -127..127)");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qkv
