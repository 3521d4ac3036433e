#include "kernels/attention.h"

#include <algorithm>
#include <cmath>

#include "kernels/dropout.h"
#include "kernels/fastmath.h"
#include "kernels/gemm.h"

namespace packbert::kernels {

// Each (sequence, head) block is two GEMMs forward (Q·Kᵀ, P·V) and four backward over strided
// views of qkv (row stride 3C), run in parallel over blocks; inside a parallel region oneDNN's
// sgemm runs single-threaded, so the two levels of parallelism do not fight.

std::vector<int64_t> attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH) {
  std::vector<int64_t> off(n_seq + 1, 0);
  for (int s = 0; s < n_seq; ++s) {
    int64_t L = cu_seqlens[s + 1] - cu_seqlens[s];
    off[s + 1] = off[s] + NH * L * L;
  }
  return off;
}

namespace {

// out[j] = keep(first + j) ? x[j] * scale : 0.
template <typename T>
void drop_row(T* __restrict out, const T* __restrict x, int L, const DropoutMask& mask,
              uint64_t first, T scale) {
#pragma omp simd
  for (int j = 0; j < L; ++j) out[j] = mask.keep(first + j) ? x[j] * scale : T(0);
}

// Backward through the mask, evaluating it once for both uses: pd = p * mask / keep (the dropped
// probabilities dV needs) and d <- d * mask / keep.
template <typename T>
void drop_rows_backward(T* __restrict pd, T* __restrict d, const T* __restrict p, int L,
                        const DropoutMask& mask, uint64_t first, T scale) {
#pragma omp simd
  for (int j = 0; j < L; ++j) {
    const bool keep = mask.keep(first + j);
    pd[j] = keep ? p[j] * scale : T(0);
    d[j] = keep ? d[j] * scale : T(0);
  }
}

// Softmax backward of one row through the dropout mask: d <- P (d' - rowsum(P d')) * scale with
// d' = d * mask / keep.
template <typename T>
void softmax_backward_row(T* __restrict d, const T* __restrict p, int L, T scale) {
  T row = 0;
#pragma omp simd reduction(+ : row)
  for (int j = 0; j < L; ++j) row += p[j] * d[j];
#pragma omp simd
  for (int j = 0; j < L; ++j) d[j] = p[j] * (d[j] - row) * scale;
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, const int32_t* cu_seqlens, int n_seq, int C,
                       int NH, AttentionDropout dropout) {
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - dropout.p));
  const DropoutMask mask(dropout.seed, dropout.key, dropout.p);
  std::vector<int64_t> off = attention_probs_offsets(cu_seqlens, n_seq, NH);
#pragma omp parallel
  {
    std::vector<T> buf;  // the dropped probabilities of one block
#pragma omp for collapse(2) schedule(dynamic)
    for (int s = 0; s < n_seq; ++s)
      for (int h = 0; h < NH; ++h) {
        const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a;
        const int64_t first = off[s] + static_cast<int64_t>(h) * L * L;
        T* P = probs + first;
        const T* Q = qkv + static_cast<int64_t>(a) * C3 + h * hs;
        gemm(false, true, L, L, hs, scale, Q, C3, Q + C, C3, T(0), P, L);
        if (dropout.p > 0) buf.resize(static_cast<size_t>(L) * L);
        for (int i = 0; i < L; ++i) {
          const int64_t r = static_cast<int64_t>(i) * L;
          softmax_row(P + r, P + r, L);
          if (dropout.p > 0) drop_row(buf.data() + r, P + r, L, mask, first + r, keep_scale);
        }
        const T* Pd = dropout.p > 0 ? buf.data() : P;
        gemm(false, false, L, hs, L, T(1), Pd, L, Q + 2 * C, C3, T(0),
             out + static_cast<int64_t>(a) * C + h * hs, C);
      }
  }
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH,
                        AttentionDropout dropout) {
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - dropout.p));
  const DropoutMask mask(dropout.seed, dropout.key, dropout.p);
  std::vector<int64_t> off = attention_probs_offsets(cu_seqlens, n_seq, NH);
#pragma omp parallel
  {
    std::vector<T> buf, dP;  // dropped probabilities, their gradient
#pragma omp for collapse(2) schedule(dynamic)
    for (int s = 0; s < n_seq; ++s)
      for (int h = 0; h < NH; ++h) {
        const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a;
        const int64_t first = off[s] + static_cast<int64_t>(h) * L * L;
        const T* P = probs + first;
        const T* Q = qkv + static_cast<int64_t>(a) * C3 + h * hs;
        T* dQ = dqkv + static_cast<int64_t>(a) * C3 + h * hs;
        const T* dO = dout + static_cast<int64_t>(a) * C + h * hs;
        dP.resize(static_cast<size_t>(L) * L);
        if (dropout.p > 0) buf.resize(static_cast<size_t>(L) * L);
        gemm(false, true, L, L, hs, T(1), dO, C, Q + 2 * C, C3, T(0), dP.data(), L);  // dO V^T
        // Through the dropout mask, then the softmax: dS = P (dP - rowsum(P dP)) * scale.
        for (int i = 0; i < L; ++i) {
          const int64_t r = static_cast<int64_t>(i) * L;
          if (dropout.p > 0)
            drop_rows_backward(buf.data() + r, dP.data() + r, P + r, L, mask, first + r,
                               keep_scale);
          softmax_backward_row(dP.data() + r, P + r, L, scale);
        }
        const T* Pd = dropout.p > 0 ? buf.data() : P;
        gemm(true, false, L, hs, L, T(1), Pd, L, dO, C, T(1), dQ + 2 * C, C3);      // dV += Pd^T dO
        gemm(false, false, L, hs, L, T(1), dP.data(), L, Q + C, C3, T(1), dQ, C3);  // dQ += dS K
        gemm(true, false, L, hs, L, T(1), dP.data(), L, Q, C3, T(1), dQ + C, C3);   // dK += dS^T Q
      }
  }
}

template void attention_forward<float>(float*, float*, const float*, const int32_t*, int, int, int,
                                       AttentionDropout);
template void attention_forward<double>(double*, double*, const double*, const int32_t*, int, int,
                                        int, AttentionDropout);
template void attention_backward<float>(float*, const float*, const float*, const float*,
                                        const int32_t*, int, int, int, AttentionDropout);
template void attention_backward<double>(double*, const double*, const double*, const double*,
                                         const int32_t*, int, int, int, AttentionDropout);

}  // namespace packbert::kernels
