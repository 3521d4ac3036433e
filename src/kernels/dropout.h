// Dropout from a counter-based generator: whether element i of a tensor is kept is a pure
// function of (seed, key, i), where key names the tensor (step, layer, which dropout). Results
// therefore do not depend on thread count, and a recomputed layer draws the same mask.
#pragma once

#include <cstdint>

namespace packbert::kernels {

// A key naming one dropout site at one training step.
uint64_t dropout_key(uint64_t step, uint32_t layer, uint32_t site);
// Uniform in [0, 1) for element i of stream (seed, key).
double dropout_uniform(uint64_t seed, uint64_t key, uint64_t i);

// out[i] = keep(i) ? inp[i] / (1 - p) : 0. p in [0, 1).
template <typename T>
void dropout_forward(T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t key);
// dinp[i] += keep(i) ? dout[i] / (1 - p) : 0, with the same mask as the forward pass.
template <typename T>
void dropout_backward(T* dinp, const T* dout, int64_t n, double p, uint64_t seed, uint64_t key);

}  // namespace packbert::kernels
