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

#define PACKBERT_INSTANTIATE(T)                                                                   \
  template void layernorm_forward<T, bf16>(T*, T*, T*, const T*, const T*, const T*, int, int, T, \
                                           bf16*);                                                \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,         \
                                      const T*, int, int, GradWrite);                             \
  template void gelu_forward<T>(T*, const T*, int64_t);                                           \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t, GradWrite);                     \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int, int, int);               \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int,       \
                                   GradWrite);                                                    \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);                             \
  template void layernorm_apply<T, bf16>(T*, const T*, const T*, const T*, const T*, const T*,    \
                                         int, int, bf16*);                                        \
  template void gather_rows_forward<T>(T*, const T*, const int32_t*, int, int);                   \
  template void gather_rows_backward<T>(T*, const T*, const int32_t*, int, int);                  \
  template void tanh_forward<T>(T*, const T*, int64_t);                                           \
  template void tanh_backward<T>(T*, const T*, const T*, int64_t);
PACKBERT_INSTANTIATE(float)
PACKBERT_INSTANTIATE(double)
#undef PACKBERT_INSTANTIATE
template void layernorm_forward<float, f16>(float*, float*, float*, const float*, const float*,
                                            const float*, int, int, float, f16*);
template void layernorm_apply<float, f16>(float*, const float*, const float*, const float*,
                                          const float*, const float*, int, int, f16*);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
