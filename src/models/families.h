// Internal: the built-in model families, one per folder of src/models/, each
// defined in its folder's family.cpp and listed once in src/models/registry.cpp.
#pragma once

#include "qkv/registry.h"

namespace qkv::builtin {

Family transformer();
Family rnn_attention();
Family conv();
Family decoder();
Family vit();

}  // namespace qkv::builtin
