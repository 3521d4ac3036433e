#include "kernels/attention.h"

#include <algorithm>
#include <cmath>

#include "kernels/dropout.h"

namespace packbert::kernels {

std::vector<int64_t> attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH) {
  std::vector<int64_t> off(n_seq + 1, 0);
  for (int s = 0; s < n_seq; ++s) {
    int64_t L = cu_seqlens[s + 1] - cu_seqlens[s];
    off[s + 1] = off[s] + NH * L * L;
  }
  return off;
}

template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, const int32_t* cu_seqlens, int n_seq, int C,
                       int NH, AttentionDropout dropout) {
  const T keep_scale = static_cast<T>(1.0 / (1.0 - dropout.p));
  const int hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  std::vector<int64_t> off = attention_probs_offsets(cu_seqlens, n_seq, NH);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < NH; ++h) {
      const int start = cu_seqlens[s], L = cu_seqlens[s + 1] - start;
      T* P = probs + off[s] + static_cast<int64_t>(h) * L * L;
      for (int i = 0; i < L; ++i) {
        const T* q = qkv + (start + i) * C3 + h * hs;
        T* p = P + static_cast<int64_t>(i) * L;
        T mx = -INFINITY;
        for (int j = 0; j < L; ++j) {
          const T* k = qkv + (start + j) * C3 + C + h * hs;
          T dot = 0;
          for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        T sum = 0;
        for (int j = 0; j < L; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j < L; ++j) p[j] /= sum;
        T* o = out + static_cast<int64_t>(start + i) * C + h * hs;
        std::fill(o, o + hs, T(0));
        const int64_t row_index = (p - probs);
        for (int j = 0; j < L; ++j) {
          T pj = p[j];
          if (dropout.p > 0)
            pj = dropout_uniform(dropout.seed, dropout.key, row_index + j) >= dropout.p
                     ? pj * keep_scale
                     : T(0);
          const T* v = qkv + (start + j) * C3 + 2 * C + h * hs;
          for (int d = 0; d < hs; ++d) o[d] += pj * v[d];
        }
      }
    }
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH,
                        AttentionDropout dropout) {
  const T keep_scale = static_cast<T>(1.0 / (1.0 - dropout.p));
  const int hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  std::vector<int64_t> off = attention_probs_offsets(cu_seqlens, n_seq, NH);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < NH; ++h) {
      const int start = cu_seqlens[s], L = cu_seqlens[s + 1] - start;
      const T* P = probs + off[s] + static_cast<int64_t>(h) * L * L;
      std::vector<T> dp(L);
      for (int i = 0; i < L; ++i) {
        const T* p = P + static_cast<int64_t>(i) * L;
        const T* g = dout + static_cast<int64_t>(start + i) * C + h * hs;
        const int64_t row_index = (p - probs);
        T row = 0;
        for (int j = 0; j < L; ++j) {
          T m = 1;  // dropout mask scale of this probability
          if (dropout.p > 0)
            m = dropout_uniform(dropout.seed, dropout.key, row_index + j) >= dropout.p ? keep_scale
                                                                                        : T(0);
          const T* v = qkv + (start + j) * C3 + 2 * C + h * hs;
          T* dv = dqkv + (start + j) * C3 + 2 * C + h * hs;
          T dot = 0, pj = p[j] * m;
          for (int d = 0; d < hs; ++d) {
            dot += g[d] * v[d];
            dv[d] += pj * g[d];
          }
          dp[j] = dot * m;
          row += p[j] * dp[j];
        }
        const T* q = qkv + (start + i) * C3 + h * hs;
        T* dq = dqkv + (start + i) * C3 + h * hs;
        for (int j = 0; j < L; ++j) {
          T ds = p[j] * (dp[j] - row) * scale;  // through softmax and the 1/sqrt(hs) scale
          const T* k = qkv + (start + j) * C3 + C + h * hs;
          T* dk = dqkv + (start + j) * C3 + C + h * hs;
          for (int d = 0; d < hs; ++d) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
          }
        }
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
