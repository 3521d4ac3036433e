// The bf16 form of the cpu backend's attention (cpu/attention.h): on a CPU with AVX512-BF16,
// each (sequence, head) block of global attention as one thread's bf16 block products
// (kernels/block_gemm.h), a strip of kStrip rows at a time (cpu/attention_blocks.h).
#include <algorithm>

#include "kernels/cpu/attention_blocks.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA::attention_blocks {

namespace {

// The bf16 form goes through a block kStrip rows at a time, with the keys and the values (or
// their transpose) packed once per block at the start of its packing room; each strip's left
// operand is packed after them (`a`), when it is not read in place.
struct Strips {
  PackedB keys, values;
  bf16* a = nullptr;
};
// keys: Kᵀ, the scores' right operand (when `keys`); values: V for Pv V, or Vᵀ for dO Vᵀ
// (`transposed`).
Strips pack_strips(const Operands<float>& b, bool keys, bool transposed) {
  Strips st;
  bf16* room = b.pack;
  if (keys) st.keys = block_gemm_pack_b(b.hs, b.L, b.x16.K(true), room);
  room += block_gemm_packed_b_elems(b.hs, b.L);
  st.values = transposed ? block_gemm_pack_b(b.hs, b.L, b.x16.V(true), room)
                         : block_gemm_pack_b(b.L, b.hs, b.x16.V(), room);
  st.a =
      room + std::max(block_gemm_packed_b_elems(b.L, b.hs), block_gemm_packed_b_elems(b.hs, b.L));
  return st;
}
// P[rows, L] = softmax(scale Q Kᵀ) for the block's rows i0 .. i0 + rows: each element's sum and
// each row's softmax are those of the whole-block product, so forward and a recomputing backward
// agree bit for bit.
void probs_strip(float* P, const Operands<float>& b, const Strips& st, int i0, int rows,
                 float scale) {
  const int L = b.L;
  const MatView<bf16> q{b.x16.q + static_cast<int64_t>(i0) * b.x16.ld, b.x16.ld};
  block_gemm_bf16(rows, scale, q, st.keys, OutView{P, L}, st.a);
  for (int i = 0; i < rows; ++i) {
    const int64_t r = static_cast<int64_t>(i) * L;
    softmax_row(P + r, P + r, L);
  }
}

}  // namespace

// row_sums: e (at b.corrections + 2 hs).
void block_input_grads16(float* dQ, int ld, const bf16* Pv16, const bf16* dS16, const float* dO,
                         int ldo, const Operands<float>& b, GradWrite mode) {
  const int L = b.L, hs = b.hs, C = ld / 3;
  const bool add = mode == GradWrite::accumulate;
  // dVᵀ and dKᵀ go to scratch, then into dqkv through register transposes: written transposed
  // by the product itself, each tile would scatter short pieces of 32 rows of dqkv.
  block_gemm_bf16(hs, L, L, 1.0f, MatView<float>{dO, ldo, true}, MatView<bf16>{Pv16, L},
                  OutView{b.transposed, L}, b.pack);
  store_transposed(dQ + 2 * C, ld, b.transposed, hs, L, add);
  block_gemm_bf16(L, hs, L, 1.0f, MatView<bf16>{dS16, L}, b.x16.K(), OutView{dQ, ld, false, add},
                  b.pack);
  block_gemm_bf16(hs, L, L, 1.0f, b.x16.Q(true), MatView<bf16>{dS16, L}, OutView{b.transposed, L},
                  b.pack);
  store_transposed(dQ + C, ld, b.transposed, hs, L, add);
  // The rank-one corrections: kbar = mean of the keys, c = Σ_i e_i q_i / L.
  float* kbar = b.corrections;
  float* c = kbar + hs;
  const float* row_sums = c + hs;
  const float inv_L = 1.0f / static_cast<float>(L);
  std::fill(kbar, kbar + 2 * hs, 0.0f);
  for (int i = 0; i < L; ++i) {
    const bf16* q = b.x16.q + static_cast<int64_t>(i) * b.x16.ld;
    const bf16* k = q + b.x16.C;
    const float e = row_sums[i];
#pragma omp simd
    for (int j = 0; j < hs; ++j) {
      kbar[j] += to_float(k[j]);
      c[j] += e * to_float(q[j]);
    }
  }
  for (int j = 0; j < 2 * hs; ++j) kbar[j] *= inv_L;
  for (int i = 0; i < L; ++i) {
    float* dq = dQ + static_cast<int64_t>(i) * ld;
    float* dk = dq + C;
    const float e = row_sums[i];
#pragma omp simd
    for (int j = 0; j < hs; ++j) {
      dq[j] -= e * kbar[j];
      dk[j] -= c[j];
    }
  }
}

// The bf16 form's forward of one block into dst [L, hs] (rows ld apart), a strip at a time: the
// scores and their softmax, the probabilities stored rounded (when `probs`, the block's first),
// the dropped ones rounded into the strip's Pv, and the strip's rows of Pv V.
void forward_strips(float* dst, int ld, bf16* probs, const Operands<float>& x, float* mine,
                    const DropoutMask& mask, int64_t drawn, bool drop, float keep_scale,
                    float scale) {
  const int L = x.L;
  const Strips st = pack_strips(x, true, false);
  float* P = mine;                                                           // [rows, L]
  bf16* Pv16 = reinterpret_cast<bf16*>(mine + static_cast<int64_t>(L) * L);  // [rows, L]
  for (int i0 = 0; i0 < L; i0 += kStrip) {
    const int rows = std::min(kStrip, L - i0);
    const int64_t at = static_cast<int64_t>(i0) * L, n = static_cast<int64_t>(rows) * L;
    probs_strip(P, x, st, i0, rows, scale);
    if (probs) store_rounded_nt(probs + at, P, n);
    if (drop)
      for (int i = 0; i < rows; ++i) {
        const int64_t r = static_cast<int64_t>(i) * L;
        drop_row(Pv16 + r, P + r, L, mask, drawn + at + r, keep_scale);
      }
    else
      round_to_bf16(Pv16, P, n);
    block_gemm_bf16(rows, 1.0f, MatView<bf16>{Pv16, L}, st.values,
                    OutView{dst + static_cast<int64_t>(i0) * ld, ld}, st.a);
  }
}

// The bf16 form's backward of one block up to its products, a strip at a time: the probabilities
// (the kept ones widened, or rebuilt when `probs` is null), dP = dO Vᵀ, then through the dropout
// mask and the softmax to dS. The dropped probabilities and dS go, rounded, into whole-block
// Pv16 and dS16 [L, L] for the dV, dQ and dK products; dS's row sums into the corrections.
void backward_strips(bf16* Pv16, bf16* dS16, const bf16* probs, const float* dO, int ldo,
                     const Operands<float>& x, float* mine, const DropoutMask& mask, int64_t drawn,
                     bool drop, float keep_scale, float scale) {
  const int L = x.L, hs = x.hs;
  const int64_t LL = static_cast<int64_t>(L) * L;
  const Strips st = pack_strips(x, probs == nullptr, true);
  float *dP = mine, *P = mine + 2 * LL;  // [rows, L] each
  for (int i0 = 0; i0 < L; i0 += kStrip) {
    const int rows = std::min(kStrip, L - i0);
    const int64_t at = static_cast<int64_t>(i0) * L, n = static_cast<int64_t>(rows) * L;
    if (probs)
      for (int64_t i = 0; i < n; ++i) P[i] = to_float(probs[at + i]);
    else
      probs_strip(P, x, st, i0, rows, scale);
    for (int i = 0; i < rows; ++i)
      decode_probs_row<bf16>(P + static_cast<int64_t>(i) * L, L, probs == nullptr);
    block_gemm_bf16(rows, 1.0f, MatView<float>{dO + static_cast<int64_t>(i0) * ldo, ldo}, st.values,
                    OutView{dP, L}, st.a);
    for (int i = 0; i < rows; ++i) {
      const int64_t r = static_cast<int64_t>(i) * L, R = at + r;
      if (drop)
        drop_rows_backward(Pv16 + R, dP + r, P + r, L, mask, drawn + R, keep_scale);
      else
        round_to_bf16(Pv16 + R, P + r, L);
      softmax_backward_row(dP + r, P + r, L, scale);
      x.corrections[2 * hs + i0 + i] = round_row_bf16(dS16 + R, dP + r, L);
    }
  }
}

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA::attention_blocks
