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

// Stochastic rounding (Gupta et al. 2015): x rounds to one of its two bf16 neighbours, up with
// probability equal to its distance from the lower one in units of the gap, so the rounding is
// unbiased on average. `random` supplies 16 uniform bits: added below the 16 bits bf16 keeps,
// the sum is truncated. Infinities and NaN round to nearest; a finite x within a gap of the
// largest bf16 may round up to infinity, as it would by any rounding of a larger value.
inline bf16 to_bf16_stochastic(float x, uint16_t random) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return to_bf16(x);
  return bf16{static_cast<uint16_t>((u + random) >> 16)};
}

// True when x is neither infinite nor NaN, in integer operations on the exponent bits (which
// vectorise, unlike std::isfinite).
inline bool is_finite(bf16 x) {
  return (x.bits & 0x7f80u) != 0x7f80u;
}
inline bool is_finite(float x) {
  return (std::bit_cast<uint32_t>(x) & 0x7f800000u) != 0x7f800000u;
}

// out[i] = to_bf16(in[i]), [n]; in parallel over chunks for large n.
void to_bf16(bf16* out, const float* in, int64_t n);
// out[i] = to_float(in[i]), [n].
void to_float(float* out, const bf16* in, int64_t n);

}  // namespace packbert::kernels
