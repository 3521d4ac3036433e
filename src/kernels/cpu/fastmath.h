// Branch-free float exp and erf that GCC vectorises (libm's expf/erff are scalar calls, which
// stop a loop from vectorising). Double keeps libm: the finite-difference tests run in double.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/isa.h"
#include "kernels/tensor.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

// GELU's constants: 1 / sqrt(2) and 1 / sqrt(2 pi).
constexpr float kInvSqrt2 = 0.70710678118654752440f, kInvSqrt2Pi = 0.39894228040143267794f;

// A stored value as the arithmetic type: itself, or a 16-bit value widened to fp32.
template <typename T>
inline T widen(T x) {
  return x;
}
inline float widen(bf16 x) {
  return to_float(x);
}
inline float widen(f16 x) {
  return to_float(x);
}

// exp: Cody-Waite reduction by ln 2 and a degree-6 polynomial, ~2 ulp on [-87, 88]; inputs
// below -87 give ~1e-38 instead of a denormal or 0. n = round(x / ln 2) by the 1.5 * 2^23 trick:
// GCC 12 does not vectorise std::floor without -fno-trapping-math.
inline float exp_fast(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float n = (x * 1.44269504089f + kRound) - kRound;
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  const float p =
      1.0f +
      r * (1.0f + r * (0.5f + r * (0.1666666716f +
                                   r * (0.04166662f + r * (0.008333452f + r * 0.001388889f)))));
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// erf: Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7, below float resolution near 1), from
// x and exp(-x^2): GELU's backward has that exponential already (the normal density's).
inline float erf_with(float x, float exp_minus_x2) {
  const float a = std::abs(x), t = 1.0f / (1.0f + 0.3275911f * a);
  const float poly =
      t * (0.254829592f +
           t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  return std::copysign(1.0f - poly * exp_minus_x2, x);
}
inline float erf_fast(float x) {
  return erf_with(x, exp_fast(-x * x));
}

inline float exp_of(float x) {
  return exp_fast(x);
}
inline double exp_of(double x) {
  return std::exp(x);
}

// The largest of init and z[0 .. n). GCC keeps a float max reduction scalar, even under `omp simd`
// (a chain of dependent vmaxss, one element every few cycles), so with AVX-512 this keeps one
// running maximum per lane of a vector (AVX2: of 8) and takes their largest at the end. Without
// NaNs in z, the result is the sequential std::max's.
template <typename T>
T max_of(const T* z, int64_t n, T init) {
  T mx = init;
  int64_t j = 0;
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>) {
    // The masked forms: the plain ones start from _mm512_undefined_ps(), which GCC 12's
    // -Wmaybe-uninitialized reports wherever they are inlined.
    __m512 lanes = _mm512_set1_ps(init);
    for (; j + 16 <= n; j += 16) lanes = _mm512_maskz_max_ps(0xffff, _mm512_loadu_ps(z + j), lanes);
    float lane[16];
    _mm512_storeu_ps(lane, lanes);
    for (float v : lane) mx = std::max(mx, v);
  }
#elif defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>) {  // the same, 8 lanes
    __m256 lanes = _mm256_set1_ps(init);
    for (; j + 8 <= n; j += 8) lanes = _mm256_max_ps(_mm256_loadu_ps(z + j), lanes);
    float lane[8];
    _mm256_storeu_ps(lane, lanes);
    for (float v : lane) mx = std::max(mx, v);
  }
#endif
  for (; j < n; ++j) mx = std::max(mx, z[j]);
  return mx;
}

template <typename T>
struct SoftmaxStats {
  T max, sum;  // the row's largest input and sum(exp(z - max)): log-sum-exp = max + log(sum)
};

// p = softmax(z) over one row of n values (p may be z itself), vectorised.
template <typename T>
SoftmaxStats<T> softmax_row(T* p, const T* z, int n) {
  const T mx = max_of(z, n, z[0]);
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) {
    p[j] = exp_of(z[j] - mx);
    sum += p[j];
  }
  const T inv = T(1) / sum;
#pragma omp simd
  for (int j = 0; j < n; ++j) p[j] *= inv;
  return {mx, sum};
}

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
