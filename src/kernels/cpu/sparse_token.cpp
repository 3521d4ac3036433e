// The token-major block-sparse kernels (every block size, float and double; cpu/sparse.h): the
// activations packed in transposed tiles of kTokenTile tokens (cpu/sparse_lanes.h).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/sparse_lanes.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA::sparse_kernels {

namespace {

// packedT[tile][c][t] = src[tile * TT + t][c] for src [N, width], zeros past N. With colsum,
// also colsum[c] += sum over t of src[t][c] (the bias gradient): per-tile sums in
// partial[tile][width], then each column adds its tiles in order (thread-count independent).
template <typename T, typename S = T>
void pack_tiles_transposed(T* packedT, const S* src, int N, int width, T* colsum, T* partial) {
  constexpr int TT = kTokenTile, kCols = 16;
  const int tiles = token_tiles(N), chunks = (width + kCols - 1) / kCols;
#pragma omp parallel
  {
#pragma omp for collapse(2) schedule(static)
    for (int tile = 0; tile < tiles; ++tile)
      for (int ch = 0; ch < chunks; ++ch) {
        const int c0 = ch * kCols, nc = std::min(kCols, width - c0);
        const int nt = std::min(TT, N - tile * TT);
        T* dst = packedT + (static_cast<int64_t>(tile) * width + c0) * TT;
        const S* rows = src + static_cast<int64_t>(tile) * TT * width + c0;
        for (int t0 = 0; t0 < TT; t0 += 16) {
          if (t0 < nt) {
            const int rt = std::min(16, nt - t0);
            if constexpr (std::is_same_v<S, T>) {
              transpose_tile(rows + static_cast<int64_t>(t0) * width, width, dst + t0, TT, rt, nc);
            } else {  // 16-bit activations: widened into a 16 x 16 block, then transposed
              alignas(64) T wide[16][16];
              widen_block<T>(wide, rows + static_cast<int64_t>(t0) * width, width, rt, nc);
              transpose_tile(&wide[0][0], 16, dst + t0, TT, rt, nc);
            }
          }
          for (int c = 0; c < nc; ++c)
            std::fill(dst + c * TT + std::max(t0, std::min(nt, t0 + 16)), dst + c * TT + t0 + 16,
                      T(0));
        }
        if (colsum)
          for (int c = 0; c < nc; ++c) {
            T sum = 0;
            for (int t = 0; t < nt; ++t) sum += dst[c * TT + t];
            partial[static_cast<int64_t>(tile) * width + c0 + c] = sum;
          }
      }
    if (colsum) add_tile_sums(colsum, partial, tiles, width);
  }
}

// A token-major panel back to rows, 16 x 16 at a time: out[t][f] (+)= panel[f][t] (+ bias[f])
// for t < nt and f < nf <= 16, panel rows ld_panel apart, out rows ld_out apart. stream (float,
// nf = 16, out's rows 64-byte aligned): each row goes out as one streamed cache line; the caller
// fences.
template <typename T>
void to_rows(T* out, int64_t ld_out, const T* panel, int ld_panel, int nf, int nt, bool accumulate,
             const T* bias, [[maybe_unused]] bool stream) {
  for (int t0 = 0; t0 < nt; t0 += 16) {
    const int rows = std::min(16, nt - t0);
    T tr[16][16];
    transpose_tile(panel + t0, ld_panel, &tr[0][0], 16, nf, rows);
    for (int t = 0; t < rows; ++t) {
      T* __restrict row = out + static_cast<int64_t>(t0 + t) * ld_out;
      const T* __restrict v = tr[t];
#ifdef __AVX512F__
      if constexpr (std::is_same_v<T, float>)
        if (stream) {
          __m512 line = _mm512_loadu_ps(v);
          if (bias) line = _mm512_add_ps(line, _mm512_loadu_ps(bias));
          _mm512_stream_ps(row, line);
          continue;
        }
#endif
      if (accumulate) {
#pragma omp simd
        for (int f = 0; f < nf; ++f) row[f] += v[f];
      } else if (bias) {
#pragma omp simd
        for (int f = 0; f < nf; ++f) row[f] = v[f] + bias[f];
      } else {
#pragma omp simd
        for (int f = 0; f < nf; ++f) row[f] = v[f];
      }
    }
  }
}

// The product both directions share, for each output block `ob` and K vectors of tokens:
// acc[a] = sum over the list's slots s and b < B of w(s, a, b) * srcT[src_block(s) * B + b], then
// out[t][ob * B + a] (+)= acc[a][t] (+ bias). Forward: outputs are W's rows, the list is by
// block row, w = values[s][a][b]. Input gradient: outputs are W's columns, the list by block
// column, w = values[s][b][a] (Transposed). srcT is packed (pack_tiles_transposed, width
// src_width). One thread per (tile, output block) sums in list order: the result does not
// depend on the thread count.
template <typename T, int B, int K, bool Transposed>
void token_product(T* out, int ld_out, bool accumulate, const T* bias, const T* srcT, int src_width,
                   int N, const std::vector<int32_t>& start, const std::vector<int32_t>& list,
                   const std::vector<int32_t>& src_block, const T* values) {
  constexpr int L = kLanes<T>, TW = K * L, TT = kTokenTile, G = 16;
  constexpr int OB = G / B;  // output blocks per group of 16 features
  static_assert(TT % TW == 0 && TT % 16 == 0);
  const int n_out = static_cast<int>(start.size()) - 1, groups = (n_out + OB - 1) / OB;
  // A large output written over goes out with streamed stores, a cache line (a group's 16
  // features) per token: reading each line in before overwriting it would double the traffic.
  [[maybe_unused]] const bool stream =
      std::is_same_v<T, float> && !accumulate && n_out * B % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 64 == 0 && ld_out % 16 == 0 &&
      static_cast<int64_t>(N) * ld_out * sizeof(T) >= kStreamBytes;
#pragma omp parallel for collapse(2) schedule(static)
  for (int tile = 0; tile < token_tiles(N); ++tile)
    for (int g = 0; g < groups; ++g) {
      const T* panel = srcT + static_cast<int64_t>(tile) * src_width * TT;
      const int t_first = tile * TT, nt = std::min(TT, N - t_first);
      const int ob0 = g * OB, nob = std::min(OB, n_out - ob0);
      T buf[G][TT];  // the group's outputs for the tile's tokens, feature-major
      for (int j = 0; j < nob; ++j) {
        const int ob = ob0 + j;
        for (int sub = 0; sub * TW < nt; ++sub) {
#if defined(__AVX2__) && !defined(__AVX512F__)
          if constexpr (std::is_same_v<T, float> && B == 1) {
            // 16 ymm registers: K 64-byte vectors of tokens are 2K registers (16 at K = 8, all
            // of them), which GCC spilled to the stack on every product. Here the sub-tile in
            // parts of 8 ymm accumulators (64 tokens), each going through the slot list.
            constexpr int P = 8;  // ymm accumulators a part
            for (int part = 0; part * P * 8 < TW; ++part) {
              __m256 acc[P];
              for (int k = 0; k < P; ++k) acc[k] = _mm256_setzero_ps();
              const int first = sub * TW + part * P * 8;
              for (int e = start[ob]; e < start[ob + 1]; ++e) {
                const __m256 w = _mm256_broadcast_ss(values + list[e]);
                const float* x = panel + static_cast<int64_t>(src_block[e]) * TT + first;
#pragma GCC unroll 8
                for (int k = 0; k < P; ++k)
                  acc[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + k * 8), acc[k]);
              }
              for (int k = 0; k < P; ++k) _mm256_storeu_ps(&buf[j][first + k * 8], acc[k]);
            }
            continue;
          }
#endif
          Vec<T> acc[B][K] = {};
          for (int e = start[ob]; e < start[ob + 1]; ++e) {
            const int s = list[e];
            const T* w = values + static_cast<int64_t>(s) * B * B;
            const T* x = panel + static_cast<int64_t>(src_block[e]) * B * TT + sub * TW;
#pragma GCC unroll 16
            for (int b = 0; b < B; ++b) {
              Vec<T> xv[K];
              for (int k = 0; k < K; ++k) xv[k] = load(x + b * TT + k * L);
#pragma GCC unroll 16
              for (int a = 0; a < B; ++a) {
                const T wv = Transposed ? w[b * B + a] : w[a * B + b];
                for (int k = 0; k < K; ++k) acc[a][k] += wv * xv[k];
              }
            }
          }
          for (int a = 0; a < B; ++a)
            for (int k = 0; k < K; ++k)
              std::memcpy(&buf[j * B + a][sub * TW + k * L], &acc[a][k], sizeof(Vec<T>));
        }
      }
      const int f0 = ob0 * B;
      to_rows(out + static_cast<int64_t>(t_first) * ld_out + f0, ld_out, &buf[0][0], TT, nob * B,
              nt, accumulate, bias ? bias + f0 : nullptr, stream);
    }
#ifdef __AVX512F__
  if (stream) _mm_sfence();
#endif
}

// dvalues[s][o][i] += sum over tokens of doutT[row(s) * B + o][t] * inT[col(s) * B + i][t], both
// packed, tile by tile in order, in sub-tiles of S x S dot products held in registers (summed
// across lanes once, at the end). Slots go row by row, so a thread reuses the output gradient's
// rows across a row's slots. One thread per slot: independent of the thread count.
template <typename T, int B>
void token_weight_grad(T* dvalues, const BlockPattern& p, const T* doutT, const T* inT, int N) {
  constexpr int L = kLanes<T>, TT = kTokenTile;
  constexpr int S = B < 4 ? B : 4;
  const int n = p.nnz(), tiles = token_tiles(N);
#pragma omp parallel for schedule(static)
  for (int e = 0; e < n; ++e) {
    const int s = p.by_row[e];
    T* dv = dvalues + static_cast<int64_t>(s) * B * B;
    for (int o0 = 0; o0 < B; o0 += S)
      for (int i0 = 0; i0 < B; i0 += S) {
        Vec<T> acc[S][S] = {};
        for (int tile = 0; tile < tiles; ++tile) {
          const T* dy = doutT + (static_cast<int64_t>(tile) * p.rows + p.slot_row[s] * B + o0) * TT;
          const T* x = inT + (static_cast<int64_t>(tile) * p.cols + p.slot_col[s] * B + i0) * TT;
          for (int t = 0; t < TT; t += L) {
            Vec<T> d[S], v[S];
            for (int a = 0; a < S; ++a) d[a] = load(dy + a * TT + t);
            for (int b = 0; b < S; ++b) v[b] = load(x + b * TT + t);
            for (int a = 0; a < S; ++a)
              for (int b = 0; b < S; ++b) acc[a][b] += d[a] * v[b];
          }
        }
        for (int a = 0; a < S; ++a)
          for (int b = 0; b < S; ++b) dv[(o0 + a) * B + i0 + b] += hsum<T>(acc[a][b]);
      }
  }
}

// Folds x and y, whose lanes form blocks of S lanes (each block one running sum), into blocks of
// S / 2: block 2k holds x's block k folded in half, block 2k + 1 y's.
template <typename T, int S>
[[gnu::always_inline]] inline Vec<T> fold(Vec<T> x, Vec<T> y) {
  constexpr int L = kLanes<T>, H = S / 2;
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> Index
      __attribute__((vector_size(64)));
  Index lo, hi;
  for (int l = 0; l < L; ++l) {
    const int k = l / S, r = l % S;
    lo[l] = r < H ? k * S + r : L + k * S + r - H;
    hi[l] = r < H ? k * S + r + H : L + k * S + r;
  }
  return __builtin_shuffle(x, y, lo) + __builtin_shuffle(x, y, hi);
}

// v[0 .. L) (clobbered) to one vector whose lane l is the sum of v[bit_reverse(l)]'s lanes:
// L - 1 folds instead of L horizontal sums.
template <typename T, int S = kLanes<T>>
[[gnu::always_inline]] inline Vec<T> fold_sums(Vec<T>* v, int n = kLanes<T>) {
  for (int i = 0; i < n / 2; ++i) v[i] = fold<T, S>(v[2 * i], v[2 * i + 1]);
  if constexpr (S == 2)
    return v[0];
  else
    return fold_sums<T, S / 2>(v, n / 2);
}

template <int L>
constexpr int bit_reverse(int l) {
  int r = 0;
  for (int bit = 1; bit < L; bit <<= 1, l >>= 1) r = (r << 1) | (l & 1);
  return r;
}

// fold_sums' result with lane j the sum of v[j].
template <typename T>
[[gnu::always_inline]] inline Vec<T> in_slot_order(Vec<T> folded) {
  constexpr int L = kLanes<T>;
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> Index
      __attribute__((vector_size(64)));
  Index order;
  for (int j = 0; j < L; ++j) order[j] = bit_reverse<L>(j);  // an involution
  return __builtin_shuffle(folded, order);
}

// The 1 x 1 weight gradient, tile by tile, the slots in by_chunk's order (chunks of
// BlockPattern::kRowChunk rows, column by column inside a chunk): a chunk's output gradient
// rows (64 rows of the tile's 128 tokens, 32 KB) stay in L1 while its slots go by, and each
// input feature's row of the tile (from L2, where the tile's 393 KB at C = 768 stay) is loaded
// into registers once per chunk for every slot of its column there. Row by row, every product
// read its input row from L2, which set this kernel's time (13.5 ms at BERT-base's FFN over
// 2,048 tokens, 9 ms this way). 16 slots go together, one accumulator each over the tile's
// tokens; their sums are folded into one vector and added up per slot in sums (by_chunk's
// order: each thread's chunks are one stretch of it), which goes into dvalues at the end.
// Tiles in order, a slot's tile in one thread: independent of the thread count.
template <typename T>
void token_weight_grad_1x1(T* dvalues, const BlockPattern& p, const T* doutT, const T* inT, int N,
                           T* sums) {
  constexpr int L = kLanes<T>, TT = kTokenTile;
  constexpr int kChunkRows = BlockPattern::kRowChunk;
  const int tiles = token_tiles(N), chunks = static_cast<int>(p.by_chunk_start.size()) - 1;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int e = 0; e < p.nnz(); ++e) sums[e] = 0;
    for (int tile = 0; tile < tiles; ++tile) {
      const T* x = inT + static_cast<int64_t>(tile) * p.cols * TT;
      const T* dy = doutT + static_cast<int64_t>(tile) * p.rows * TT;
#pragma omp for schedule(static)
      for (int k = 0; k < chunks; ++k) {
        const int begin = p.by_chunk_start[k], end = p.by_chunk_start[k + 1];
        const bool next = k + 1 < chunks;
        const T* next_chunk = next ? dy + static_cast<int64_t>(k + 1) * kChunkRows * TT : dy;
        const int64_t next_size = next ? int64_t{kChunkRows} * TT : 0;
        Vec<T> acc[L];
        int pending = 0;  // slots in acc
        // Adds acc's g sums into the slots that end at e.
        auto flush = [&](int e, int g) {
          for (int j = g; j < L; ++j) acc[j] = Vec<T>{};
          const Vec<T> folded = in_slot_order<T>(fold_sums<T>(acc));
          T* to = sums + e - g;
          if (g == L) {
            const Vec<T> sum = load(to) + folded;
            std::memcpy(to, &sum, sizeof sum);
          } else {
            for (int j = 0; j < g; ++j) to[j] += folded[j];
          }
        };
        for (int e = begin, column = 0; e < end; ++column) {
          const int col = p.by_chunk_col[e];
          Vec<T> xv[TT / L];
          for (int t = 0; t < TT / L; ++t) xv[t] = load(x + static_cast<int64_t>(col) * TT + t * L);
          // The next chunk's output gradient rows, from L3, a line a column.
          if (const int64_t at = int64_t{column} * 64 / sizeof(T); at < next_size)
            __builtin_prefetch(next_chunk + at);
          for (; e < end && p.by_chunk_col[e] == col; ++e) {
            const T* ds = dy + static_cast<int64_t>(p.by_chunk_row[e]) * TT;
            Vec<T> sum{};
#pragma GCC unroll 16
            for (int t = 0; t < TT / L; ++t) sum += load(ds + t * L) * xv[t];
            acc[pending++] = sum;
            if (pending == L) {
              flush(e + 1, L);
              pending = 0;
            }
          }
        }
        if (pending) flush(end, pending);
      }
    }
#pragma omp for schedule(static)
    for (int e = 0; e < p.nnz(); ++e) dvalues[p.by_chunk[e]] += sums[e];
  }
}

// values in by_chunk's order (the 1 x 1 products read them in that order, not scattered).
template <typename T>
void gather_by_chunk(T* chunk_values, const BlockPattern& p, const T* values) {
#pragma omp parallel for schedule(static)
  for (int e = 0; e < p.nnz(); ++e) chunk_values[e] = values[p.by_chunk[e]];
}

// The 1 x 1 input gradient, dinp[t][f] += sum over slots (r, f) of W[r][f] * dout[t][r], with
// doutT packed (pack_tiles_transposed) and chunk_values from gather_by_chunk. Per token tile,
// chunk by chunk (by_chunk): the chunk's 64 rows of the output gradient (32 KB) stay in L1 while
// each column's slots in it are summed in registers, then added into the column's row of
// bufT [tiles][cols][TT] (in L2). Going column by column over the whole pattern (by_col),
// every product read its output gradient row from a 1.5 MB tile that does not fit L2.
// A work item is a token tile and a range of columns; each column of a tile sums its chunks in
// order in one thread: independent of the thread count.
template <typename T>
void token_input_grad_1x1(T* dinp, const BlockPattern& p, const T* chunk_values, const T* doutT,
                          int N, T* bufT) {
  constexpr int L = kLanes<T>, TT = kTokenTile, V = TT / L;
  const int tiles = token_tiles(N), chunks = static_cast<int>(p.by_chunk_start.size()) - 1;
  // Enough column ranges (of whole 16-column groups) for two items a thread.
  const int groups = (p.cols + 15) / 16;
  const int ranges = std::clamp((2 * omp_get_max_threads() + tiles - 1) / tiles, 1, groups);
#pragma omp parallel for collapse(2) schedule(static)
  for (int tile = 0; tile < tiles; ++tile)
    for (int range = 0; range < ranges; ++range) {
      const int c0 = range * groups / ranges * 16,
                c1 = std::min(p.cols, (range + 1) * groups / ranges * 16);
      const T* dy = doutT + static_cast<int64_t>(tile) * p.rows * TT;
      T* buf = bufT + static_cast<int64_t>(tile) * p.cols * TT;
      std::fill(buf + static_cast<int64_t>(c0) * TT, buf + static_cast<int64_t>(c1) * TT, T(0));
      for (int k = 0; k < chunks; ++k) {
        const int32_t* cols = p.by_chunk_col.data();
        const int end = static_cast<int>(
            std::lower_bound(cols + p.by_chunk_start[k], cols + p.by_chunk_start[k + 1], c1) -
            cols);
        int e =
            static_cast<int>(std::lower_bound(cols + p.by_chunk_start[k], cols + end, c0) - cols);
        while (e < end) {
          const int col = cols[e];
#if defined(__AVX2__) && !defined(__AVX512F__)
          if constexpr (std::is_same_v<T, float>) {
            // The tile's TT tokens are 16 ymm registers, all of AVX2's (GCC spilled the 64-byte
            // vectors' pairs on every product): the column's slots summed in two halves of 8.
            constexpr int P = TT / 16;  // ymm accumulators a half
            const int e0 = e;
            T* to = buf + static_cast<int64_t>(col) * TT;
            for (int half = 0; half < 2; ++half) {
              __m256 acc[P];
              for (int v = 0; v < P; ++v) acc[v] = _mm256_setzero_ps();
              for (e = e0; e < end && cols[e] == col; ++e) {
                const __m256 w = _mm256_broadcast_ss(chunk_values + e);
                const T* d = dy + static_cast<int64_t>(p.by_chunk_row[e]) * TT + half * P * 8;
#pragma GCC unroll 8
                for (int v = 0; v < P; ++v)
                  acc[v] = _mm256_fmadd_ps(w, _mm256_loadu_ps(d + v * 8), acc[v]);
              }
              T* h = to + half * P * 8;
              for (int v = 0; v < P; ++v)
                _mm256_storeu_ps(h + v * 8, _mm256_add_ps(_mm256_loadu_ps(h + v * 8), acc[v]));
            }
            continue;
          }
#endif
          Vec<T> acc[V] = {};
          for (; e < end && cols[e] == col; ++e) {
            const T w = chunk_values[e];
            const T* d = dy + static_cast<int64_t>(p.by_chunk_row[e]) * TT;
#pragma GCC unroll 16
            for (int v = 0; v < V; ++v) acc[v] += w * load(d + v * L);
          }
          T* to = buf + static_cast<int64_t>(col) * TT;
#pragma GCC unroll 16
          for (int v = 0; v < V; ++v) {
            const Vec<T> sum = load(to + v * L) + acc[v];
            std::memcpy(to + v * L, &sum, sizeof sum);
          }
        }
      }
      // Token-major back to rows, added into dinp.
      const int t_first = tile * TT, nt = std::min(TT, N - t_first);
      for (int f0 = c0; f0 < c1; f0 += 16)
        to_rows(dinp + static_cast<int64_t>(t_first) * p.cols + f0, p.cols,
                buf + static_cast<int64_t>(f0) * TT, TT, std::min(16, c1 - f0), nt, true,
                static_cast<const T*>(nullptr), false);
    }
}

}  // namespace

template <typename T, typename S>
void token_forward(T* out, const S* inp, const BlockPattern& p, const T* values, const T* bias,
                   int N, T* scratch) {
  T* inT = scratch;
  pack_tiles_transposed<T>(inT, inp, N, p.cols, nullptr, nullptr);
  with_block(p.block, [&]<int B, int K>() {
    token_product<T, B, K, false>(out, p.rows, false, bias, inT, p.cols, N, p.by_row_start,
                                  p.by_row, p.by_row_col, values);
  });
}

template <typename T, typename S>
void token_backward(T* dinp, T* dvalues, T* dbias, const T* dout, const S* inp,
                    const BlockPattern& p, const T* values, int N, T* scratch) {
  // scratch: [inp packed][dout packed][the bias gradient's sums per tile][1 x 1: the weight
  // gradient's sums per slot]
  const int64_t tokens_packed = static_cast<int64_t>(token_tiles(N)) * kTokenTile;
  T* inT = scratch;
  T* doutT = inT + tokens_packed * p.cols;
  T* partial = doutT + tokens_packed * p.rows;
  pack_tiles_transposed<T>(inT, inp, N, p.cols, nullptr, nullptr);
  pack_tiles_transposed<T>(doutT, dout, N, p.rows, dbias, partial);
  with_block(p.block, [&]<int B, int K>() {
    if constexpr (B == 1) {
      // The weight gradient first: then inT holds the input gradient's tiles, and the weight
      // gradient's sums the values in by_chunk's order.
      T* sums = partial + token_tiles(N) * p.rows;
      token_weight_grad_1x1<T>(dvalues, p, doutT, inT, N, sums);
      if (dinp) {
        gather_by_chunk(sums, p, values);
        token_input_grad_1x1<T>(dinp, p, sums, doutT, N, inT);
      }
    } else {
      if (dinp)
        token_product<T, B, K, true>(dinp, p.cols, true, nullptr, doutT, p.rows, N, p.by_col_start,
                                     p.by_col, p.by_col_row, values);
      token_weight_grad<T, B>(dvalues, p, doutT, inT, N);
    }
  });
}

template void token_forward(float*, const float*, const BlockPattern&, const float*, const float*,
                            int, float*);
template void token_forward(double*, const double*, const BlockPattern&, const double*,
                            const double*, int, double*);
template void token_forward(float*, const bf16*, const BlockPattern&, const float*, const float*,
                            int, float*);
template void token_forward(float*, const f16*, const BlockPattern&, const float*, const float*,
                            int, float*);
template void token_backward(float*, float*, float*, const float*, const float*,
                             const BlockPattern&, const float*, int, float*);
template void token_backward(double*, double*, double*, const double*, const double*,
                             const BlockPattern&, const double*, int, double*);
template void token_backward(float*, float*, float*, const float*, const bf16*, const BlockPattern&,
                             const float*, int, float*);
template void token_backward(float*, float*, float*, const float*, const f16*, const BlockPattern&,
                             const float*, int, float*);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA::sparse_kernels
