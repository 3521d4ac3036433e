#include "kernels/dropout.h"

namespace packbert::kernels {

uint64_t dropout_key(uint64_t step, uint32_t layer, uint32_t site) {
  return mix64(step * kGolden64 ^ (static_cast<uint64_t>(layer) << 32 | site));
}

template <typename T>
void dropout_forward(T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t key,
                     uint64_t first) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const DropoutMask mask(seed, key, p);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i)
    out[i] = mask.keep(first + static_cast<uint64_t>(i)) ? inp[i] * scale : T(0);
}

template <typename T>
void dropout_backward(T* dinp, const T* dout, int64_t n, double p, uint64_t seed, uint64_t key,
                      uint64_t first) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const DropoutMask mask(seed, key, p);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i)
    dinp[i] += mask.keep(first + static_cast<uint64_t>(i)) ? dout[i] * scale : T(0);
}

template void dropout_forward<float>(float*, const float*, int64_t, double, uint64_t, uint64_t,
                                     uint64_t);
template void dropout_forward<double>(double*, const double*, int64_t, double, uint64_t, uint64_t,
                                      uint64_t);
template void dropout_backward<float>(float*, const float*, int64_t, double, uint64_t, uint64_t,
                                      uint64_t);
template void dropout_backward<double>(double*, const double*, int64_t, double, uint64_t, uint64_t,
                                       uint64_t);

}  // namespace packbert::kernels
