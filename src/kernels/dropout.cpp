#include "kernels/dropout.h"

namespace packbert::kernels {

namespace {

uint64_t mix(uint64_t z) {  // splitmix64's finaliser: a strong 64-bit bijection
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t dropout_key(uint64_t step, uint32_t layer, uint32_t site) {
  return mix(step * 0x9e3779b97f4a7c15ULL ^ (static_cast<uint64_t>(layer) << 32 | site));
}

double dropout_uniform(uint64_t seed, uint64_t key, uint64_t i) {
  uint64_t h = mix(mix(seed ^ key) + i * 0x9e3779b97f4a7c15ULL);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

template <typename T>
void dropout_forward(T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t key) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    out[i] = dropout_uniform(seed, key, static_cast<uint64_t>(i)) >= p ? inp[i] * scale : T(0);
}

template <typename T>
void dropout_backward(T* dinp, const T* dout, int64_t n, double p, uint64_t seed, uint64_t key) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    if (dropout_uniform(seed, key, static_cast<uint64_t>(i)) >= p) dinp[i] += dout[i] * scale;
}

template void dropout_forward<float>(float*, const float*, int64_t, double, uint64_t, uint64_t);
template void dropout_forward<double>(double*, const double*, int64_t, double, uint64_t, uint64_t);
template void dropout_backward<float>(float*, const float*, int64_t, double, uint64_t, uint64_t);
template void dropout_backward<double>(double*, const double*, int64_t, double, uint64_t, uint64_t);

}  // namespace packbert::kernels
