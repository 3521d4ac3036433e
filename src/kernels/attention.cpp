#include "kernels/attention.h"

#include <algorithm>
#include <cmath>

#include "kernels/dropout.h"
#include "kernels/gemm.h"

namespace packbert::kernels {

// Each (sequence, head) block is three GEMMs forward and four backward over strided views of
// qkv (row stride 3C), run in parallel over blocks; inside a parallel region OpenBLAS's OpenMP
// build runs single-threaded, so the two levels of parallelism do not fight.

std::vector<int64_t> attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH) {
  std::vector<int64_t> off(n_seq + 1, 0);
  for (int s = 0; s < n_seq; ++s) {
    int64_t L = cu_seqlens[s + 1] - cu_seqlens[s];
    off[s + 1] = off[s] + NH * L * L;
  }
  return off;
}

namespace {

// The dropped probabilities (P * mask / keep) of one block, or P itself when dropout is off.
template <typename T>
const T* dropped(const T* P, int64_t first, int64_t n, const AttentionDropout& d,
                 std::vector<T>& buf) {
  if (d.p <= 0) return P;
  const T keep_scale = static_cast<T>(1.0 / (1.0 - d.p));
  buf.resize(n);
  for (int64_t i = 0; i < n; ++i)
    buf[i] = dropout_uniform(d.seed, d.key, first + i) >= d.p ? P[i] * keep_scale : T(0);
  return buf.data();
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, const int32_t* cu_seqlens, int n_seq, int C,
                       int NH, AttentionDropout dropout) {
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  std::vector<int64_t> off = attention_probs_offsets(cu_seqlens, n_seq, NH);
#pragma omp parallel
  {
    std::vector<T> buf;
#pragma omp for collapse(2) schedule(dynamic)
    for (int s = 0; s < n_seq; ++s)
      for (int h = 0; h < NH; ++h) {
        const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a;
        const int64_t first = off[s] + static_cast<int64_t>(h) * L * L;
        T* P = probs + first;
        const T* Q = qkv + static_cast<int64_t>(a) * C3 + h * hs;
        gemm(false, true, L, L, hs, scale, Q, C3, Q + C, C3, T(0), P, L);
        for (int i = 0; i < L; ++i) {
          T* p = P + static_cast<int64_t>(i) * L;
          T mx = *std::max_element(p, p + L), sum = 0;
          for (int j = 0; j < L; ++j) sum += (p[j] = std::exp(p[j] - mx));
          T inv = T(1) / sum;
          for (int j = 0; j < L; ++j) p[j] *= inv;
        }
        const T* Pd = dropped(P, first, static_cast<int64_t>(L) * L, dropout, buf);
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
  std::vector<int64_t> off = attention_probs_offsets(cu_seqlens, n_seq, NH);
#pragma omp parallel
  {
    std::vector<T> buf, dP;
#pragma omp for collapse(2) schedule(dynamic)
    for (int s = 0; s < n_seq; ++s)
      for (int h = 0; h < NH; ++h) {
        const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a;
        const int64_t first = off[s] + static_cast<int64_t>(h) * L * L;
        const T* P = probs + first;
        const T* Q = qkv + static_cast<int64_t>(a) * C3 + h * hs;
        T* dQ = dqkv + static_cast<int64_t>(a) * C3 + h * hs;
        const T* dO = dout + static_cast<int64_t>(a) * C + h * hs;
        const T* Pd = dropped(P, first, static_cast<int64_t>(L) * L, dropout, buf);
        dP.resize(static_cast<size_t>(L) * L);
        gemm(false, true, L, L, hs, T(1), dO, C, Q + 2 * C, C3, T(0), dP.data(), L);  // dO V^T
        gemm(true, false, L, hs, L, T(1), Pd, L, dO, C, T(1), dQ + 2 * C, C3);  // dV += Pd^T dO
        // Through the dropout mask, then the softmax: dS = P (dP - rowsum(P dP)) * scale.
        for (int i = 0; i < L; ++i) {
          const T* p = P + static_cast<int64_t>(i) * L;
          T* d = dP.data() + static_cast<int64_t>(i) * L;
          if (dropout.p > 0)
            for (int j = 0; j < L; ++j)
              d[j] *= dropout_uniform(dropout.seed, dropout.key, first + i * L + j) >= dropout.p
                          ? keep_scale
                          : T(0);
          T row = 0;
          for (int j = 0; j < L; ++j) row += p[j] * d[j];
          for (int j = 0; j < L; ++j) d[j] = p[j] * (d[j] - row) * scale;
        }
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
