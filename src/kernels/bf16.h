// bfloat16: the top 16 bits of an IEEE fp32 (8 exponent bits, 7 mantissa bits), the storage type
// of the `bf16` precision. Values are converted with round-to-nearest-even (what the AVX512-BF16
// VCVTNEPS2BF16 instruction and oneDNN do). Arithmetic always happens in fp32.
#pragma once

#include <bit>
#include <cstdint>

namespace packbert::kernels {

struct bf16 {
  uint16_t bits = 0;
};

inline float to_float(bf16 x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16);
}

// Round to nearest, ties to even; NaN stays NaN (quiet), infinities and overflow to infinity
// as in IEEE rounding.
inline bf16 to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(rounded >> 16)};
}

// out[i] = to_bf16(in[i]), [n]; in parallel over chunks for large n.
void to_bf16(bf16* out, const float* in, int64_t n);
// out[i] = to_float(in[i]), [n].
void to_float(float* out, const bf16* in, int64_t n);

}  // namespace packbert::kernels
