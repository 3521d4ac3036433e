#include "kernels/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/dropout.h"
#include "kernels/fastmath.h"
#include "kernels/gemm.h"

namespace packbert::kernels {

// Each (sequence, head) block is two GEMMs forward (Q·Kᵀ, P·V) and four backward (five when the
// probabilities are recomputed) over strided views of qkv (row stride 3C), run in parallel over
// blocks; inside a parallel region oneDNN's sgemm runs single-threaded, so the two levels of
// parallelism do not fight.

void attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH, int64_t* off) {
  off[0] = 0;
  for (int s = 0; s < n_seq; ++s) {
    const int64_t L = cu_seqlens[s + 1] - cu_seqlens[s];
    off[s + 1] = off[s] + NH * L * L;
  }
}

std::vector<int64_t> attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH) {
  std::vector<int64_t> off(n_seq + 1);
  attention_probs_offsets(cu_seqlens, n_seq, NH, off.data());
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

int64_t attention_scratch_elems(int max_len, int threads, int head_size) {
  return static_cast<int64_t>(threads) * max_len *
         (3 * static_cast<int64_t>(max_len) + 4 * static_cast<int64_t>(head_size));
}

namespace {

// The probabilities of one (sequence, head) block: P = softmax(Q Kᵀ / sqrt(hs)) row by row. The
// forward pass and the recomputing backward pass both call this, so a rebuilt block is the kept
// one bit for bit.
// Q: the block's queries, rows `ld` apart, its keys `off` further on (a Head below).
template <typename T>
void probs_block(T* P, const T* Q, int ld, int off, int L, int hs, T scale) {
  gemm(false, true, L, L, hs, scale, Q, ld, Q + off, ld, T(0), P, L);
  for (int i = 0; i < L; ++i) {
    const int64_t r = static_cast<int64_t>(i) * L;
    softmax_row(P + r, P + r, L);
  }
}

// One (sequence, head) block's q | k | v as T rows: q at `q`, rows `ld` apart, k and v `off` and
// 2 * `off` further on. A T qkv is read in place (ld = 3C, off = C); a bf16 qkv is widened into
// the thread's scratch ([L, 3 hs]: ld = 3 hs, off = hs), once per block.
template <typename T>
struct Head {
  const T* q;
  int ld, off;
};
template <typename T, typename S>
Head<T> head_block(const S* qkv, int a, int L, int h, int hs, int C, T* scratch) {
  const int C3 = 3 * C;
  if constexpr (std::is_same_v<S, T>) {
    return {qkv + static_cast<int64_t>(a) * C3 + h * hs, C3, C};
  } else {
    for (int i = 0; i < L; ++i)
      for (int part = 0; part < 3; ++part) {
        const S* src = qkv + static_cast<int64_t>(a + i) * C3 + part * C + h * hs;
        T* dst = scratch + static_cast<int64_t>(i) * 3 * hs + part * hs;
        for (int j = 0; j < hs; ++j) dst[j] = to_float(src[j]);
      }
    return {scratch, 3 * hs, hs};
  }
}

// A row of probabilities as backward reads it when they are stored in bf16: rounded to bf16 (a
// no-op for values read back from bf16), then divided by their sum, so that the row sums to 1 as
// softmax's backward assumes (otherwise dS rows no longer sum to 0, and the key bias, whose true
// gradient is 0, picks up rounding noise).
template <typename T>
void decode_probs_row(T* p, int L) {
  T sum = 0;
  for (int j = 0; j < L; ++j) {
    p[j] = to_float(to_bf16(static_cast<float>(p[j])));
    sum += p[j];
  }
  const T inv = T(1) / sum;
  for (int j = 0; j < L; ++j) p[j] *= inv;
}

int max_length(const int32_t* cu_seqlens, int n_seq) {
  int L = 0;
  for (int s = 0; s < n_seq; ++s) L = std::max(L, cu_seqlens[s + 1] - cu_seqlens[s]);
  return L;
}

// The caller's working memory, or the kernel's own when the caller gave none.
template <typename T>
struct Work {
  std::vector<int64_t> own_offsets;
  std::vector<T> own_scratch;
  const int64_t* offsets;
  T* scratch;
  int64_t per_thread;
  Work(AttentionWork<T> w, const int32_t* cu_seqlens, int n_seq, int C, int NH) {
    const int L = max_length(cu_seqlens, n_seq);
    per_thread = attention_scratch_elems(L, 1, C / NH);
    offsets = w.offsets;
    if (!offsets) {
      own_offsets = attention_probs_offsets(cu_seqlens, n_seq, NH);
      offsets = own_offsets.data();
    }
    scratch = w.scratch;
    if (!scratch) {
      own_scratch.resize(attention_scratch_elems(L, omp_get_max_threads(), C / NH));
      scratch = own_scratch.data();
    }
  }
  T* thread_scratch() const { return scratch + per_thread * omp_get_thread_num(); }
};

}  // namespace

namespace {

// Per thread: three L x L blocks, then the widened q | k | v ([L, 3 hs]) and the output block
// ([L, hs]) of the bf16 forms.
template <typename T>
T* qkv_scratch(T* mine, int L) {
  return mine + 3 * static_cast<int64_t>(L) * L;
}
template <typename T>
T* out_scratch(T* mine, int L, int hs) {
  return qkv_scratch(mine, L) + 3 * static_cast<int64_t>(L) * hs;
}

// S: the storage of qkv (T, or bf16 widened per block). O = T writes each (sequence, head) block
// of the output in place; O = bf16 computes it in the thread's scratch and rounds it into the
// output (its only reader is a bf16 GEMM). P: the storage of the kept probabilities (T, or bf16:
// computed in scratch in T and rounded once; backward reads the rounded ones).
template <typename T, typename O, typename S, typename P_>
void attention_forward_to(O* out, P_* probs, const S* qkv, const int32_t* cu_seqlens, int n_seq,
                          int C, int NH, AttentionDropout dropout, AttentionWork<T> work) {
  const int hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - dropout.p));
  const DropoutMask mask(dropout.seed, dropout.key, dropout.p);
  const Work<T> w(work, cu_seqlens, n_seq, C, NH);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < NH; ++h) {
      const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a;
      const int64_t first = w.offsets[s] + static_cast<int64_t>(h) * L * L;
      const int64_t drawn = (dropout.first ? dropout.first[s] : w.offsets[s]) +
                            static_cast<int64_t>(h) * L * L;  // its place in the dropout stream
      T* mine = w.thread_scratch();
      T* P = mine;  // the probabilities (kept in place when stored in T)
      if constexpr (std::is_same_v<P_, T>)
        if (probs) P = probs + first;
      T* Pd = mine + static_cast<int64_t>(L) * L;  // their dropped copy
      const Head<T> x = head_block(qkv, a, L, h, hs, C, qkv_scratch(mine, L));
      probs_block(P, x.q, x.ld, x.off, L, hs, scale);
      if constexpr (!std::is_same_v<P_, T>)
        if (probs)
          for (int64_t i = 0; i < static_cast<int64_t>(L) * L; ++i)
            probs[first + i] = to_bf16(P[i]);
      if (dropout.p > 0)
        for (int i = 0; i < L; ++i) {
          const int64_t r = static_cast<int64_t>(i) * L;
          drop_row(Pd + r, P + r, L, mask, drawn + r, keep_scale);
        }
      const T* Pv = dropout.p > 0 ? Pd : P;
      if constexpr (std::is_same_v<O, T>) {
        gemm(false, false, L, hs, L, T(1), Pv, L, x.q + 2 * x.off, x.ld, T(0),
             out + static_cast<int64_t>(a) * C + h * hs, C);
      } else {
        T* block = out_scratch(mine, L, hs);  // [L, hs]
        gemm(false, false, L, hs, L, T(1), Pv, L, x.q + 2 * x.off, x.ld, T(0), block, hs);
        for (int i = 0; i < L; ++i) {
          O* o = out + static_cast<int64_t>(a + i) * C + h * hs;
          for (int j = 0; j < hs; ++j) o[j] = to_bf16(block[static_cast<int64_t>(i) * hs + j]);
        }
      }
    }
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, const int32_t* cu_seqlens, int n_seq, int C,
                       int NH, AttentionDropout dropout, AttentionWork<T> work) {
  attention_forward_to(out, probs, qkv, cu_seqlens, n_seq, C, NH, dropout, work);
}

void attention_forward(bf16* out, bf16* probs, const bf16* qkv, const int32_t* cu_seqlens,
                       int n_seq, int C, int NH, AttentionDropout dropout,
                       AttentionWork<float> work) {
  attention_forward_to(out, probs, qkv, cu_seqlens, n_seq, C, NH, dropout, work);
}

namespace {

// P_ as in attention_forward_to: bf16 probabilities are widened per block, and rebuilt ones
// (probs null) rounded through bf16 first, so that backward sees the same values either way.
template <typename T, typename S, typename P_>
void attention_backward_from(T* dqkv, const T* dout, const S* qkv, const P_* probs,
                             const int32_t* cu_seqlens, int n_seq, int C, int NH,
                             AttentionDropout dropout, AttentionWork<T> work) {
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - dropout.p));
  const DropoutMask mask(dropout.seed, dropout.key, dropout.p);
  const Work<T> w(work, cu_seqlens, n_seq, C, NH);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < NH; ++h) {
      const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a;
      const int64_t LL = static_cast<int64_t>(L) * L;
      const int64_t first = w.offsets[s] + static_cast<int64_t>(h) * LL;
      const int64_t drawn = (dropout.first ? dropout.first[s] : w.offsets[s]) + h * LL;
      T* mine = w.thread_scratch();
      const Head<T> x = head_block(qkv, a, L, h, hs, C, qkv_scratch(mine, L));
      const T* Q = x.q;
      T* dQ = dqkv + static_cast<int64_t>(a) * C3 + h * hs;
      const T* dO = dout + static_cast<int64_t>(a) * C + h * hs;
      T *dP = mine, *Pd = mine + LL;  // gradient of the (dropped) probabilities, dropped copy
      T* rebuilt = mine + 2 * LL;
      const T* P = rebuilt;  // the kept probabilities, or rebuilt ones in scratch
      if constexpr (std::is_same_v<P_, T>) {
        if (probs)
          P = probs + first;
        else
          probs_block(rebuilt, Q, x.ld, x.off, L, hs, scale);
      } else {
        if (probs)
          for (int64_t i = 0; i < LL; ++i) rebuilt[i] = to_float(probs[first + i]);
        else
          probs_block(rebuilt, Q, x.ld, x.off, L, hs, scale);
        for (int i = 0; i < L; ++i) decode_probs_row(rebuilt + static_cast<int64_t>(i) * L, L);
      }
      gemm(false, true, L, L, hs, T(1), dO, C, Q + 2 * x.off, x.ld, T(0), dP, L);  // dO V^T
      // Through the dropout mask, then the softmax: dS = P (dP - rowsum(P dP)) * scale.
      for (int i = 0; i < L; ++i) {
        const int64_t r = static_cast<int64_t>(i) * L;
        if (dropout.p > 0)
          drop_rows_backward(Pd + r, dP + r, P + r, L, mask, drawn + r, keep_scale);
        softmax_backward_row(dP + r, P + r, L, scale);
      }
      const T* Pv = dropout.p > 0 ? Pd : P;
      gemm(true, false, L, hs, L, T(1), Pv, L, dO, C, T(1), dQ + 2 * C, C3);     // dV += Pd^T dO
      gemm(false, false, L, hs, L, T(1), dP, L, Q + x.off, x.ld, T(1), dQ, C3);  // dQ += dS K
      gemm(true, false, L, hs, L, T(1), dP, L, Q, x.ld, T(1), dQ + C, C3);       // dK += dS^T Q
    }
}

}  // namespace

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH,
                        AttentionDropout dropout, AttentionWork<T> work) {
  attention_backward_from(dqkv, dout, qkv, probs, cu_seqlens, n_seq, C, NH, dropout, work);
}

void attention_backward(float* dqkv, const float* dout, const bf16* qkv, const bf16* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH,
                        AttentionDropout dropout, AttentionWork<float> work) {
  attention_backward_from(dqkv, dout, qkv, probs, cu_seqlens, n_seq, C, NH, dropout, work);
}

template void attention_forward<float>(float*, float*, const float*, const int32_t*, int, int, int,
                                       AttentionDropout, AttentionWork<float>);
template void attention_forward<double>(double*, double*, const double*, const int32_t*, int, int,
                                        int, AttentionDropout, AttentionWork<double>);
template void attention_backward<float>(float*, const float*, const float*, const float*,
                                        const int32_t*, int, int, int, AttentionDropout,
                                        AttentionWork<float>);
template void attention_backward<double>(double*, const double*, const double*, const double*,
                                         const int32_t*, int, int, int, AttentionDropout,
                                         AttentionWork<double>);

}  // namespace packbert::kernels
