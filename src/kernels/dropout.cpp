#include "kernels/dropout.h"

namespace packbert::kernels {

uint64_t dropout_key(uint64_t step, uint32_t layer, uint32_t site) {
  return mix64(step * kGolden64 ^ (static_cast<uint64_t>(layer) << 32 | site));
}

namespace {

// out[i] = (Accumulate: out[i] +) in[i] / (1 - p) where the mask keeps element first + i, else 0:
// dropout's forward, and its backward (the same mask and scale on the output's gradient).
template <bool Accumulate, typename T>
void masked_scale(T* out, const T* in, int64_t n, double p, uint64_t seed, uint64_t key,
                  uint64_t first) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const DropoutMask mask(seed, key, p);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T v = mask.keep(first + static_cast<uint64_t>(i)) ? in[i] * scale : T(0);
    if constexpr (Accumulate)
      out[i] += v;
    else
      out[i] = v;
  }
}

}  // namespace

template <typename T>
void dropout_forward(T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t key,
                     uint64_t first) {
  masked_scale<false>(out, inp, n, p, seed, key, first);
}

template <typename T>
void dropout_backward(T* dinp, const T* dout, int64_t n, double p, uint64_t seed, uint64_t key,
                      uint64_t first) {
  masked_scale<true>(dinp, dout, n, p, seed, key, first);
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
