// Internal: the CPU flash attention kernels' tile sizes (Dao et al. 2022,
// 2023). The kernels themselves are declared with the rest in
// src/kernels/kernels.h; their reference twin is qkv::ref's naive pair
// (src/kernels/ref/attention.cpp), and the tests also compare them with the
// attention composed of ops.
#pragma once

#include <cstdint>

namespace qkv::cpu {

// Tile sizes (queries x keys per tile): a 64 x 128 score tile is 32 KiB, and
// 128 x 128 or 128 x 256 measured no faster here.
constexpr int64_t kFlashQueryTile = 64;
constexpr int64_t kFlashKeyTile = 128;

}  // namespace qkv::cpu
