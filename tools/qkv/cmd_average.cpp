// qkv average: checkpoint averaging, the mean of several saves of one model.
#include <cstdio>

#include "qkv/checkpoint.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {
namespace {

struct AverageArgs {
  std::vector<std::string> models;
  std::string out;
};

int run_average(const AverageArgs& a) {
  average_model_folders(a.models, a.out);
  std::printf("averaged %zu model folders into %s\n", a.models.size(), a.out.c_str());
  return 0;
}

}  // namespace

Run add_average(CLI::App& app) {
  auto args = std::make_shared<AverageArgs>();
  CLI::App* sub = app.add_subcommand(
      "average", "Average the weights of several saves of one model (checkpoint averaging), e.g. the last few that "
                 "train's \"keep_checkpoints\" leaves in MODEL_DIR/checkpoints");
  sub->add_option("models", args->models, "Model folders of one model (same config and tokenizer), two or more")
      ->required();
  sub->add_option("--out", args->out, "Model folder to write")->required();
  return [args] { return run_average(*args); };
}

}  // namespace qkv::cli
