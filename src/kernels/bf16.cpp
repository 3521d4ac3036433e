#include "kernels/bf16.h"

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

}  // namespace packbert::kernels
