// Rotary position embedding's angles, shared by every backend so they agree to the bit: for a
// token at position p (inside its own sequence of a pack) and frequency i of a head of D
// channels, angle = p * inv_freq_i, computed as transformers' ModernBertRotaryEmbedding does in
// float32: inv_freq_i = 1 / theta^((2i) / D), each step rounded to float32, and the product of
// p and inv_freq_i rounded to float32. cos and sin of that float angle are then taken in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace packbert::kernels {

inline std::vector<float> rotary_inv_freq(int D, double theta) {
  std::vector<float> f(static_cast<size_t>(D / 2));
  for (int i = 0; i < D / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(D);
    const float p = static_cast<float>(
        std::pow(static_cast<double>(static_cast<float>(theta)), static_cast<double>(e)));
    f[static_cast<size_t>(i)] = 1.0f / p;
  }
  return f;
}

inline float rotary_angle(int32_t pos, float inv_freq) {
  return static_cast<float>(pos) * inv_freq;
}

}  // namespace packbert::kernels
