// The cpu backend's BERT embeddings (cpu/layers.h): word + position + token type rows gathered
// and summed per token, and their gradients scattered back.
#include <cstdint>

#include "kernels/cpu/layers.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

template <typename T>
void embedding_forward(T* out, const int32_t* ids, const int32_t* pos, const int32_t* types,
                       const T* word, const T* position, const T* token_type, int n_tokens, int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < n_tokens; ++t) {
    const T* w = word + static_cast<int64_t>(ids[t]) * C;
    const T* p = position + static_cast<int64_t>(pos[t]) * C;
    const T* y = token_type + static_cast<int64_t>(types[t]) * C;
    T* o = out + static_cast<int64_t>(t) * C;
    for (int c = 0; c < C; ++c) o[c] = w[c] + p[c] + y[c];
  }
}

void embedding_forward(float* out, const int32_t* ids, const int32_t* pos, const int32_t* types,
                       const bf16* word, const float* position, const float* token_type,
                       int n_tokens, int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < n_tokens; ++t) {
    const bf16* w = word + static_cast<int64_t>(ids[t]) * C;
    const float* p = position + static_cast<int64_t>(pos[t]) * C;
    const float* y = token_type + static_cast<int64_t>(types[t]) * C;
    float* o = out + static_cast<int64_t>(t) * C;
    for (int c = 0; c < C; ++c) o[c] = to_float(w[c]) + p[c] + y[c];
  }
}

template <typename T>
void embedding_backward(T* dword, T* dposition, T* dtoken_type, const T* dout, const int32_t* ids,
                        const int32_t* pos, const int32_t* types, int n_tokens, int C) {
  // Rows repeat across tokens (same word, same position), so split work by channel: every
  // thread owns a slice of columns and scatters all tokens into it without races.
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c)
    for (int t = 0; t < n_tokens; ++t) {
      T g = dout[static_cast<int64_t>(t) * C + c];
      dword[static_cast<int64_t>(ids[t]) * C + c] += g;
      dposition[static_cast<int64_t>(pos[t]) * C + c] += g;
      dtoken_type[static_cast<int64_t>(types[t]) * C + c] += g;
    }
}

template void embedding_forward<float>(float*, const int32_t*, const int32_t*, const int32_t*,
                                       const float*, const float*, const float*, int, int);
template void embedding_forward<double>(double*, const int32_t*, const int32_t*, const int32_t*,
                                        const double*, const double*, const double*, int, int);
template void embedding_backward<float>(float*, float*, float*, const float*, const int32_t*,
                                        const int32_t*, const int32_t*, int, int);
template void embedding_backward<double>(double*, double*, double*, const double*, const int32_t*,
                                         const int32_t*, const int32_t*, int, int);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
