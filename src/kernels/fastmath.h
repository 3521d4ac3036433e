// Branch-free float exp and erf that GCC vectorises (libm's expf/erff are scalar calls, which
// stop a loop from vectorising). Double keeps libm: the finite-difference tests run in double.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace packbert::kernels {

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

// erf: Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7, below float resolution near 1).
inline float erf_fast(float x) {
  const float a = std::abs(x), t = 1.0f / (1.0f + 0.3275911f * a);
  const float poly =
      t * (0.254829592f +
           t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float y = 1.0f - poly * exp_fast(-a * a);
  return std::copysign(y, x);
}

inline float exp_of(float x) {
  return exp_fast(x);
}
inline double exp_of(double x) {
  return std::exp(x);
}

template <typename T>
struct SoftmaxStats {
  T max, sum;  // the row's largest input and sum(exp(z - max)): log-sum-exp = max + log(sum)
};

// p = softmax(z) over one row of n values (p may be z itself), vectorised.
template <typename T>
SoftmaxStats<T> softmax_row(T* p, const T* z, int n) {
  T mx = z[0];
#pragma omp simd reduction(max : mx)
  for (int j = 1; j < n; ++j) mx = std::max(mx, z[j]);
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

}  // namespace packbert::kernels
