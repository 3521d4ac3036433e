#include "kernels/cpu/layers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/gemm.h"
#include "kernels/rotary.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

namespace {

// Reductions over rows (bias and LayerNorm parameter gradients) run per block of adjacent
// columns: rows outer, columns inner, so memory is read in order and the inner loop vectorises,
// while each column still sums its rows in order in one thread (deterministic).
constexpr int kColumnBlock = 64;

template <typename F>
void column_blocks(int C, F body) {
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < blocks; ++b)
    body(b * kColumnBlock, std::min(kColumnBlock, C - b * kColumnBlock));
}

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

// One LayerNorm output row from its statistics: shared by the forward pass and the rebuild, so
// the two agree bit for bit. x: T, or bf16 (Precision::bf16's residual sums).
template <typename T, typename I>
inline void normalize_row(T* __restrict o, const I* __restrict x, T m, T s, const T* weight,
                          const T* bias, int C) {
  if (!bias) {  // (a LayerNorm without bias: ModernBERT's)
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (widen(x[c]) - m) * s * weight[c];
    return;
  }
#pragma omp simd
  for (int c = 0; c < C; ++c) o[c] = (widen(x[c]) - m) * s * weight[c] + bias[c];
}

// The same row rounded to 16 bits alone (out16[c] = to_half of exactly the value normalize_row
// computes), for a LayerNorm whose fp32 output nobody reads.
template <typename T, typename I, typename H>
inline void normalize_row16(H* __restrict o, const I* __restrict x, T m, T s, const T* weight,
                            const T* bias, int C) {
  if (!bias) {
#pragma omp simd
    for (int c = 0; c < C; ++c)
      o[c] = to_half<H>(static_cast<float>((widen(x[c]) - m) * s * weight[c]));
    return;
  }
#pragma omp simd
  for (int c = 0; c < C; ++c)
    o[c] = to_half<H>(static_cast<float>((widen(x[c]) - m) * s * weight[c] + bias[c]));
}

// out16 = to_half(row), [C].
template <typename T, typename H>
void mirror_row(H* __restrict out16, const T* __restrict row, int C) {
#pragma omp simd
  for (int c = 0; c < C; ++c) out16[c] = to_half<H>(static_cast<float>(row[c]));
}

}  // namespace

namespace {

// The LayerNorm kernels over an input stored as I (T, or H under a 16-bit precision).
template <typename T, typename I, typename H>
void layernorm_forward_from(T* out, T* mean, T* rstd, const I* inp, const T* weight, const T* bias,
                            int N, int C, T eps, H* out16) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const I* x = inp + static_cast<int64_t>(n) * C;
    T m = 0;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; ++c) m += widen(x[c]);
    m /= C;
    T v = 0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) v += (widen(x[c]) - m) * (widen(x[c]) - m);
    v /= C;  // biased variance, as torch's layer_norm
    T s = T(1) / std::sqrt(v + eps);
    if (!out) {
      normalize_row16(out16 + static_cast<int64_t>(n) * C, x, m, s, weight, bias, C);
    } else {
      normalize_row(out + static_cast<int64_t>(n) * C, x, m, s, weight, bias, C);
      if (out16)
        mirror_row(out16 + static_cast<int64_t>(n) * C, out + static_cast<int64_t>(n) * C, C);
    }
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename T, typename I, typename H>
void layernorm_apply_from(T* out, const I* inp, const T* mean, const T* rstd, const T* weight,
                          const T* bias, int N, int C, H* out16) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const I* x = inp + static_cast<int64_t>(n) * C;
    if (!out) {
      normalize_row16(out16 + static_cast<int64_t>(n) * C, x, mean[n], rstd[n], weight, bias, C);
      continue;
    }
    normalize_row(out + static_cast<int64_t>(n) * C, x, mean[n], rstd[n], weight, bias, C);
    if (out16)
      mirror_row(out16 + static_cast<int64_t>(n) * C, out + static_cast<int64_t>(n) * C, C);
  }
}

template <typename T, typename I>
void layernorm_backward_from(T* dinp, T* dweight, T* dbias, const T* dout, const I* inp,
                             const T* weight, const T* mean, const T* rstd, int N, int C,
                             GradWrite mode) {
  const bool add = mode == GradWrite::accumulate;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const I* x = inp + static_cast<int64_t>(n) * C;
    const T* g = dout + static_cast<int64_t>(n) * C;
    const T mu = mean[n], rs = rstd[n];
    T dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int c = 0; c < C; ++c) {
      T norm = (widen(x[c]) - mu) * rs;
      T dnorm = g[c] * weight[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    T* d = dinp + static_cast<int64_t>(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      T norm = (widen(x[c]) - mu) * rs;
      const T v = (g[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * rs;
      d[c] = add ? d[c] + v : v;
    }
  }
  // Parameter gradients reduce over rows.
  column_blocks(C, [&](int c0, int w) {
    T dw[kColumnBlock] = {}, db[kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      const T* g = dout + static_cast<int64_t>(n) * C + c0;
      const I* x = inp + static_cast<int64_t>(n) * C + c0;
      const T m = mean[n], s = rstd[n];
      for (int j = 0; j < w; ++j) {
        dw[j] += g[j] * (widen(x[j]) - m) * s;
        db[j] += g[j];
      }
    }
    for (int j = 0; j < w; ++j) dweight[c0 + j] += dw[j];
    if (dbias)
      for (int j = 0; j < w; ++j) dbias[c0 + j] += db[j];
  });
}

}  // namespace

template <typename T, typename H>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C, T eps, H* out16) {
  layernorm_forward_from(out, mean, rstd, inp, weight, bias, N, C, eps, out16);
}
void layernorm_forward(float* out, float* mean, float* rstd, const bf16* inp, const float* weight,
                       const float* bias, int N, int C, float eps, bf16* out16) {
  layernorm_forward_from(out, mean, rstd, inp, weight, bias, N, C, eps, out16);
}
void layernorm_forward(float* out, float* mean, float* rstd, const f16* inp, const float* weight,
                       const float* bias, int N, int C, float eps, f16* out16) {
  layernorm_forward_from(out, mean, rstd, inp, weight, bias, N, C, eps, out16);
}
template <typename T, typename H>
void layernorm_apply(T* out, const T* inp, const T* mean, const T* rstd, const T* weight,
                     const T* bias, int N, int C, H* out16) {
  layernorm_apply_from(out, inp, mean, rstd, weight, bias, N, C, out16);
}
void layernorm_apply(float* out, const bf16* inp, const float* mean, const float* rstd,
                     const float* weight, const float* bias, int N, int C, bf16* out16) {
  layernorm_apply_from(out, inp, mean, rstd, weight, bias, N, C, out16);
}
void layernorm_apply(float* out, const f16* inp, const float* mean, const float* rstd,
                     const float* weight, const float* bias, int N, int C, f16* out16) {
  layernorm_apply_from(out, inp, mean, rstd, weight, bias, N, C, out16);
}
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int N, int C, GradWrite mode) {
  layernorm_backward_from(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, mode);
}
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const bf16* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, GradWrite mode) {
  layernorm_backward_from(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, mode);
}
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const f16* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, GradWrite mode) {
  layernorm_backward_from(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, mode);
}

namespace {
template <typename H>
void residual_forward_half(H* out, const float* a, const H* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = to_half<H>(a[i] + to_float(b[i]));
}
}  // namespace
void residual_forward(bf16* out, const float* a, const bf16* b, int64_t n) {
  residual_forward_half(out, a, b, n);
}
void residual_forward(f16* out, const float* a, const f16* b, int64_t n) {
  residual_forward_half(out, a, b, n);
}

namespace {

// Elementwise loops run as one contiguous block per thread around a plain inner loop: GCC does not
// vectorise these bodies under `omp parallel for simd` ("no vectype"), but does in a function
// over restrict pointers.
template <typename F>
void parallel_blocks(int64_t n, F body) {
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) body(b * kBlock, std::min(n, (b + 1) * kBlock));
}

constexpr float kInvSqrt2 = 0.70710678118654752440f, kInvSqrt2Pi = 0.39894228040143267794f;

void gelu_forward_block(float* __restrict out, const float* __restrict inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = 0.5f * inp[i] * (1.0f + erf_fast(inp[i] * kInvSqrt2));
}

// 16 bits in, 16 bits out (the same fp32 arithmetic as above on the widened input).
template <typename H>
void gelu_forward_block(H* __restrict out, const H* __restrict inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = widen(inp[i]);
    out[i] = to_half<H>(0.5f * x * (1.0f + erf_fast(x * kInvSqrt2)));
  }
}

// A template over the write mode, so each loop stays a plain vectorisable loop.
template <bool kAdd, typename I>
void gelu_backward_block(float* __restrict dinp, const I* __restrict inp,
                         const float* __restrict dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = widen(inp[i]);
    const float gauss = exp_fast(-0.5f * x * x);  // erf's exp(-z^2) at z = x / sqrt(2) as well
    const float cdf = 0.5f * (1.0f + erf_with(x * kInvSqrt2, gauss));
    const float pdf = kInvSqrt2Pi * gauss;
    const float v = dout[i] * (cdf + x * pdf);
    if constexpr (kAdd)
      dinp[i] += v;
    else
      dinp[i] = v;
  }
}

template <typename I>
void gelu_backward_blocks(float* dinp, const I* inp, const float* dout, int64_t n, GradWrite mode) {
  parallel_blocks(n, [&](int64_t a, int64_t b) {
    if (mode == GradWrite::accumulate)
      gelu_backward_block<true>(dinp + a, inp + a, dout + a, b - a);
    else
      gelu_backward_block<false>(dinp + a, inp + a, dout + a, b - a);
  });
}

}  // namespace

// Exact (erf) GELU. Double uses libm's erf (finite-difference tests); float uses erf_fast,
// whose error (< 1.5e-7 absolute) is below float resolution for the results.
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    parallel_blocks(n, [&](int64_t a, int64_t b) { gelu_forward_block(out + a, inp + a, b - a); });
  } else {
    const T inv_sqrt2 = T(0.70710678118654752440);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i)
      out[i] = T(0.5) * inp[i] * (T(1) + std::erf(inp[i] * inv_sqrt2));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, GradWrite mode) {
  if constexpr (std::is_same_v<T, float>) {
    gelu_backward_blocks(dinp, inp, dout, n, mode);
  } else {
    const bool add = mode == GradWrite::accumulate;
    const T inv_sqrt2 = T(0.70710678118654752440);
    const T inv_sqrt2pi = T(0.39894228040143267794);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      T x = inp[i];
      T cdf = T(0.5) * (T(1) + std::erf(x * inv_sqrt2));
      T pdf = inv_sqrt2pi * std::exp(T(-0.5) * x * x);
      dinp[i] = (add ? dinp[i] : T(0)) + dout[i] * (cdf + x * pdf);
    }
  }
}

// dbias += column sums of dout [N, OC]. With dout16 (T = float), also dout16 = to_half(dout), in
// the same pass: the 16-bit linear backward's GEMM operand.
template <typename T, typename H = bf16>
void bias_backward(T* dbias, const T* dout, int N, int OC, H* dout16 = nullptr) {
  column_blocks(OC, [&](int c0, int w) {
    T acc[kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      const int64_t at = static_cast<int64_t>(n) * OC + c0;
      const T* g = dout + at;
      if constexpr (std::is_same_v<T, float>)
        if (dout16)
          for (int j = 0; j < w; ++j) dout16[at + j] = to_half<H>(g[j]);
      for (int j = 0; j < w; ++j) acc[j] += g[j];
    }
    for (int j = 0; j < w; ++j) dbias[c0 + j] += acc[j];
  });
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
                     int N, int C, int OC, GradWrite mode) {
  const T beta = mode == GradWrite::accumulate ? T(1) : T(0);
  if (dinp) gemm(false, false, N, C, OC, T(1), dout, OC, weight, C, beta, dinp, C);
  if (dweight) gemm(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
  if (dbias) bias_backward(dbias, dout, N, OC);
}

namespace {

template <typename H>
void gelu_forward_half(H* out, const H* inp, int64_t n) {
  parallel_blocks(n, [&](int64_t a, int64_t b) { gelu_forward_block(out + a, inp + a, b - a); });
}

template <typename H, typename O>
void linear_forward_half(O* out, const H* inp, const H* weight, const float* bias, int N, int C,
                         int OC) {
  if constexpr (std::is_same_v<O, H>) {
    gemm_bias(false, true, N, OC, C, inp, C, weight, C, bias, out, OC);
  } else {
    if (bias && C > 0) return gemm_bias(false, true, N, OC, C, inp, C, weight, C, bias, out, OC);
    gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    if (!bias) return;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) out[static_cast<int64_t>(n) * OC + o] += bias[o];
  }
}

template <typename H>
void linear_backward_half(float* dinp, float* dweight, const H* dout16, const H* inp,
                          const H* weight, int N, int C, int OC, GradWrite mode) {
  const float beta = mode == GradWrite::accumulate ? 1.0f : 0.0f;
  if (dinp) gemm(false, false, N, C, OC, 1.0f, dout16, OC, weight, C, beta, dinp, C);
  if (dweight) gemm(true, false, OC, C, N, 1.0f, dout16, OC, inp, C, 1.0f, dweight, C);
}

template <typename H>
void linear_backward_half(float* dinp, float* dweight, float* dbias, const float* dout, H* dout16,
                          const H* inp, const H* weight, int N, int C, int OC, GradWrite mode) {
  if (dbias)  // the rounding and the bias gradient in one pass over dout
    bias_backward(dbias, dout, N, OC, dout16);
  else
    to_half(dout16, dout, static_cast<int64_t>(N) * OC);
  linear_backward_half(dinp, dweight, static_cast<const H*>(dout16), inp, weight, N, C, OC, mode);
}

// By blocks of columns, each thread summing its columns over the rows in order, as bias_backward
// does.
template <typename H>
void gelu_backward_to_half_blocks(H* dinp16, float* dbias, const H* inp, const float* dout, int N,
                                  int OC) {
  column_blocks(OC, [&](int c0, int w) {
    float acc[kColumnBlock] = {}, d[kColumnBlock];
    for (int n = 0; n < N; ++n) {
      const int64_t at = static_cast<int64_t>(n) * OC + c0;
      gelu_backward_block<false>(d, inp + at, dout + at, w);
      for (int j = 0; j < w; ++j) {
        dinp16[at + j] = to_half<H>(d[j]);
        acc[j] += d[j];
      }
    }
    for (int j = 0; j < w; ++j) dbias[c0 + j] += acc[j];
  });
}

template <typename H>
void cross_entropy_logits_backward_half(H* dlogits16, float* dbias, const float* logits,
                                        const float* lse, const int32_t* targets,
                                        const float* dlosses, int N, int V) {
  // By blocks of columns, so each thread sums its own bias entries over the rows in order (the
  // order bias_backward sums them in).
  column_blocks(V, [&](int c0, int w) {
    float acc[kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      H* d = dlogits16 + static_cast<int64_t>(n) * V + c0;
      if (targets[n] < 0) {
        std::fill(d, d + w, H{});
        continue;
      }
      const float* z = logits + static_cast<int64_t>(n) * V + c0;
      const float l = lse[n], g = dlosses[n];
      // The fp32 gradient as the fp32 backward forms it: exp(z - lse) * g, then the target's
      // minus g (in a statement of its own, so no fused multiply-subtract changes its rounding).
      float x[kColumnBlock];
      for (int j = 0; j < w; ++j) x[j] = exp_of(z[j] - l) * g;
      const int t = targets[n] - c0;  // the target's column in this block, if it is here
      if (t >= 0 && t < w) x[t] -= g;
      for (int j = 0; j < w; ++j) {
        d[j] = to_half<H>(x[j]);
        acc[j] += x[j];
      }
    }
    if (dbias)
      for (int j = 0; j < w; ++j) dbias[c0 + j] += acc[j];
  });
}

}  // namespace

#define PACKBERT_HALF_FORMS(H)                                                                    \
  void gelu_forward(H* out, const H* inp, int64_t n) {                                            \
    gelu_forward_half(out, inp, n);                                                               \
  }                                                                                               \
  void gelu_backward(float* dinp, const H* inp, const float* dout, int64_t n, GradWrite mode) {   \
    gelu_backward_blocks(dinp, inp, dout, n, mode);                                               \
  }                                                                                               \
  void gelu_backward_to_half(H* dinp16, float* dbias, const H* inp, const float* dout, int N,     \
                             int OC) {                                                            \
    gelu_backward_to_half_blocks(dinp16, dbias, inp, dout, N, OC);                                \
  }                                                                                               \
  void linear_forward(H* out, const H* inp, const H* weight, const float* bias, int N, int C,     \
                      int OC) {                                                                   \
    linear_forward_half(out, inp, weight, bias, N, C, OC);                                        \
  }                                                                                               \
  void linear_forward(float* out, const H* inp, const H* weight, const float* bias, int N, int C, \
                      int OC) {                                                                   \
    linear_forward_half(out, inp, weight, bias, N, C, OC);                                        \
  }                                                                                               \
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, H* dout16,   \
                       const H* inp, const H* weight, int N, int C, int OC, GradWrite mode) {     \
    linear_backward_half(dinp, dweight, dbias, dout, dout16, inp, weight, N, C, OC, mode);        \
  }                                                                                               \
  void linear_backward(float* dinp, float* dweight, const H* dout16, const H* inp,                \
                       const H* weight, int N, int C, int OC, GradWrite mode) {                   \
    linear_backward_half(dinp, dweight, dout16, inp, weight, N, C, OC, mode);                     \
  }                                                                                               \
  void cross_entropy_logits_backward(H* dlogits16, float* dbias, const float* logits,             \
                                     const float* lse, const int32_t* targets,                    \
                                     const float* dlosses, int N, int V) {                        \
    cross_entropy_logits_backward_half(dlogits16, dbias, logits, lse, targets, dlosses, N, V);    \
  }                                                                                               \
  void gather_rows_forward(H* out, const H* inp, const int32_t* rows, int n_rows, int C) {        \
    gather_rows_forward<H>(out, inp, rows, n_rows, C);                                            \
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

namespace {

// The largest entries of row z [V] before and after column t (max_of: vectorised); the target is
// the row's first maximum (as std::max_element finds it) when it is above every entry before it and
// not below any after it.
template <typename T>
struct TargetMaxima {
  T before, after, target;
  bool target_first() const { return before < target && after <= target; }
};
template <typename T>
TargetMaxima<T> maxima_around(const T* z, int t, int V) {
  constexpr T kLowest = -std::numeric_limits<T>::infinity();
  return {max_of(z, t, kLowest), max_of(z + t + 1, V - t - 1, kLowest), z[t]};
}

}  // namespace

template <typename T>
int64_t cross_entropy_logits_forward(T* losses, T* lse, const T* logits, const int32_t* targets,
                                     int N, int V) {
  int64_t hits = 0;
#pragma omp parallel for schedule(static) reduction(+ : hits)
  for (int n = 0; n < N; ++n) {
    const int t = targets[n];
    losses[n] = 0, lse[n] = 0;
    if (t < 0) continue;
    const T* z = logits + static_cast<int64_t>(n) * V;
    const T zt = z[t];
    // The row's maximum and whether the target is its first maximum (count_argmax_hits's rule),
    // in one pass.
    const TargetMaxima<T> around = maxima_around(z, t, V);
    const T mx = std::max({around.before, zt, around.after});
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; ++v) sum += exp_of(z[v] - mx);
    lse[n] = mx + std::log(sum);
    losses[n] = lse[n] - zt;
    hits += around.target_first();
  }
  return hits;
}

template <typename T>
void cross_entropy_logits_backward(T* dlogits, const T* logits, const T* lse,
                                   const int32_t* targets, const T* dlosses, int N, int V,
                                   GradWrite mode) {
  const bool add = mode == GradWrite::accumulate;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* d = dlogits + static_cast<int64_t>(n) * V;
    if (targets[n] < 0) {
      if (!add) std::fill(d, d + V, T(0));
      continue;
    }
    const T* z = logits + static_cast<int64_t>(n) * V;
    const T l = lse[n], g = dlosses[n];
#pragma omp simd
    for (int v = 0; v < V; ++v) {
      const T x = exp_of(z[v] - l) * g;
      d[v] = add ? d[v] + x : x;
    }
    d[targets[n]] -= g;
  }
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void gather_rows_forward(T* out, const T* inp, const int32_t* rows, int n_rows, int C) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n_rows; ++r)
    std::copy(inp + static_cast<int64_t>(rows[r]) * C, inp + static_cast<int64_t>(rows[r] + 1) * C,
              out + static_cast<int64_t>(r) * C);
}

namespace {
template <typename H>
void gather_rows_widened(float* out, const H* inp, const int32_t* rows, int n_rows, int C) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n_rows; ++r) {
    const H* in = inp + static_cast<int64_t>(rows[r]) * C;
    float* o = out + static_cast<int64_t>(r) * C;
    for (int c = 0; c < C; ++c) o[c] = widen(in[c]);
  }
}
}  // namespace

void gather_rows_forward(float* out, const bf16* inp, const int32_t* rows, int n_rows, int C) {
  gather_rows_widened(out, inp, rows, n_rows, C);
}
void gather_rows_forward(float* out, const f16* inp, const int32_t* rows, int n_rows, int C) {
  gather_rows_widened(out, inp, rows, n_rows, C);
}

PACKBERT_HALF_FORMS(bf16)
PACKBERT_HALF_FORMS(f16)
#undef PACKBERT_HALF_FORMS

template <typename T>
void gather_rows_backward(T* dinp, const T* dout, const int32_t* rows, int n_rows, int C) {
  // Serial over rows: an index may repeat, and += must not race.
  for (int r = 0; r < n_rows; ++r) {
    T* d = dinp + static_cast<int64_t>(rows[r]) * C;
    const T* g = dout + static_cast<int64_t>(r) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) d[c] += g[c];
  }
}

template <typename T>
void tanh_forward(T* out, const T* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::tanh(inp[i]);
}

template <typename T>
void tanh_backward(T* dinp, const T* out, const T* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dinp[i] += dout[i] * (T(1) - out[i] * out[i]);
}

template <typename T>
int64_t count_argmax_hits(const T* scores, const int32_t* targets, int N, int V) {
  int64_t hits = 0;
  // Row n is a hit when its target is the row's first maximum.
#pragma omp parallel for schedule(static) reduction(+ : hits)
  for (int n = 0; n < N; ++n) {
    const int t = targets[n];
    if (t < 0) continue;
    hits += maxima_around(scores + static_cast<int64_t>(n) * V, t, V).target_first();
  }
  return hits;
}

template <typename T>
void span_cross_entropy_forward(T* losses, T* probs, const T* logits, const int32_t* cu_seqlens,
                                const int32_t* targets, int n_seq) {
  for (int s = 0; s < n_seq; ++s) {
    const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a;
    losses[s] = 0;
    for (int e = 0; e < 2; ++e) {
      const T* z = logits + 2 * static_cast<int64_t>(a) + e;  // column e, stride 2
      T* p = probs + 2 * static_cast<int64_t>(a) + e;
      T mx = -INFINITY;
      for (int i = 0; i < L; ++i) mx = std::max(mx, z[2 * i]);
      T sum = 0;
      for (int i = 0; i < L; ++i) sum += (p[2 * i] = std::exp(z[2 * i] - mx));
      for (int i = 0; i < L; ++i) p[2 * i] /= sum;
      const int32_t y = targets[2 * s + e];
      if (targets[2 * s] >= 0) losses[s] += -std::log(p[2 * y]) / 2;
    }
  }
}

template <typename T>
void span_cross_entropy_backward(T* dlogits, const T* probs, const int32_t* cu_seqlens,
                                 const int32_t* targets, const T* dlosses, int n_seq) {
  for (int s = 0; s < n_seq; ++s) {
    if (targets[2 * s] < 0) continue;
    const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a;
    const T g = dlosses[s] / 2;
    for (int e = 0; e < 2; ++e)
      for (int i = 0; i < L; ++i) {
        const int64_t k = 2 * static_cast<int64_t>(a + i) + e;
        dlogits[k] += (probs[k] - (i == targets[2 * s + e] ? T(1) : T(0))) * g;
      }
  }
}

template <typename T>
void squared_error_forward(T* losses, const T* pred, const T* target, int N) {
  for (int n = 0; n < N; ++n) losses[n] = (pred[n] - target[n]) * (pred[n] - target[n]);
}

template <typename T>
void squared_error_backward(T* dpred, T* dtarget, const T* pred, const T* target, const T* dlosses,
                            int N) {
  for (int n = 0; n < N; ++n) {
    const T g = 2 * (pred[n] - target[n]) * dlosses[n];
    dpred[n] += g;
    if (dtarget) dtarget[n] -= g;
  }
}

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

#define PACKBERT_INSTANTIATE(T)                                                                    \
  template void layernorm_forward<T, bf16>(T*, T*, T*, const T*, const T*, const T*, int, int, T,  \
                                           bf16*);                                                 \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,          \
                                      const T*, int, int, GradWrite);                              \
  template void gelu_forward<T>(T*, const T*, int64_t);                                            \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t, GradWrite);                      \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int, int, int);                \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int,        \
                                   GradWrite);                                                     \
  template void embedding_forward<T>(T*, const int32_t*, const int32_t*, const int32_t*, const T*, \
                                     const T*, const T*, int, int);                                \
  template void embedding_backward<T>(T*, T*, T*, const T*, const int32_t*, const int32_t*,        \
                                      const int32_t*, int, int);                                   \
  template int64_t cross_entropy_logits_forward<T>(T*, T*, const T*, const int32_t*, int, int);    \
  template void cross_entropy_logits_backward<T>(T*, const T*, const T*, const int32_t*, const T*, \
                                                 int, int, GradWrite);                             \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);                              \
  template void layernorm_apply<T, bf16>(T*, const T*, const T*, const T*, const T*, const T*,     \
                                         int, int, bf16*);                                         \
  template void gather_rows_forward<T>(T*, const T*, const int32_t*, int, int);                    \
  template void gather_rows_backward<T>(T*, const T*, const int32_t*, int, int);                   \
  template void tanh_forward<T>(T*, const T*, int64_t);                                            \
  template void tanh_backward<T>(T*, const T*, const T*, int64_t);                                 \
  template int64_t count_argmax_hits<T>(const T*, const int32_t*, int, int);                       \
  template void span_cross_entropy_forward<T>(T*, T*, const T*, const int32_t*, const int32_t*,    \
                                              int);                                                \
  template void span_cross_entropy_backward<T>(T*, const T*, const int32_t*, const int32_t*,       \
                                               const T*, int);                                     \
  template void squared_error_forward<T>(T*, const T*, const T*, int);                             \
  template void squared_error_backward<T>(T*, T*, const T*, const T*, const T*, int);
PACKBERT_INSTANTIATE(float)
PACKBERT_INSTANTIATE(double)
#undef PACKBERT_INSTANTIATE
template void layernorm_forward<float, f16>(float*, float*, float*, const float*, const float*,
                                            const float*, int, int, float, f16*);
template void layernorm_apply<float, f16>(float*, const float*, const float*, const float*,
                                          const float*, const float*, int, int, f16*);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
