// What the two forms of the cpu backend's attention share (cpu/attention.h), private to
// cpu/attention*.cpp: the row operations (dropout, softmax's backward, rounding), a (sequence,
// head) block's operands and its share of the thread's scratch. The T form (attention.cpp) runs
// per-tile GEMMs; the bf16 form (attention_bf16.cpp) one thread's bf16 block products, a strip
// of kStrip rows at a time.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/block_gemm.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/transpose16.h"
#include "kernels/dropout.h"
#include "kernels/grad_write.h"
#include "kernels/tensor.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA::attention_blocks {

// out[j] = keep(first + j) ? x[j] * scale : 0, stored as O (rounded to bf16 where it is a bf16
// block product's operand, written by its producer instead of packed from fp32).
template <typename O, typename T>
void drop_row(O* __restrict out, const T* __restrict x, int L, const DropoutMask& mask,
              uint64_t first, T scale) {
#pragma omp simd
  for (int j = 0; j < L; ++j) out[j] = convert_to<O>(mask.keep(first + j) ? x[j] * scale : T(0));
}

// Backward through the mask, evaluating it once for both uses: pd = p * mask / keep (the dropped
// probabilities dV needs) and d <- d * mask / keep.
template <typename O, typename T>
void drop_rows_backward(O* __restrict pd, T* __restrict d, const T* __restrict p, int L,
                        const DropoutMask& mask, uint64_t first, T scale) {
#pragma omp simd
  for (int j = 0; j < L; ++j) {
    const bool keep = mask.keep(first + j);
    pd[j] = convert_to<O>(keep ? p[j] * scale : T(0));
    d[j] = keep ? d[j] * scale : T(0);
  }
}

// out = x rounded to bf16, [n].
inline void round_to_bf16(bf16* __restrict out, const float* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(x[i]);
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

// dst[i] = to_half<H>(src[i]) for i < n, in non-temporal stores where the CPU has AVX-512: the
// kept probabilities (25 MB a BERT-base layer at 4 x 512) are read only by the backward pass,
// long after the caches have turned over, and a store through the caches would first read
// every line in.
template <typename H>
void store_rounded_nt(H* dst, const float* src, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  constexpr int64_t kLine = 64 / sizeof(H);
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 64 != 0; ++i) dst[i] = to_half<H>(src[i]);
  for (; i + kLine <= n; i += kLine) {
    alignas(64) H line[kLine];
#pragma omp simd
    for (int64_t j = 0; j < kLine; ++j) line[j] = to_half<H>(src[i + j]);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_load_si512(line));
  }
  _mm_sfence();
#endif
  for (; i < n; ++i) dst[i] = to_half<H>(src[i]);
}

// dst[j][i] = t[i][j], or += under `add`, for i < rows, j < cols: t is [rows, cols], dst's rows ld
// apart. By 16 x 16 blocks transposed in registers where the CPU has AVX-512; the edges (and
// everything without AVX-512) one element at a time.
inline void store_transposed(float* dst, int ld, const float* t, int rows, int cols, bool add) {
  int rows16 = 0, cols16 = 0;
#ifdef __AVX512F__
  rows16 = rows / 16 * 16, cols16 = cols / 16 * 16;
  for (int i0 = 0; i0 < rows16; i0 += 16)
    for (int j0 = 0; j0 < cols16; j0 += 16) {
      __m512i v[16];
      for (int l = 0; l < 16; ++l)
        v[l] = _mm512_castps_si512(_mm512_loadu_ps(t + static_cast<int64_t>(i0 + l) * cols + j0));
      transpose16(v);
      for (int l = 0; l < 16; ++l) {
        float* d = dst + static_cast<int64_t>(j0 + l) * ld + i0;
        const __m512 x = _mm512_castsi512_ps(v[l]);
        _mm512_storeu_ps(d, add ? _mm512_add_ps(_mm512_loadu_ps(d), x) : x);
      }
    }
#endif
  for (int j = 0; j < cols; ++j) {
    float* d = dst + static_cast<int64_t>(j) * ld;
    for (int i = j < cols16 ? rows16 : 0; i < rows; ++i) {
      const float x = t[static_cast<int64_t>(i) * cols + j];
      d[i] = add ? d[i] + x : x;
    }
  }
}

// A row of dS rounded to bf16 (the operand of both of its bf16 products); returns the sum of the
// rounded row.
inline float round_row_bf16(bf16* __restrict out, const float* __restrict d, int L) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < L; ++j) {
    out[j] = to_bf16(d[j]);
    sum += to_float(out[j]);
  }
  return sum;
}

// Rows of a block that the bf16 form takes through its scores, softmax, dropout and products at
// a time: a strip's scores (64 x 512 floats at L = 512) stay in L2 between the passes, where a
// whole block's (1 MB) would go out to L3 and back at every pass.
constexpr int kStrip = 64;

// bf16 elements of packing room the bf16 form needs for one block: for its whole-block products
// (the largest of the three shapes L x L x hs, L x hs x L, hs x L x L), or, earlier in the same
// block, for the strips: the keys and the values packed once, then a strip's left operand.
inline int64_t pack_elems(int L, int hs) {
  const int64_t whole = std::max({block_gemm_pack_elems(L, L, hs), block_gemm_pack_elems(L, hs, L),
                                  block_gemm_pack_elems(hs, L, L)});
  const int64_t strips =
      block_gemm_packed_b_elems(hs, L) +
      std::max(block_gemm_packed_b_elems(L, hs), block_gemm_packed_b_elems(hs, L)) +
      block_gemm_pack_elems(kStrip, 0, std::max(L, hs));
  return std::max(whole, strips);
}
// The same in floats, with room to align.
inline int64_t pack_floats(int L, int hs) {
  return (pack_elems(L, hs) + 1) / 2 + 16;
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

// A row of probabilities as backward reads it when they are stored in 16 bits (P_): rounded to
// P_ (a no-op for values read back from P_), then divided by their sum, so that the row sums to 1
// as softmax's backward assumes (otherwise dS rows no longer sum to 0, and the key bias, whose
// true gradient is 0, picks up rounding noise).
// `round` is false for a row read back from P_, where rounding would change nothing.
template <typename P_, typename T>
void decode_probs_row(T* __restrict p, int L, bool round) {
  if (round)
    for (int j = 0; j < L; ++j) p[j] = to_float(to_half<P_>(static_cast<float>(p[j])));
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < L; ++j) sum += p[j];
  const T inv = T(1) / sum;
#pragma omp simd
  for (int j = 0; j < L; ++j) p[j] *= inv;
}

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
// The bf16 block products' packing room, after the output block; sized for the longest
// sequence (max_len), so it does not move with L.
template <typename T>
bf16* pack_scratch(T* mine, int max_len, int hs) {
  return reinterpret_cast<bf16*>(out_scratch(mine, max_len, hs) +
                                 static_cast<int64_t>(max_len) * hs);
}

// One (sequence, head) block of a bf16 qkv as stored: q at q, rows 3C apart, k and v C and 2C on.
struct Head16 {
  const bf16* q;
  int ld, C;
  MatView<bf16> Q(bool trans = false) const { return {q, ld, trans}; }
  MatView<bf16> K(bool trans = false) const { return {q + C, ld, trans}; }
  MatView<bf16> V(bool trans = false) const { return {q + 2 * C, ld, trans}; }
};

// One (sequence, head) block's operands: q | k | v as T rows for T products (in place, or
// widened into scratch), or, with `pack` set, as stored in bf16 for bf16 block products.
template <typename T>
struct Operands {
  Head<T> x{};
  Head16 x16{};
  bf16* pack = nullptr;
  // Scratch for the bf16 form's dS corrections (block_input_grads): the mean key and Σ e_i q_i
  // (2 hs floats), then dS's row sums (L); fits the [L, 3 hs] the T form widens q | k | v into.
  T* corrections = nullptr;
  // [hs, L] for the bf16 form's transposed products (dVᵀ, dKᵀ) before they are written back.
  T* transposed = nullptr;
  int L = 0, hs = 0;
};
template <typename T, typename S>
Operands<T> block_operands(const S* qkv, int a, int L, int h, int hs, int C, T* mine, int max_len,
                           bool products16) {
  Operands<T> b;
  b.L = L, b.hs = hs;
  if constexpr (std::is_same_v<S, bf16>)
    if (products16) {
      b.x16 = {qkv + static_cast<int64_t>(a) * 3 * C + h * hs, 3 * C, C};
      b.pack = pack_scratch(mine, max_len, hs);
      b.corrections = qkv_scratch(mine, L);
      b.transposed = out_scratch(mine, L, hs);
      return b;
    }
  b.x = head_block(qkv, a, L, h, hs, C, qkv_scratch(mine, L));
  return b;
}

// The bf16 form (attention_bf16.cpp), on a block whose operands block_operands packed.
// Forward of one block into dst [L, hs] (rows ld apart), a strip at a time.
void forward_strips(float* dst, int ld, bf16* probs, const Operands<float>& x, float* mine,
                    const DropoutMask& mask, int64_t drawn, bool drop, float keep_scale,
                    float scale);
// Backward up to the products: Pv and dS rounded into Pv16 and dS16 [L, L].
void backward_strips(bf16* Pv16, bf16* dS16, const bf16* probs, const float* dO, int ldo,
                     const Operands<float>& x, float* mine, const DropoutMask& mask, int64_t drawn,
                     bool drop, float keep_scale, float scale);
// dV, dQ and dK from them (attention.cpp's tile_input_grads says what both forms compute).
void block_input_grads16(float* dQ, int ld, const bf16* Pv16, const bf16* dS16, const float* dO,
                         int ldo, const Operands<float>& b, GradWrite mode);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA::attention_blocks
