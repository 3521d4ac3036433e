#include "kernels/cpu/attention.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/block_gemm.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/transpose16.h"
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

namespace {

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
void store_transposed(float* dst, int ld, const float* t, int rows, int cols, bool add) {
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

}  // namespace

namespace {

// Rows of a block that the bf16 form takes through its scores, softmax, dropout and products at
// a time: a strip's scores (64 x 512 floats at L = 512) stay in L2 between the passes, where a
// whole block's (1 MB) would go out to L3 and back at every pass.
constexpr int kStrip = 64;

// bf16 elements of packing room the bf16 form needs for one block: for its whole-block products
// (the largest of the three shapes L x L x hs, L x hs x L, hs x L x L), or, earlier in the same
// block, for the strips: the keys and the values packed once, then a strip's left operand.
int64_t pack_elems(int L, int hs) {
  const int64_t whole = std::max({block_gemm_pack_elems(L, L, hs), block_gemm_pack_elems(L, hs, L),
                                  block_gemm_pack_elems(hs, L, L)});
  const int64_t strips =
      block_gemm_packed_b_elems(hs, L) +
      std::max(block_gemm_packed_b_elems(L, hs), block_gemm_packed_b_elems(hs, L)) +
      block_gemm_pack_elems(kStrip, 0, std::max(L, hs));
  return std::max(whole, strips);
}
// The same in floats, with room to align.
int64_t pack_floats(int L, int hs) {
  return (pack_elems(L, hs) + 1) / 2 + 16;
}

}  // namespace

int64_t attention_scratch_elems(int max_len, int threads, int head_size) {
  return static_cast<int64_t>(threads) *
         (static_cast<int64_t>(max_len) *
              (3 * static_cast<int64_t>(max_len) + 4 * static_cast<int64_t>(head_size)) +
          pack_floats(max_len, head_size));
}

namespace {

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
