// trainer_state.safetensors on `train --resume`: the state of a real run
// (tests/fixtures/folders/transformer) with its integers edited by the input,
// then resumed on the data it was trained on. Each 10-byte record of the input
// sets one element of one I64 tensor: tensor (1 byte), element (1 byte),
// value (8 bytes); a first byte with the high bit set instead sets one
// metadata value to the record's last 8 bytes as text. An input that starts
// with "RAW" is the whole file instead, for the header and layout.
#include <cstring>
#include <filesystem>

#include "qkv/checkpoint.h"
#include "qkv/data.h"
#include "qkv/infer.h"
#include "qkv/trainer.h"
#include "tests/fuzz/fuzz.h"

namespace {

namespace fs = std::filesystem;

struct Fixture {
  std::string pristine = std::string(QKV_FIXTURES_DIR) + "/folders/transformer";
  std::string dir = fs::path(qkv::fuzz::scratch_file("unused", "")).parent_path().string() + "/resume";
  qkv::SafetensorsFile state = qkv::load_safetensors(pristine + "/trainer_state.safetensors");
  std::vector<qkv::SentencePair> train, valid;
  Fixture() {
    std::vector<qkv::SentencePair> pairs = qkv::synth_zh_ja(200, 1);
    train.assign(pairs.begin(), pairs.end() - 10);
    valid.assign(pairs.end() - 10, pairs.end());
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture f;
  std::string bytes;
  if (size >= 3 && std::memcmp(data, "RAW", 3) == 0) {
    bytes = qkv::fuzz::as_string(data + 3, size - 3);
  } else {
    std::vector<std::pair<std::string, qkv::Tensor>> tensors;
    std::vector<size_t> ints;  // the I64 tensors, by position
    for (auto& [name, t] : f.state.tensors) {
      tensors.emplace_back(name, t.clone());
      if (t.dtype() == qkv::DType::I64 && t.numel() > 0) ints.push_back(tensors.size() - 1);
    }
    qkv::Metadata metadata = f.state.metadata;
    for (size_t at = 0; at + 10 <= size; at += 10) {
      int64_t value;
      std::memcpy(&value, data + at + 2, 8);
      if (data[at] & 0x80) {
        if (metadata.empty()) continue;
        auto it = std::next(metadata.begin(), data[at + 1] % metadata.size());
        it->second = qkv::fuzz::as_string(data + at + 2, 8);
      } else if (!ints.empty()) {
        qkv::Tensor& t = tensors[ints[data[at] % ints.size()]].second;
        t.data<int64_t>()[data[at + 1] % t.numel()] = value;
      }
    }
    try {
      bytes = qkv::serialize_safetensors(tensors, metadata);
    } catch (const qkv::Error&) {
      return 0;  // metadata qkv cannot write (not UTF-8): no file to resume from
    }
  }
  fs::remove_all(f.dir);
  fs::copy(f.pristine, f.dir);
  std::ofstream(f.dir + "/trainer_state.safetensors", std::ios::binary | std::ios::trunc) << bytes;
  qkv::fuzz::expect_clean([&] {
    qkv::TranslationModel m = qkv::load_translation_model(f.dir);
    qkv::TrainOptions o;
    o.steps = 3, o.batch_tokens = 128, o.eval_every = 2, o.eval_sentences = 2, o.resume = true;
    qkv::train_translation(m, f.train, f.valid, o, f.dir, {});
  });
  return 0;
}
