#include "kernels/tensor.h"

#include <stdexcept>

namespace packbert::kernels {

void to_bf16(bf16* out, const float* in, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

void to_float(float* out, const bf16* in, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
}

void to_f16(f16* out, const float* in, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = to_f16(in[i]);
}

void to_float(float* out, const f16* in, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
}

namespace {

template <typename H>
void widen16(float* out, const void* in, int64_t n) {
  to_float(out, static_cast<const H*>(in), n);
}
template <typename H>
void narrow16(void* out, const float* in, int64_t n) {
  if constexpr (std::is_same_v<H, bf16>)
    to_bf16(static_cast<bf16*>(out), in, n);
  else
    to_f16(static_cast<f16*>(out), in, n);
}
template <typename W>
void widen_plain(float* out, const void* in, int64_t n) {
  const W* w = static_cast<const W*>(in);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(w[i]);
}
template <typename W>
void narrow_plain(void* out, const float* in, int64_t n) {
  W* w = static_cast<W*>(out);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) w[i] = static_cast<W>(in[i]);
}

// Indexed by DType.
constexpr DTypeTraits kTraits[] = {
    {"f32", "F32", "float32", sizeof(float), false, widen_plain<float>, narrow_plain<float>},
    {"f64", "F64", "float64", sizeof(double), false, widen_plain<double>, narrow_plain<double>},
    {"bf16", "BF16", "bfloat16", sizeof(bf16), true, widen16<bf16>, narrow16<bf16>},
    {"f16", "F16", "float16", sizeof(f16), true, widen16<f16>, narrow16<f16>},
};

}  // namespace

const DTypeTraits& traits(DType t) {
  const auto i = static_cast<size_t>(t);
  if (i >= std::size(kTraits)) throw std::logic_error("no such DType");
  return kTraits[i];
}

}  // namespace packbert::kernels
