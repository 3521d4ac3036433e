#include "kernels/layers.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/gemm.h"

namespace packbert::kernels {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C, T eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<int64_t>(n) * C;
    T m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    T v = 0;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;  // biased variance, as torch's layer_norm
    T s = T(1) / std::sqrt(v + eps);
    T* o = out + static_cast<int64_t>(n) * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<int64_t>(n) * C;
    const T* g = dout + static_cast<int64_t>(n) * C;
    T dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; ++c) {
      T norm = (x[c] - mean[n]) * rstd[n];
      T dnorm = g[c] * weight[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    T* d = dinp + static_cast<int64_t>(n) * C;
    for (int c = 0; c < C; ++c) {
      T norm = (x[c] - mean[n]) * rstd[n];
      d[c] += (g[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
    }
  }
  // Parameter gradients reduce over rows: parallel over channels, no races.
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) {
    T dw = 0, db = 0;
    for (int n = 0; n < N; ++n) {
      T g = dout[static_cast<int64_t>(n) * C + c];
      dw += g * (inp[static_cast<int64_t>(n) * C + c] - mean[n]) * rstd[n];
      db += g;
    }
    dweight[c] += dw;
    dbias[c] += db;
  }
}

namespace {

// Branch-free float exp and erf that GCC vectorises (libm's erff/expf are scalar calls).
// exp: Cody-Waite reduction by ln 2 and a degree-6 polynomial, ~2 ulp on [-87, 88].
inline float exp_fast(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504089f + 0.5f);
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  const float p =
      1.0f + r * (1.0f + r * (0.5f + r * (0.1666666716f + r * (0.04166662f + r * (0.008333452f + r * 0.001388889f)))));
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// erf: Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7, below float resolution near 1).
inline float erf_fast(float x) {
  const float a = std::abs(x), t = 1.0f / (1.0f + 0.3275911f * a);
  const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float y = 1.0f - poly * exp_fast(-a * a);
  return std::copysign(y, x);
}

}  // namespace

// Exact (erf) GELU. Double uses libm's erf (finite-difference tests); float uses erf_fast,
// whose error (< 1.5e-7 absolute) is below float resolution for the results.
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  if constexpr (std::is_same_v<T, float>) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = 0.5f * inp[i] * (1.0f + erf_fast(inp[i] * inv_sqrt2));
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = T(0.5) * inp[i] * (T(1) + std::erf(inp[i] * inv_sqrt2));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  const T inv_sqrt2pi = T(0.39894228040143267794);
  if constexpr (std::is_same_v<T, float>) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float x = inp[i];
      const float cdf = 0.5f * (1.0f + erf_fast(x * inv_sqrt2));
      const float pdf = inv_sqrt2pi * exp_fast(-0.5f * x * x);
      dinp[i] += dout[i] * (cdf + x * pdf);
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      T x = inp[i];
      T cdf = T(0.5) * (T(1) + std::erf(x * inv_sqrt2));
      T pdf = inv_sqrt2pi * std::exp(T(-0.5) * x * x);
      dinp[i] += dout[i] * (cdf + x * pdf);
    }
  }
}

template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  gemm(false, true, N, OC, C, T(1), inp, C, weight, C, T(0), out, OC);
  if (!bias) return;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) out[static_cast<int64_t>(n) * OC + o] += bias[o];
}

template <typename T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC) {
  if (dinp) gemm(false, false, N, C, OC, T(1), dout, OC, weight, C, T(1), dinp, C);
  gemm(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
  if (!dbias) return;
#pragma omp parallel for schedule(static)
  for (int o = 0; o < OC; ++o) {
    T s = 0;
    for (int n = 0; n < N; ++n) s += dout[static_cast<int64_t>(n) * OC + o];
    dbias[o] += s;
  }
}

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

template <typename T>
void cross_entropy_forward(T* losses, T* probs, const T* logits, const int32_t* targets, int N,
                           int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* z = logits + static_cast<int64_t>(n) * V;
    T* p = probs + static_cast<int64_t>(n) * V;
    T mx = z[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
    T sum = 0;
    for (int v = 0; v < V; ++v) sum += (p[v] = std::exp(z[v] - mx));
    for (int v = 0; v < V; ++v) p[v] /= sum;
    losses[n] = targets[n] < 0 ? T(0) : -(z[targets[n]] - mx - std::log(sum));
  }
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* probs, const int32_t* targets, const T* dlosses,
                            int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    const T* p = probs + static_cast<int64_t>(n) * V;
    T* d = dlogits + static_cast<int64_t>(n) * V;
    for (int v = 0; v < V; ++v) d[v] += (p[v] - (v == targets[n] ? T(1) : T(0))) * dlosses[n];
  }
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

#define PACKBERT_INSTANTIATE(T)                                                                    \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, T);       \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,          \
                                      const T*, int, int);                                         \
  template void gelu_forward<T>(T*, const T*, int64_t);                                            \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);                                 \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int, int, int);                \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int);       \
  template void embedding_forward<T>(T*, const int32_t*, const int32_t*, const int32_t*, const T*, \
                                     const T*, const T*, int, int);                                \
  template void embedding_backward<T>(T*, T*, T*, const T*, const int32_t*, const int32_t*,        \
                                      const int32_t*, int, int);                                   \
  template void cross_entropy_forward<T>(T*, T*, const T*, const int32_t*, int, int);              \
  template void cross_entropy_backward<T>(T*, const T*, const int32_t*, const T*, int, int);       \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);
PACKBERT_INSTANTIATE(float)
PACKBERT_INSTANTIATE(double)
#undef PACKBERT_INSTANTIATE

}  // namespace packbert::kernels
