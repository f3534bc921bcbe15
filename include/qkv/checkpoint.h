// qkv/checkpoint.h — the model folder, one reader and one writer for every family.
//
// A model folder holds
//   config.json                the model config with its "arch" (qkv/registry.h) and, for
//                              text models, its "tokenizer" (qkv/tokenizer.h)
//   model.safetensors          the weights (metadata: format qkv, arch)
//   tokenizer.json | .model    the vocabulary, when the tokenizer has one
//   trainer_state.json         step, metrics history (written by the trainers)
//   trainer_state.safetensors  what --resume needs (src/train/train_state.h)
// Every file is written atomically (a temporary file renamed into place), so a
// crash never leaves a half-written one.
#pragma once

#include <memory>
#include <string>

#include "qkv/registry.h"
#include "qkv/tokenizer.h"

namespace qkv {

struct ModelFolder {
  const Family* family = nullptr;
  std::shared_ptr<Module> model;               // in eval mode
  std::shared_ptr<const Tokenizer> tokenizer;  // text families; null for images and Hugging Face folders
};

// How load_model_folder builds the model it reads.
struct LoadOptions {
  // The dtype the Linear weights are to run in, as --dtype names it: "f32",
  // "bf16", "f16" or "int8" (Module::convert_linear_weights), or "" for what
  // the files hold (float32, or the bf16/int8 of a folder qkv convert wrote).
  // The weights are built in it and filled from the files one tensor at a
  // time, so a bfloat16 checkpoint loaded for bf16 never has a float32 copy
  // of its Linear weights, and a checkpoint is never held twice.
  std::string dtype;
};

// Reads `dir`: its family from config.json, the tokenizer (whose size must be
// the config's vocab_size), the model, every weight (Linear weights that qkv
// convert wrote in bf16 or int8 stay so). Each problem is one error
// naming the file. A Hugging Face folder (config.json with "architectures",
// model.safetensors or its shards) of an architecture a family reads loads as
// that family's model, its weights renamed and converted to F32, with its
// tokenizer.json when it has one (else tokenizer null: the model runs on
// token ids). An unknown options.dtype is an error listing the names.
ModelFolder load_model_folder(const std::string& dir, const LoadOptions& options = {});

// The weight files of a model folder: model.safetensors, or else the shards
// model.safetensors.index.json lists (each once, by name); an index that is
// not one, or names a file outside the folder, is an error naming it.
std::vector<std::string> weight_files(const std::string& dir);
// Like load_model_folder, after family_for_task: a folder of the wrong kind is
// the registry's error naming `command`.
ModelFolder load_model_folder(const std::string& dir, Task task, const std::string& command,
                              const LoadOptions& options = {});

// Writes config.json (the family's config of `model`, plus the tokenizer's
// config), the tokenizer's file, model.safetensors and, when not empty,
// trainer_state.json, creating `dir` if needed.
void save_model_folder(const std::string& dir, const Family& family, const Module& model, const Tokenizer* tokenizer,
                       const std::string& trainer_state_json);

// Checkpoint averaging (as fairseq's average_checkpoints and Marian's
// averaged models): the element-wise mean of the weights of `dirs`, folders
// of one model (the same family, config and tokenizer, which is checked),
// written to `out` as a model folder with the first folder's config and
// tokenizer. Averaging the last few saves of a run often scores a little
// higher than any one of them.
void average_model_folders(const std::vector<std::string>& dirs, const std::string& out);

}  // namespace qkv
