// The config field tables (src/config/fields.h): each key read with its type
// and range checked, written back, and unknown keys refused, with one error
// line naming the file and the key; every config survives a write and a read.
#include <nlohmann/json.hpp>

#include "qkv/conv_seq2seq.h"
#include "qkv/lm.h"
#include "qkv/lm_trainer.h"
#include "qkv/models.h"
#include "qkv/tokenizer.h"
#include "qkv/trainer.h"
#include "qkv/vit.h"
#include "qkv/vit_trainer.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::error_of;

TEST(ConfigFields, ErrorsNameTheFileTheKeyAndWhatIsAllowed) {
  auto decoder = [](const char* text) { return error_of([&] { DecoderConfig::from_json(text, "lm.json"); }); };
  EXPECT_EQ(decoder(R"({"d_modle": 8})"), "lm.json: unknown key 'd_modle'");
  EXPECT_EQ(decoder(R"({"d_model": "big"})"), "lm.json: 'd_model' has the wrong type (\"big\")");
  EXPECT_EQ(decoder(R"({"d_model": 8.5})"), "lm.json: 'd_model' has the wrong type (8.5)");
  EXPECT_EQ(decoder(R"({"d_model": 0})"), "lm.json: 'd_model' must be at least 1, got 0");
  EXPECT_EQ(decoder(R"({"dropout": 1})"), "lm.json: 'dropout' must be in [0, 1), got 1");
  EXPECT_EQ(decoder(R"({"rope_theta": 0})"), "lm.json: 'rope_theta' must be positive, got 0");
  EXPECT_EQ(decoder(R"({"norm": "batchnorm"})"), "lm.json: 'norm' is 'batchnorm', expected one of: layernorm, rmsnorm");
  EXPECT_EQ(decoder(R"({"activation": "tanh"})"),
            "lm.json: 'activation' is 'tanh', expected one of: relu, gelu, gelu_tanh, silu");
  EXPECT_EQ(decoder(R"({"positions": "sinusoidal_2d"})"),
            "lm.json: 'positions' is 'sinusoidal_2d', expected one of: sinusoidal, learned, rope, sinusoidal_halves");
  EXPECT_EQ(decoder(R"({"arch": "vit"})"), "lm.json: 'arch' is 'vit', expected 'decoder'");
  EXPECT_EQ(decoder(R"({"qk_norm": 1})"), "lm.json: 'qk_norm' has the wrong type (1)");
  EXPECT_EQ(decoder("[1]"), "lm.json: expected a JSON object");
  EXPECT_EQ(error_of([] { TrainOptions::from_json(R"({"train": {"stpes": 3}})", "t.json"); }),
            "t.json: unknown key 'train.stpes'");
  EXPECT_EQ(error_of([] { TrainOptions::from_json(R"({"train": {"schedule": "linear"}})", "t.json"); }),
            "t.json: 'train.schedule' is 'linear', expected one of: inverse_sqrt, cosine");
  EXPECT_EQ(error_of([] { VitTrainOptions::from_json(R"({"train": {"precision": "fp8"}})", "t.json"); }),
            "t.json: 'train.precision' is 'fp8', expected one of: f32, bf16");
  EXPECT_EQ(LmTrainOptions::from_json(R"({"train": {"precision": "bf16"}})", "t.json").precision, Precision::Bf16);
  EXPECT_EQ(TrainOptions::from_json(R"({"train": {}})", "t.json").precision, Precision::F32);
  EXPECT_EQ(TrainOptions::from_json(R"({"train": {}})", "t.json").adam_eps, 1e-8f);
  EXPECT_EQ(VitTrainOptions::from_json(R"({"train": {"adam_eps": 1e-4}})", "t.json").adam_eps, 1e-4f);
  EXPECT_EQ(error_of([] { LmTrainOptions::from_json(R"({"train": {"adam_eps": 0}})", "t.json"); }),
            "t.json: 'train.adam_eps' must be positive, got 0");
  EXPECT_EQ(error_of([] { LmTrainOptions::from_json(R"({"train": {"seed": -1}})", "t.json"); }),
            "t.json: 'train.seed' must not be negative, got -1");
  EXPECT_EQ(error_of([] { VitTrainOptions::from_json(R"({"train": []})", "t.json"); }),
            "t.json: 'train' must be an object");
  EXPECT_EQ(error_of([] { TokenizerConfig::from_json(R"({"type": "words"})", "t.json"); }),
            "t.json: 'tokenizer.type' is 'words', expected one of: char, sentencepiece, bytes, huggingface, marian, "
            "huggingface_sentencepiece");
  EXPECT_EQ(error_of([] { ViTConfig::from_json(R"({"image_size": 131072, "patch_size": 2})", "v.json"); }),
            "v.json: 'image_size' must be at most 65536, got 131072");
}

// issue 21: a size key past its limit is refused before anything is built;
// values of the wrong type are errors, never "internal error" or a silent cut.
TEST(ConfigFields, SizesAreBoundedAndTypesExact) {
  EXPECT_EQ(error_of([] { TransformerConfig::from_json(R"({"num_encoder_layers": 1000000000})", "t.json"); }),
            "t.json: 'num_encoder_layers' must be at most 1024, got 1000000000");
  EXPECT_EQ(error_of([] { ViTConfig::from_json(R"({"num_classes": 1099511627776})", "v.json"); }),
            "v.json: 'num_classes' must be at most 1048576, got 1099511627776");
  EXPECT_EQ(error_of([] { DecoderConfig::from_json(R"({"context": 1099511627776})", "d.json"); }),
            "d.json: 'context' must be at most 16777216, got 1099511627776");
  EXPECT_EQ(error_of([] { DecoderConfig::from_json(R"({"d_model": 1099511627776})", "d.json"); }),
            "d.json: 'd_model' must be at most 262144, got 1099511627776");
  EXPECT_EQ(error_of([] { TransformerConfig::from_json(R"({"max_len": 1099511627776})", "t.json"); }),
            "t.json: 'max_len' must be at most 16777216, got 1099511627776");
  EXPECT_EQ(error_of([] { TrainOptions::from_json(R"({"train": {"batch_tokens": 1099511627776}})", "t.json"); }),
            "t.json: 'train.batch_tokens' must be at most 1073741824, got 1099511627776");
  EXPECT_EQ(error_of([] { DecoderConfig::from_json(R"({"d_model": 18446744073709551615})", "d.json"); }),
            "d.json: 'd_model' is too large (18446744073709551615)");
  EXPECT_EQ(error_of([] { DecoderConfig::from_json(R"({"vocab_size": null})", "d.json"); }),
            "d.json: 'vocab_size' has the wrong type (null)");
  EXPECT_EQ(error_of([] { DecoderConfig::from_json(R"({"d_model": 32.5})", "d.json"); }),
            "d.json: 'd_model' has the wrong type (32.5)");
  EXPECT_EQ(error_of([] { DecoderConfig::from_json(R"({"rope_theta": 1e39})", "d.json"); }),
            "d.json: 'rope_theta' is out of range (1e+39)");
  EXPECT_EQ(error_of([] { DecoderConfig::from_json(R"({"arch": 5})", "d.json"); }),
            "d.json: 'arch' has the wrong type (5)");
}

// Written, read, written again: the same text, and every value away from its default survives.
template <class C>
void expect_round_trip(const C& c, const std::string& name) {
  const std::string once = c.to_json();
  const std::string twice = C::from_json(once, name).to_json();
  EXPECT_EQ(once, twice) << name;
}

TEST(ConfigFields, EveryConfigSurvivesAWriteAndARead) {
  DecoderConfig d = DecoderConfig::from_json(
      R"({"vocab_size": 50, "d_model": 24, "nhead": 6, "num_kv_heads": 2, "head_dim": 8, "num_layers": 3,
          "dim_feedforward": 40, "dropout": 0.25, "activation": "silu", "norm_first": false, "norm": "layernorm",
          "norm_eps": 0.001, "mlp": "moe", "num_experts": 3, "top_k": 2, "aux_loss_weight": 0.5, "qk_norm": true,
          "qk_norm_eps": 0.01, "positions": "learned", "rope_theta": 1e6, "qkv_layout": "separate",
          "q_bias": false, "k_bias": true, "v_bias": false, "out_bias": false, "context": 33, "tie_output": false})",
      "d");
  expect_round_trip(d, "decoder");
  const DecoderConfig back = DecoderConfig::from_json(d.to_json(), "d");
  EXPECT_EQ(back.head_dim, 8);
  EXPECT_EQ(back.rope_theta, 1e6f);
  EXPECT_EQ(back.norm_eps, 0.001f);
  EXPECT_EQ(back.qk_norm_eps, 0.01f);
  EXPECT_EQ(back.qkv_layout, QkvLayout::Separate);
  EXPECT_TRUE(!back.bias.q && back.bias.k && !back.bias.v && !back.bias.out);
  EXPECT_EQ(back.mlp, MLPKind::MoE);
  EXPECT_EQ(back.moe.aux_loss_weight, 0.5f);
  EXPECT_NE(d.to_json().find("\"norm_eps\": 0.001,"), std::string::npos) << "floats written shortest";

  TransformerConfig t = TransformerConfig::from_json(
      R"({"vocab_size": 50, "num_encoder_layers": 3, "num_decoder_layers": 1, "max_len": 77, "mlp": "swiglu",
          "positions": "rope", "norm": "rmsnorm", "qk_norm": true})",
      "t");
  expect_round_trip(t, "transformer");
  EXPECT_EQ(TransformerConfig::from_json(t.to_json(), "t").max_len, 77);
  // MoE keys are written only for an MoE MLP.
  EXPECT_EQ(t.to_json().find("num_experts"), std::string::npos);

  ViTConfig v = ViTConfig::from_json(
      R"({"image_size": 32, "patch_size": 8, "channels": 3, "d_model": 16, "mlp_ratio": 3.5, "num_classes": 3,
          "positions": "sinusoidal_2d", "pool": "cls", "class_names": ["a", "b", "c"]})",
      "v");
  expect_round_trip(v, "vit");
  EXPECT_EQ(ViTConfig::from_json(v.to_json(), "v").pool, Pool::Cls);

  expect_round_trip(RnnAttentionConfig::from_json(R"({"embed_dim": 5, "hidden": 7, "attention_dim": 9})", "r"), "rnn");
  expect_round_trip(ConvSeq2SeqConfig::from_json(R"({"d_model": 6, "kernel_size": 5, "nhead": 3})", "c"), "conv");
}

TEST(ConfigFields, AbsentKeysKeepEachConfigsDefaults) {
  // The block keys are shared, their defaults are not.
  const DecoderConfig d = DecoderConfig::from_json("{}", "d");
  const TransformerConfig t = TransformerConfig::from_json("{}", "t");
  EXPECT_EQ(d.positions, PositionKind::Rope);
  EXPECT_EQ(d.mlp, MLPKind::SwiGLU);
  EXPECT_EQ(d.norm, NormKind::RMSNorm);
  EXPECT_EQ(t.positions, PositionKind::Sinusoidal);
  EXPECT_EQ(t.mlp, MLPKind::Dense);
  EXPECT_EQ(t.norm, NormKind::LayerNorm);
  EXPECT_EQ(d.rope_theta, 10000.0f);
  EXPECT_EQ(t.norm_eps, 1e-5f);
  const TrainOptions o = TrainOptions::from_json("{}", "t");
  EXPECT_EQ(o.schedule, LrSchedule::InverseSqrt);
  EXPECT_EQ(o.steps, TrainOptions{}.steps);
}

// Found by the config fuzzer: a key holding a newline (written "voc\nab_size" in the JSON) made
// "unknown key" a two-line error. Every qkv::Error is one line, whatever it quotes.
TEST(ConfigFields, ErrorsQuotingControlCharactersStayOneLine) {
  const std::string e = testing::error_of([] { TransformerConfig::from_json("{\"d_\\nmodel\\t\\u001b\": 8}", "c.json"); });
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  EXPECT_NE(e.find("c.json: unknown key 'd_\\nmodel\\t\\x1b'"), std::string::npos) << e;
}

}  // namespace
}  // namespace qkv
