// qkv convert: a model folder with its Linear weights in another dtype
// (bfloat16, float16 or blockwise int8, docs/low-precision.md), written as a model
// folder that every command loads as it loads any other.
#include <cstdio>

#include "qkv/chat.h"
#include <filesystem>

#include "qkv/checkpoint.h"
#include "qkv/nn.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {
namespace {

struct ConvertArgs {
  std::string model, out, dtype;
};

int run_convert(const ConvertArgs& a) {
  namespace fs = std::filesystem;
  QKV_CHECK(!fs::exists(a.out) || fs::weakly_canonical(a.out) != fs::weakly_canonical(a.model),
            "convert: --out ", a.out, " is the model folder itself; write the converted model to another folder");
  NoGradGuard no_grad;
  // Loaded in the dtype (a bf16 checkpoint without a float32 copy), so the
  // conversion below only counts the Linear weights.
  ModelFolder m = load_model_folder(a.model, {a.dtype});
  uint64_t before = 0;  // the weights as the folder stores them
  for (const std::string& file : weight_files(a.model)) before += fs::file_size(file);
  const int64_t converted = m.model->convert_linear_weights(a.dtype);
  QKV_CHECK(converted > 0, "convert: ", a.model, " has no Linear weights to convert");
  const nlohmann::ordered_json note = {{"converted_from", a.model}, {"linear_weights", a.dtype}};
  save_model_folder(a.out, *m.family, *m.model, m.tokenizer.get(), note.dump(2) + "\n");
  copy_chat_template(a.model, a.out);
  const uint64_t after = m.model->parameter_bytes();
  std::printf("%s: %lld Linear weights in %s; weight files %.2f MB -> weights %.2f MB, written to %s\n",
              a.model.c_str(), (long long)converted, a.dtype.c_str(), before / 1e6, after / 1e6, a.out.c_str());
  return 0;
}

}  // namespace

Run add_convert(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* sub = app.add_subcommand(
      "convert", "Write a model folder (qkv or Hugging Face) as a qkv folder with every Linear weight in bf16, f16 or "
                 "int8 (embeddings, norms and biases stay float32); it then loads anywhere, in that dtype");
  sub->add_option("--model", args->model, "Model folder to read")->required();
  sub->add_option("--out", args->out, "Model folder to write")->required();
  sub->add_option("--dtype", args->dtype,
                  "bf16 (bfloat16: half the bytes), f16 (IEEE half: half the bytes, 3 more mantissa bits, a narrower "
                  "range), int8 (int8 with a float32 scale per 32 weights: 1.125 bytes a weight) or f32")
      ->required()
      ->check(CLI::IsMember({"f32", "bf16", "f16", "int8"}));
  return [args] { return run_convert(*args); };
}

}  // namespace qkv::cli
