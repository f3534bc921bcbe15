#include "qkv/rng.h"

#include <cmath>

namespace qkv {

float Rng::normal_at(uint64_t i) const {
  // Box-Muller: z = sqrt(-2 ln u1) cos(2 pi u2), u1 in (0, 1].
  uint64_t a = mix64(seed_ ^ 0x6e6f726d616c ^ mix64(2 * i));
  uint64_t b = mix64(seed_ ^ 0x6e6f726d616c ^ mix64(2 * i + 1));
  double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
  return (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace qkv
