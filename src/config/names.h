// Internal: the config-file names of the enums that configs hold, one table
// per enum (read, written and listed in errors from here).
#pragma once

#include "qkv/blocks.h"
#include "qkv/ops.h"
#include "qkv/position.h"
#include "src/config/fields.h"

namespace qkv::config {

template <>
struct EnumNames<Activation> {
  static constexpr std::pair<Activation, const char*> values[] = {{Activation::Relu, "relu"},
                                                                  {Activation::Gelu, "gelu"},
                                                                  {Activation::GeluTanh, "gelu_tanh"},
                                                                  {Activation::Silu, "silu"},
                                                                  {Activation::Tanh, "tanh"}};
};

template <>
struct EnumNames<NormKind> {
  static constexpr std::pair<NormKind, const char*> values[] = {{NormKind::LayerNorm, "layernorm"},
                                                                {NormKind::RMSNorm, "rmsnorm"}};
};

template <>
struct EnumNames<MLPKind> {
  static constexpr std::pair<MLPKind, const char*> values[] = {
      {MLPKind::Dense, "dense"}, {MLPKind::SwiGLU, "swiglu"}, {MLPKind::MoE, "moe"}};
};

template <>
struct EnumNames<RopeScalingKind> {
  static constexpr std::pair<RopeScalingKind, const char*> values[] = {{RopeScalingKind::Llama3, "llama3"},
                                                                       {RopeScalingKind::Linear, "linear"},
                                                                       {RopeScalingKind::Yarn, "yarn"},
                                                                       {RopeScalingKind::Dynamic, "dynamic"}};
};

template <>
struct EnumNames<PositionKind> {
  static constexpr std::pair<PositionKind, const char*> values[] = {{PositionKind::Sinusoidal, "sinusoidal"},
                                                                    {PositionKind::Learned, "learned"},
                                                                    {PositionKind::Rope, "rope"},
                                                                    {PositionKind::Sinusoidal2d, "sinusoidal_2d"},
                                                                    {PositionKind::SinusoidalHalves, "sinusoidal_halves"}};
};

template <>
struct EnumNames<QkvLayout> {
  static constexpr std::pair<QkvLayout, const char*> values[] = {{QkvLayout::Fused, "fused"},
                                                                 {QkvLayout::Separate, "separate"}};
};

// The keys of BlockConfig (src/config/block_config.cpp), for the tables of
// the configs that derive from it.
const Fields<BlockConfig>& block_fields();

}  // namespace qkv::config
