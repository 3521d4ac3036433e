#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/block_gemm.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/gemm.h"
#include "kernels/dropout.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

// Each (sequence, head) block is two GEMMs forward (Q·Kᵀ, P·V) and four backward (five when the
// probabilities are recomputed) over strided views of qkv (row stride 3C), run in parallel over
// blocks; inside a parallel region oneDNN's sgemm runs single-threaded, so the two levels of
// parallelism do not fight. Under bf16 (a bf16 qkv) on a CPU with AVX512-BF16, all six products
// run as one thread's bf16 block products instead (kernels/block_gemm.h), on q, k and v as
// stored, with the (dropped) probabilities and dS rounded to bf16 by the loops that write them
// and dO as it is packed; dS is re-centred so its rows still sum to zero (block_input_grads says
// why). The bf16 form takes each block through scores, softmax, dropout, Pv V and dO Vᵀ a strip
// of 64 rows at a time, so that a strip's values stay in L2 from one pass to the next.

using namespace attention_blocks;

int64_t attention_scratch_elems(int max_len, int threads, int head_size) {
  return static_cast<int64_t>(threads) *
         (static_cast<int64_t>(max_len) *
              (3 * static_cast<int64_t>(max_len) + 4 * static_cast<int64_t>(head_size)) +
          pack_floats(max_len, head_size));
}

namespace {

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
  int max_len;
  Work(AttentionWork<T> w, const int32_t* cu_seqlens, int n_seq, int C, int NH, int window) {
    const int L = max_length(cu_seqlens, n_seq);
    max_len = L;
    per_thread = attention_scratch_elems(L, 1, C / NH);
    offsets = w.offsets;
    if (!offsets) {
      own_offsets = attention_probs_offsets(cu_seqlens, n_seq, NH, window);
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

// The T form goes through a block a tile at a time (attention_layout.h): queries i0 .. i0 + rows
// against the band of B keys from k0; global attention is one tile of the whole block (rows = B
// = L, k0 = 0). half: window / 2, the reach of a query under sliding-window attention.
struct Tile {
  int i0, rows, k0, B, half;
  bool global;
  // Row i's keys within reach, as columns of the band: [lo(i), hi(i)).
  int lo(int i) const { return global ? 0 : std::max(0, i0 + i - half - k0); }
  int hi(int i) const { return global ? B : std::min(B, i0 + i + half + 1 - k0); }
};
Tile tile_at(int i0, int L, int window) {
  const int tile = static_cast<int>(attention_tile(L, window));
  return {i0,
          std::min(tile, L - i0),
          static_cast<int>(attention_band_start(i0, L, window)),
          static_cast<int>(attention_band(L, window)),
          window / 2,
          window <= 0};
}

// The T form's products, each a T gemm over a tile. P[rows, B] = softmax(scale Q Kᵀ) row by row
// over the keys within each row's reach (0 elsewhere): forward and a recomputing backward both
// call this, so a rebuilt block is the kept one bit for bit.
template <typename T>
void tile_probs(T* P, const Operands<T>& b, const Tile& t, T scale) {
  const int ld = b.x.ld;
  const T* q = b.x.q + static_cast<int64_t>(t.i0) * ld;
  const T* k = b.x.q + b.x.off + static_cast<int64_t>(t.k0) * ld;
  gemm(false, true, t.rows, t.B, b.hs, scale, q, ld, k, ld, T(0), P, t.B);
  for (int i = 0; i < t.rows; ++i) {
    T* p = P + static_cast<int64_t>(i) * t.B;
    const int lo = t.lo(i), hi = t.hi(i);
    softmax_row(p + lo, p + lo, hi - lo);
    std::fill(p, p + lo, T(0));
    std::fill(p + hi, p + t.B, T(0));
  }
}
// The tile's rows of out (rows ldo apart from the block's first) = Pv V.
template <typename T>
void tile_pv(T* out, int ldo, const T* Pv, const Operands<T>& b, const Tile& t) {
  const T* v = b.x.q + 2 * b.x.off + static_cast<int64_t>(t.k0) * b.x.ld;
  gemm(false, false, t.rows, b.hs, t.B, T(1), Pv, t.B, v, b.x.ld, T(0),
       out + static_cast<int64_t>(t.i0) * ldo, ldo);
}
// dP[rows, B] = dO Vᵀ (dO: the block's, rows ldo apart).
template <typename T>
void tile_dp(T* dP, const T* dO, int ldo, const Operands<T>& b, const Tile& t) {
  const T* v = b.x.q + 2 * b.x.off + static_cast<int64_t>(t.k0) * b.x.ld;
  gemm(false, true, t.rows, t.B, b.hs, T(1), dO + static_cast<int64_t>(t.i0) * ldo, ldo, v, b.x.ld,
       T(0), dP, t.B);
}

// dV += Pvᵀ dO, dQ += dS K, dK += dSᵀ Q into dQ's block of dqkv (rows ld apart; = instead of +=
// under GradWrite::overwrite). The bf16 form of dV computes dVᵀ = dOᵀ Pv (so that both of its
// operands pack row by row) and writes it back transposed, and dK likewise as (Qᵀ dS)ᵀ.
// The bf16 form (block_input_grads16) takes Pv and dS rounded to bf16 by their producers (dS by
// round_row_bf16, with its row sums e). Softmax's
// backward makes every row of dS sum to 0, which is why the key bias's true gradient is 0 (the
// sum of dK's rows is Σ_i rowsum_i(dS) q_i), and rounding breaks it: left alone, the key bias
// would collect a rounding noise of about 1e-4 of the model's largest gradient. So both products
// use dS' = dS - e / L (each row's sum spread evenly over its L keys, a move within the
// rounding), applied after the bf16 products as rank-one corrections:
//   dQ' = dS K - e ⊗ mean_j(k_j),   dK' = dSᵀ Q - 1 ⊗ (Σ_i e_i q_i) / L,
// whose rows sum, for dK', to 0 up to fp32 rounding.
// The T form, a tile at a time: dV and dK of the band's keys, dQ of the tile's queries (dQ, dO:
// the block's first rows).
template <typename T>
void tile_input_grads(T* dQ, int ld, const T* Pv, const T* dS, const T* dO, int ldo,
                      const Operands<T>& b, const Tile& t, GradWrite mode) {
  const int hs = b.hs, C = ld / 3, xl = b.x.ld;
  const T beta = mode == GradWrite::accumulate ? T(1) : T(0);
  const T* Q = b.x.q;
  const int64_t i0 = t.i0, k0 = t.k0;
  gemm(true, false, t.B, hs, t.rows, T(1), Pv, t.B, dO + i0 * ldo, ldo, beta, dQ + 2 * C + k0 * ld,
       ld);  // dV
  gemm(false, false, t.rows, hs, t.B, T(1), dS, t.B, Q + b.x.off + k0 * xl, xl, beta, dQ + i0 * ld,
       ld);  // dQ
  gemm(true, false, t.B, hs, t.rows, T(1), dS, t.B, Q + i0 * xl, xl, beta, dQ + C + k0 * ld,
       ld);  // dK
}

// What every (sequence, head) block of a call shares: the head size, the scores' scale
// 1 / sqrt(hs), dropout's mask and keep scale, the working memory, and whether the block
// products run in bf16 (S: the storage of qkv).
template <typename T, typename S>
struct BlockConstants {
  int hs;
  T scale, keep_scale;
  DropoutMask mask;
  Work<T> w;
  bool products16;
  int window;
  BlockConstants(const int32_t* cu_seqlens, int n_seq, int C, int NH, int window_,
                 const AttentionDropout& dropout, AttentionWork<T> work)
      : hs(C / NH),
        scale(T(1) / std::sqrt(static_cast<T>(hs))),
        keep_scale(static_cast<T>(1.0 / (1.0 - dropout.p))),
        mask(dropout.seed, dropout.key, dropout.p),
        w(work, cu_seqlens, n_seq, C, NH, window_),
        products16(std::is_same_v<S, bf16> && block_gemm_bf16_available()),
        window(window_) {}
  // The probabilities' row length in a sequence of L tokens (L: global attention).
  int band(int L) const { return static_cast<int>(attention_band(L, window)); }
  // Whether every token of a sequence of L sees every other (global attention, or a window as
  // wide as the sequence): the only blocks the bf16 block products take. (A band of L is not
  // enough: a sequence shorter than a tile's band still has keys outside a row's window.)
  bool sees_all(int L) const { return window <= 0 || window / 2 >= L - 1; }
};

// S: the storage of qkv (T, or bf16 | f16 widened per block; bf16 products read bf16 as stored).
// O = T writes each (sequence, head) block of the output in place; O = bf16 | f16 computes it in
// the thread's scratch and rounds it into the output (its only reader is a GEMM). P: the storage
// of the kept probabilities (T, or 16-bit: computed in scratch in T and rounded once; backward
// reads the rounded ones).
template <typename T, typename O, typename S, typename P_>
void attention_forward_to(O* out, P_* probs, const S* qkv, const int32_t* cu_seqlens, int n_seq,
                          int C, int NH, int window, AttentionDropout dropout,
                          AttentionWork<T> work) {
  const BlockConstants<T, S> k(cu_seqlens, n_seq, C, NH, window, dropout, work);
  const Work<T>& w = k.w;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < NH; ++h) {
      const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a, B = k.band(L);
      const int64_t LB = static_cast<int64_t>(L) * B;
      const int64_t first = w.offsets[s] + h * LB;
      const int64_t drawn = (dropout.first ? dropout.first[s] : w.offsets[s]) +
                            h * LB;  // its place in the dropout stream
      T* mine = w.thread_scratch();
      // bf16 block products take whole blocks of global attention only.
      const Operands<T> x =
          block_operands(qkv, a, L, h, k.hs, C, mine, w.max_len, k.products16 && k.sees_all(L));
      // out = Pv V through `into(dst, ld)`, in place, or into scratch and rounded.
      auto write_out = [&](auto into) {
        if constexpr (std::is_same_v<O, T>) {
          into(out + static_cast<int64_t>(a) * C + h * k.hs, C);
        } else {
          T* block = out_scratch(mine, L, k.hs);  // [L, hs]
          into(block, k.hs);
          for (int i = 0; i < L; ++i) {
            O* o = out + static_cast<int64_t>(a + i) * C + h * k.hs;
            for (int j = 0; j < k.hs; ++j)
              o[j] = to_half<O>(block[static_cast<int64_t>(i) * k.hs + j]);
          }
        }
      };
      if constexpr (std::is_same_v<T, float> && std::is_same_v<S, bf16>)
        if (x.pack) {
          write_out([&](float* dst, int ld) {
            forward_strips(dst, ld, probs ? probs + first : nullptr, x, mine, k.mask, drawn,
                           dropout.p > 0, k.keep_scale, k.scale);
          });
          continue;
        }
      const int tile = static_cast<int>(attention_tile(L, window));
      write_out([&](T* dst, int ld) {
        for (int i0 = 0; i0 < L; i0 += tile) {
          const Tile t = tile_at(i0, L, window);
          const int64_t at = static_cast<int64_t>(i0) * B, n = static_cast<int64_t>(t.rows) * B;
          T* P = mine;  // the tile's probabilities (kept in place when stored in T)
          if constexpr (std::is_same_v<P_, T>)
            if (probs) P = probs + first + at;
          T* Pd = mine + static_cast<int64_t>(L) * L;  // their dropped copy
          tile_probs(P, x, t, k.scale);
          if constexpr (!std::is_same_v<P_, T>)
            if (probs) store_rounded_nt(probs + first + at, P, n);
          // Pv = P or its dropped copy.
          if (dropout.p > 0)
            for (int i = 0; i < t.rows; ++i) {
              const int64_t r = static_cast<int64_t>(i) * B;
              drop_row(Pd + r, P + r, B, k.mask, drawn + at + r, k.keep_scale);
            }
          tile_pv(dst, ld, dropout.p > 0 ? Pd : P, x, t);
        }
      });
    }
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, const int32_t* cu_seqlens, int n_seq, int C,
                       int NH, int window, AttentionDropout dropout, AttentionWork<T> work) {
  attention_forward_to(out, probs, qkv, cu_seqlens, n_seq, C, NH, window, dropout, work);
}

void attention_forward(bf16* out, bf16* probs, const bf16* qkv, const int32_t* cu_seqlens,
                       int n_seq, int C, int NH, int window, AttentionDropout dropout,
                       AttentionWork<float> work) {
  attention_forward_to(out, probs, qkv, cu_seqlens, n_seq, C, NH, window, dropout, work);
}
void attention_forward(f16* out, f16* probs, const f16* qkv, const int32_t* cu_seqlens, int n_seq,
                       int C, int NH, int window, AttentionDropout dropout,
                       AttentionWork<float> work) {
  attention_forward_to(out, probs, qkv, cu_seqlens, n_seq, C, NH, window, dropout, work);
}

namespace {

// P_ as in attention_forward_to: bf16 probabilities are widened per block, and rebuilt ones
// (probs null) rounded through bf16 first, so that backward sees the same values either way.
template <typename T, typename S, typename P_>
void attention_backward_from(T* dqkv, const T* dout, const S* qkv, const P_* probs,
                             const int32_t* cu_seqlens, int n_seq, int C, int NH, int window,
                             AttentionDropout dropout, AttentionWork<T> work, GradWrite mode) {
  const BlockConstants<T, S> k(cu_seqlens, n_seq, C, NH, window, dropout, work);
  const Work<T>& w = k.w;
  const int C3 = 3 * C;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < NH; ++h) {
      const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a, B = k.band(L);
      const int64_t LL = static_cast<int64_t>(L) * L, LB = static_cast<int64_t>(L) * B;
      const int64_t first = w.offsets[s] + h * LB;
      const int64_t drawn = (dropout.first ? dropout.first[s] : w.offsets[s]) + h * LB;
      T* mine = w.thread_scratch();
      const Operands<T> x =
          block_operands(qkv, a, L, h, k.hs, C, mine, w.max_len, k.products16 && k.sees_all(L));
      T* dQ = dqkv + static_cast<int64_t>(a) * C3 + h * k.hs;
      const T* dO = dout + static_cast<int64_t>(a) * C + h * k.hs;
      T *dP = mine, *Pd = mine + LL;  // gradient of the (dropped) probabilities, dropped copy
      if constexpr (std::is_same_v<T, float> && std::is_same_v<S, bf16>)
        if (x.pack) {  // Pv and dS rounded to bf16 as they are written, into Pd's room
          bf16 *Pv16 = reinterpret_cast<bf16*>(Pd), *dS16 = Pv16 + LL;
          backward_strips(Pv16, dS16, probs ? probs + first : nullptr, dO, C, x, mine, k.mask,
                          drawn, dropout.p > 0, k.keep_scale, k.scale);
          block_input_grads16(dQ, C3, Pv16, dS16, dO, C, x, mode);  // dV, dQ, dK
          continue;
        }
      // Tiles' bands overlap in dK and dV: written over, the block is cleared, then summed into.
      const int tile = static_cast<int>(attention_tile(L, window));
      GradWrite tile_mode = mode;
      if (tile < L && mode == GradWrite::overwrite) {
        for (int i = 0; i < L; ++i)
          for (int part = 0; part < 3; ++part)
            std::fill_n(dQ + static_cast<int64_t>(i) * C3 + part * C, k.hs, T(0));
        tile_mode = GradWrite::accumulate;
      }
      for (int i0 = 0; i0 < L; i0 += tile) {
        const Tile t = tile_at(i0, L, window);
        const int64_t at = static_cast<int64_t>(i0) * B, n = static_cast<int64_t>(t.rows) * B;
        T* rebuilt = mine + 2 * LL;
        const T* P = rebuilt;  // the kept probabilities, or rebuilt ones in scratch
        if constexpr (std::is_same_v<P_, T>) {
          if (probs)
            P = probs + first + at;
          else
            tile_probs(rebuilt, x, t, k.scale);
        } else {
          if (probs)
            for (int64_t i = 0; i < n; ++i) rebuilt[i] = to_float(probs[first + at + i]);
          else
            tile_probs(rebuilt, x, t, k.scale);
          for (int i = 0; i < t.rows; ++i)
            decode_probs_row<P_>(rebuilt + static_cast<int64_t>(i) * B, B, probs == nullptr);
        }
        tile_dp(dP, dO, C, x, t);  // dO Vᵀ
        // Through the dropout k.mask, then the softmax: dS = P (dP - rowsum(P dP)) * k.scale.
        for (int i = 0; i < t.rows; ++i) {
          const int64_t r = static_cast<int64_t>(i) * B;
          if (dropout.p > 0)
            drop_rows_backward(Pd + r, dP + r, P + r, B, k.mask, drawn + at + r, k.keep_scale);
          softmax_backward_row(dP + r, P + r, B, k.scale);
        }
        tile_input_grads(dQ, C3, dropout.p > 0 ? Pd : P, dP, dO, C, x, t, tile_mode);
      }
    }
}

}  // namespace

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH, int window,
                        AttentionDropout dropout, AttentionWork<T> work, GradWrite mode) {
  attention_backward_from(dqkv, dout, qkv, probs, cu_seqlens, n_seq, C, NH, window, dropout, work,
                          mode);
}

void attention_backward(float* dqkv, const float* dout, const bf16* qkv, const bf16* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH, int window,
                        AttentionDropout dropout, AttentionWork<float> work, GradWrite mode) {
  attention_backward_from(dqkv, dout, qkv, probs, cu_seqlens, n_seq, C, NH, window, dropout, work,
                          mode);
}
void attention_backward(float* dqkv, const float* dout, const f16* qkv, const f16* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH, int window,
                        AttentionDropout dropout, AttentionWork<float> work, GradWrite mode) {
  attention_backward_from(dqkv, dout, qkv, probs, cu_seqlens, n_seq, C, NH, window, dropout, work,
                          mode);
}

template void attention_forward<float>(float*, float*, const float*, const int32_t*, int, int, int,
                                       int, AttentionDropout, AttentionWork<float>);
template void attention_forward<double>(double*, double*, const double*, const int32_t*, int, int,
                                        int, int, AttentionDropout, AttentionWork<double>);
template void attention_backward<float>(float*, const float*, const float*, const float*,
                                        const int32_t*, int, int, int, int, AttentionDropout,
                                        AttentionWork<float>, GradWrite);
template void attention_backward<double>(double*, const double*, const double*, const double*,
                                         const int32_t*, int, int, int, int, AttentionDropout,
                                         AttentionWork<double>, GradWrite);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
