// Dropout from a counter-based generator: whether element i of a tensor is kept is a pure
// function of (seed, key, i), where key names the tensor (step, layer, which dropout). Results
// therefore do not depend on thread count, and a recomputed layer draws the same mask.
#pragma once

#include <cmath>
#include <cstdint>

#include "rng.h"

namespace packbert::kernels {

// A key naming one dropout site at one training step.
uint64_t dropout_key(uint64_t step, uint32_t layer, uint32_t site);

// Uniform in [0, 1) for element i of stream (seed, key): the top 53 bits of
// mix(mix(seed ^ key) + i * golden) scaled by 2^-53.
inline double dropout_uniform(uint64_t seed, uint64_t key, uint64_t i) {
  const uint64_t h = counter_bits(seed, key, i);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// One stream's keep decisions without floating point: keep(i) == (dropout_uniform(...) >= p)
// exactly, since u >= p <=> (h >> 11) >= ceil(p * 2^53) for the integer h >> 11. The loop form
// vectorises (AVX-512's 64-bit multiplies).
struct DropoutMask {
  CounterStream bits;
  uint64_t threshold;
  DropoutMask(uint64_t seed, uint64_t key, double p)
      : bits(seed, key), threshold(static_cast<uint64_t>(std::ceil(std::ldexp(p, 53)))) {}
  bool keep(uint64_t i) const { return (bits(i) >> 11) >= threshold; }
};

// out[i] = keep(first + i) ? inp[i] / (1 - p) : 0. p in [0, 1). `first` places the n elements
// in a larger tensor (a share of a batch split across processes draws the whole batch's mask).
template <typename T>
void dropout_forward(T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t key,
                     uint64_t first = 0);
// dinp[i] += keep(first + i) ? dout[i] / (1 - p) : 0, with the same mask as the forward pass.
template <typename T>
void dropout_backward(T* dinp, const T* dout, int64_t n, double p, uint64_t seed, uint64_t key,
                      uint64_t first = 0);

}  // namespace packbert::kernels
