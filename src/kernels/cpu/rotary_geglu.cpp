// The cpu backend's GeGLU and rotary embedding (cpu/layers.h; ModernBERT's gated MLP and
// positions). Rotary angles come from kernels/rotary.h, as every backend's do.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/layers.h"
#include "kernels/rotary.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

// GeGLU, row by row: the activated half's GELU times the gate half. double runs libm's erf
// (the finite-difference tests); float and 16-bit run gelu's fp32 arithmetic.
template <typename T>
void geglu_forward(T* out, const T* in, int N, int I) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* __restrict a = in + static_cast<int64_t>(n) * 2 * I;
    const T* __restrict g = a + I;
    T* __restrict o = out + static_cast<int64_t>(n) * I;
    if constexpr (std::is_same_v<T, double>) {
      for (int c = 0; c < I; ++c)
        o[c] = 0.5 * a[c] * (1.0 + std::erf(a[c] * 0.70710678118654752440)) * g[c];
    } else {
      for (int c = 0; c < I; ++c) {
        const float x = widen(a[c]);
        const float y = 0.5f * x * (1.0f + erf_fast(x * kInvSqrt2)) * widen(g[c]);
        if constexpr (std::is_same_v<T, float>)
          o[c] = y;
        else
          o[c] = to_half<T>(y);
      }
    }
  }
}

template <bool kAdd, typename T, typename In>
void geglu_backward_rows(T* dinp, const In* in, const T* dout, int N, int I) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const In* __restrict a = in + static_cast<int64_t>(n) * 2 * I;
    const In* __restrict g = a + I;
    const T* __restrict d = dout + static_cast<int64_t>(n) * I;
    T* __restrict da = dinp + static_cast<int64_t>(n) * 2 * I;
    T* __restrict dg = da + I;
    for (int c = 0; c < I; ++c) {
      T x, cdf, pdf;
      if constexpr (std::is_same_v<T, double>) {
        x = a[c];
        cdf = 0.5 * (1.0 + std::erf(x * 0.70710678118654752440));
        pdf = 0.39894228040143267794 * std::exp(-0.5 * x * x);
      } else {
        x = widen(a[c]);
        const float gauss = exp_fast(-0.5f * x * x);
        cdf = 0.5f * (1.0f + erf_with(x * kInvSqrt2, gauss));
        pdf = kInvSqrt2Pi * gauss;
      }
      const T gate = static_cast<T>(widen(g[c]));
      const T va = d[c] * gate * (cdf + x * pdf), vg = d[c] * x * cdf;
      if constexpr (kAdd) {
        da[c] += va;
        dg[c] += vg;
      } else {
        da[c] = va;
        dg[c] = vg;
      }
    }
  }
}

template <typename T, typename In>
void geglu_backward(T* dinp, const In* in, const T* dout, int N, int I, GradWrite mode) {
  if (mode == GradWrite::accumulate)
    geglu_backward_rows<true>(dinp, in, dout, N, I);
  else
    geglu_backward_rows<false>(dinp, in, dout, N, I);
}

// A token's cos (cs[0, D/2)) and sin (cs[D/2, D)) at each of the D/2 frequencies.
template <typename A>
void rotary_cos_sin(A* cs, int32_t pos, const std::vector<float>& inv_freq) {
  const size_t half = inv_freq.size();
  for (size_t i = 0; i < half; ++i) {
    const double a = rotary_angle(pos, inv_freq[i]);
    cs[i] = static_cast<A>(std::cos(a));
    cs[half + i] = static_cast<A>(std::sin(a));
  }
}

// Rotary embedding: each token's cos and sin once (D/2 of each), then every head's pairs.
template <typename T>
void rotary_forward(T* out, const T* in, const int32_t* pos, int N, int heads, int D, double theta,
                    int64_t ld_out, int64_t ld_in) {
  if (!ld_out) ld_out = static_cast<int64_t>(heads) * D;
  if (!ld_in) ld_in = static_cast<int64_t>(heads) * D;
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const std::vector<float> inv = rotary_inv_freq(D, theta);
  const int half = D / 2;
#pragma omp parallel
  {
    std::vector<A> cs(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      rotary_cos_sin(cs.data(), pos[n], inv);
      for (int h = 0; h < heads; ++h) {
        const int64_t at = static_cast<int64_t>(h) * D;
        const T* x = in + n * ld_in + at;
        T* o = out + n * ld_out + at;
        for (int i = 0; i < half; ++i) {
          const A c = cs[static_cast<size_t>(i)], s = cs[static_cast<size_t>(half + i)];
          const A x1 = static_cast<A>(widen(x[i])), x2 = static_cast<A>(widen(x[half + i]));
          const A y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
          if constexpr (std::is_same_v<T, A>) {
            o[i] = y1, o[half + i] = y2;
          } else {
            o[i] = to_half<T>(y1), o[half + i] = to_half<T>(y2);
          }
        }
      }
    }
  }
}

template <typename T>
void rotary_backward(T* dinp, const T* dout, const int32_t* pos, int N, int heads, int D,
                     double theta, GradWrite mode, int64_t ld_dinp, int64_t ld_dout) {
  if (!ld_dinp) ld_dinp = static_cast<int64_t>(heads) * D;
  if (!ld_dout) ld_dout = static_cast<int64_t>(heads) * D;
  const std::vector<float> inv = rotary_inv_freq(D, theta);
  const int half = D / 2;
  const bool add = mode == GradWrite::accumulate;
#pragma omp parallel
  {
    std::vector<T> cs(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      rotary_cos_sin(cs.data(), pos[n], inv);
      for (int h = 0; h < heads; ++h) {
        const int64_t at = static_cast<int64_t>(h) * D;
        const T* g = dout + n * ld_dout + at;
        T* d = dinp + n * ld_dinp + at;
        for (int i = 0; i < half; ++i) {
          const T c = cs[static_cast<size_t>(i)], s = cs[static_cast<size_t>(half + i)];
          const T d1 = g[i] * c + g[half + i] * s, d2 = g[half + i] * c - g[i] * s;
          d[i] = (add ? d[i] : T(0)) + d1;
          d[half + i] = (add ? d[half + i] : T(0)) + d2;
        }
      }
    }
  }
}

template void rotary_forward<double>(double*, const double*, const int32_t*, int, int, int, double,
                                     int64_t, int64_t);
template void rotary_forward<float>(float*, const float*, const int32_t*, int, int, int, double,
                                    int64_t, int64_t);
template void rotary_forward<bf16>(bf16*, const bf16*, const int32_t*, int, int, int, double,
                                   int64_t, int64_t);
template void rotary_forward<f16>(f16*, const f16*, const int32_t*, int, int, int, double, int64_t,
                                  int64_t);
template void rotary_backward<double>(double*, const double*, const int32_t*, int, int, int, double,
                                      GradWrite, int64_t, int64_t);
template void rotary_backward<float>(float*, const float*, const int32_t*, int, int, int, double,
                                     GradWrite, int64_t, int64_t);

template void geglu_forward<double>(double*, const double*, int, int);
template void geglu_forward<float>(float*, const float*, int, int);
template void geglu_forward<bf16>(bf16*, const bf16*, int, int);
template void geglu_forward<f16>(f16*, const f16*, int, int);
template void geglu_backward<double, double>(double*, const double*, const double*, int, int,
                                             GradWrite);
template void geglu_backward<float, float>(float*, const float*, const float*, int, int, GradWrite);
template void geglu_backward<float, bf16>(float*, const bf16*, const float*, int, int, GradWrite);
template void geglu_backward<float, f16>(float*, const f16*, const float*, int, int, GradWrite);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
