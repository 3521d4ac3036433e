#include "kernels/cpu/sparse.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which -Wmaybe-uninitialized
// reports wherever they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The vector types below never cross this file's boundary: how a build without AVX passes them
// between its own inline functions does not matter.
#pragma GCC diagnostic ignored "-Wpsabi"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cpu/transpose16.h"
#include "rng.h"
#include "stopwatch.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

namespace {

// One 64-byte vector of T (16 floats, 8 doubles): AVX-512 registers where the CPU has them,
// narrower instructions where it does not (GCC lowers the type to what -march allows).
template <typename T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(64)));
};
template <typename T>
using Vec = typename VecOf<T>::type;
template <typename T>
constexpr int kLanes = 64 / sizeof(T);

// Token-major kernels (every block size, float and double): the activations are packed in
// transposed tiles, [tiles][features][TT] with TT = 128 tokens (zeros past N), so one vector
// holds one feature of 16 (8) consecutive tokens, and a tile's features sit in one stretch that
// stays in cache while every output block is computed from it.
constexpr int kTokenTile = 128;
// Outputs this large (bytes) and written over go out with streamed stores.
constexpr int64_t kStreamBytes = int64_t{8} << 20;

template <typename T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
inline T hsum(Vec<T> v) {
  T s = 0;
  for (int l = 0; l < kLanes<T>; ++l) s += v[l];
  return s;
}

// dst[j][i] = src[i][j] for i < rows, j < cols (both <= 16), rows of src lds apart and of dst
// ldd apart. A full 16 x 16 float tile is transposed in AVX-512 registers where the CPU has them.
template <typename T>
inline void transpose_tile(const T* src, int64_t lds, T* dst, int64_t ldd, int rows, int cols) {
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>)
    if (rows == 16 && cols == 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_castps_si512(_mm512_loadu_ps(src + i * lds));
      transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_ps(dst + j * ldd, _mm512_castsi512_ps(r[j]));
      return;
    }
#endif
  for (int j = 0; j < cols; ++j)
    for (int i = 0; i < rows; ++i) dst[j * ldd + i] = src[i * lds + j];
}

// The activations' element types the kernels take: T itself, or (T = float) the 16-bit
// activations of a bf16 / fp16 step, widened (exactly, convert_to) as they are packed.
// dst[i][j] = src[i][j] widened, for i < rows, j < cols (rows of src lds apart, of dst 16).
template <typename T, typename S>
inline void widen_block(T (*dst)[16], const S* src, int64_t lds, int rows, int cols) {
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) dst[i][j] = convert_to<T>(src[i * lds + j]);
}

int token_tiles(int N) {
  return (N + kTokenTile - 1) / kTokenTile;
}

// colsum[c] += the sum over tiles, in tile order, of partial[tile][c] (the bias gradient from
// per-tile column sums: the order depends on N only, not on the thread count). Called inside a
// parallel region: the team shares the columns.
template <typename T>
void add_tile_sums(T* colsum, const T* partial, int tiles, int width) {
#pragma omp for schedule(static)
  for (int c = 0; c < width; ++c) {
    T sum = 0;
    for (int tile = 0; tile < tiles; ++tile) sum += partial[static_cast<int64_t>(tile) * width + c];
    colsum[c] += sum;
  }
}

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

// Row-major kernels, float only, B = 4, 8 and 16: one 16-lane vector holds a block's B outputs
// (inputs, weight rows) for G = 16 / B tokens at once, lane j * G + q for feature j of the
// group's token q, so every block size fills a whole 512-bit register; R such vectors (24 or
// 12, below) are the register tile (R G tokens). The activations are packed tile by tile,
// [tiles][blocks][R][B][G] (zeros past N): a tile's block column is one stretch of R x 16
// floats at a fixed offset from one pointer, a group's G values of one feature are adjacent
// (one broadcast of G floats), and a group's B x G values are one vector (the weight
// gradient's load). At B = 16 (G = 1) this is the activations' rows cut into blocks.
using V16 = Vec<float>;

template <int B>
constexpr int kGroup = 16 / B;  // tokens per vector
// Vectors in the register tile: 24 at B = 16, 12 at B = 4 and 8, whose tiles of 24 vectors
// (96 and 48 tokens) made the output gradient's packed tile 1.2 and 0.6 MB at BERT-base's FFN,
// more than L2 keeps while the input gradient reads it (sparse_bench medians with 12: 3.98x and
// 5.27x the dense GEMMs' speed where 24 gave 3.65x and 5.11x; 12 at B = 16 was slower).
constexpr int row_tile_vectors(int B, bool avx512) {
  // 16 ymm registers: a smaller tile at B = 16 (sparse_bench under -march=znver3: 2.7x against
  // 2.35x with 24; 4 and 8 were as fast with 4, 6, 8 or 12).
  return B == 16 ? (avx512 ? 24 : 6) : 12;
}
constexpr int row_tile_vectors(int B) {
#ifdef __AVX512F__
  return row_tile_vectors(B, true);
#else
  return row_tile_vectors(B, false);
#endif
}
template <int B>
constexpr int kRowTile = row_tile_vectors(B);
template <int B>
constexpr int kTileTokens = kRowTile<B>* kGroup<B>;
template <int B>
constexpr int kTileBlock = kRowTile<B> * 16;  // floats of one block column of a tile

int row_tiles(int N, int B, int vectors) {
  const int tokens = vectors * (16 / B);
  return (N + tokens - 1) / tokens;
}
int row_tiles(int N, int B) {
  return row_tiles(N, B, row_tile_vectors(B));
}
template <int B>
int row_tiles(int N) {
  return row_tiles(N, B);
}

template <int B>
struct Lanes {
  typedef float type __attribute__((vector_size(4 * B)));
};
template <int B>
inline typename Lanes<B>::type load_lanes(const float* p) {
  typename Lanes<B>::type v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int B>
inline void store_lanes(float* p, typename Lanes<B>::type v) {
  std::memcpy(p, &v, sizeof v);
}

// The G floats at p repeated across the vector: lane l = p[l % G].
template <int G>
[[gnu::always_inline]] inline V16 repeat_group(const float* p) {
#ifdef __AVX512F__
  if constexpr (G == 2) {
    double d;
    std::memcpy(&d, p, sizeof d);
    return reinterpret_cast<V16>(_mm512_set1_pd(d));
  } else if constexpr (G == 4) {
    return reinterpret_cast<V16>(_mm512_broadcast_f32x4(_mm_loadu_ps(p)));
  }
#elif defined(__AVX2__)
  if constexpr (G == 2) {  // one 32-byte broadcast for both halves (B = 8: sparse_bench 2.3x
    // dense against 2.1x lane by lane; at G = 4 a 16-byte broadcast was slower than GCC's own)
    union {
      __m256 h[2];
      V16 v;
    } u;
    double d;
    std::memcpy(&d, p, sizeof d);
    u.h[0] = u.h[1] = _mm256_castpd_ps(_mm256_set1_pd(d));
    return u.v;
  }
#endif
  V16 v;
  for (int l = 0; l < 16; ++l) v[l] = p[l % G];  // G = 1: one broadcast
  return v;
}

// The B floats at p spread over the vector: lane j * G + q = p[j].
template <int B>
[[gnu::always_inline]] inline V16 spread(const float* p) {
  constexpr int G = kGroup<B>;
  if constexpr (G == 1) {
    return load<float>(p);
  } else {
#ifdef __AVX512F__
    __m512 w;
    if constexpr (B == 8)
      w = _mm512_castps256_ps512(_mm256_loadu_ps(p));
    else
      w = _mm512_castps128_ps512(_mm_loadu_ps(p));
    const __m512i idx = _mm512_set_epi32(15 / G, 14 / G, 13 / G, 12 / G, 11 / G, 10 / G, 9 / G,
                                         8 / G, 7 / G, 6 / G, 5 / G, 4 / G, 3 / G, 2 / G, 1 / G, 0);
    return reinterpret_cast<V16>(_mm512_permutexvar_ps(idx, w));
#else
    V16 v;
    for (int l = 0; l < 16; ++l) v[l] = p[l / G];
    return v;
#endif
  }
}

// Token q's B features out of a vector: lane j = v[j * G + q].
template <int B>
[[gnu::always_inline]] inline typename Lanes<B>::type token_lanes(V16 v, int q) {
  constexpr int G = kGroup<B>;
  typename Lanes<B>::type out;
  if constexpr (G == 1) {
    out = v;
  } else {
#ifdef __AVX512F__
    const __m512i idx =
        _mm512_add_epi32(_mm512_set_epi32(15 * G, 14 * G, 13 * G, 12 * G, 11 * G, 10 * G, 9 * G,
                                          8 * G, 7 * G, 6 * G, 5 * G, 4 * G, 3 * G, 2 * G, G, 0),
                         _mm512_set1_epi32(q));
    const V16 picked =
        reinterpret_cast<V16>(_mm512_permutexvar_ps(idx, reinterpret_cast<__m512>(v)));
    std::memcpy(&out, &picked, sizeof out);
#else
    for (int j = 0; j < B; ++j) out[j] = v[j * G + q];
#endif
  }
  return out;
}

// The sum over the group's tokens of feature c: v[c * G] + ... + v[c * G + G - 1].
template <int G>
inline float group_sum(const V16& v, int c) {
  float total = 0;
  for (int q = 0; q < G; ++q) total += v[c * G + q];
  return total;
}

// The group of G rows from `rows` (rows apart by width, `valid` of them inside the input, the
// rest zeros), B features each, interleaved: lane c * G + q = row q's feature c.
template <int B>
[[gnu::always_inline]] inline V16 interleave_rows(const float* rows, int64_t width, int valid) {
  constexpr int G = kGroup<B>;
  if constexpr (G == 1) {
    return valid ? load<float>(rows) : V16{};
  } else {
#ifdef __AVX512F__
    if (valid == G) {
      if constexpr (G == 2) {
        const __m512 a = _mm512_castps256_ps512(_mm256_loadu_ps(rows));
        const __m512 b = _mm512_castps256_ps512(_mm256_loadu_ps(rows + width));
        const __m512i idx =
            _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        return reinterpret_cast<V16>(_mm512_permutex2var_ps(a, idx, b));
      } else {
        __m512 r = _mm512_castps128_ps512(_mm_loadu_ps(rows));
        r = _mm512_insertf32x4(r, _mm_loadu_ps(rows + width), 1);
        r = _mm512_insertf32x4(r, _mm_loadu_ps(rows + 2 * width), 2);
        r = _mm512_insertf32x4(r, _mm_loadu_ps(rows + 3 * width), 3);
        // r's lane q * 4 + c = row q's feature c; want lane c * 4 + q.
        const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
        return reinterpret_cast<V16>(_mm512_permutexvar_ps(idx, r));
      }
    }
#endif
    V16 v = {};
    for (int q = 0; q < valid; ++q)
      for (int c = 0; c < B; ++c) v[c * G + q] = rows[q * width + c];
    return v;
  }
}

// interleave_rows from rows of S: float as they are, 16-bit activations widened first (G rows
// of B values into a G x B block).
template <int B, typename S>
[[gnu::always_inline]] inline V16 interleave_from(const S* rows, int64_t width, int valid) {
  if constexpr (std::is_same_v<S, float>) {
    return interleave_rows<B>(rows, width, valid);
  } else {
    alignas(64) float wide[kGroup<B>][16];
    widen_block<float>(wide, rows, width, valid, B);
    return interleave_rows<B>(&wide[0][0], 16, valid);
  }
}

// Tile `tile` of src [N, width] packed (above), one block column at a time. With partial, also
// partial[tile][c] = the tile's sum of src[t][c] (the bias gradient's share, taken while dout
// streams by; add_tile_sums adds the tiles in order, so the sum does not depend on the thread
// count).
template <int B, typename S = float>
void pack_tile(float* packed, const S* src, int tile, int N, int width, float* partial) {
  constexpr int G = kGroup<B>, R = kRowTile<B>, T = kTileTokens<B>;
  const int blocks = width / B, t_first = tile * T, nt = std::min(T, N - t_first);
  const S* rows = src + static_cast<int64_t>(t_first) * width;
  float* dst = packed + static_cast<int64_t>(tile) * T * width;
  for (int cb = 0; cb < blocks; ++cb) {
    const S* s = rows + cb * B;
    float* d = dst + cb * kTileBlock<B>;
    V16 sum = {};
    if (nt == T) {
#pragma GCC unroll 24
      for (int k = 0; k < R; ++k) {
        const V16 v = interleave_from<B>(s + static_cast<int64_t>(k) * G * width, width, G);
        std::memcpy(d + k * 16, &v, sizeof v);
        sum += v;
      }
    } else {
      for (int k = 0; k < R; ++k) {
        const int valid = std::clamp(nt - k * G, 0, G);
        const V16 v =
            valid ? interleave_from<B>(s + static_cast<int64_t>(k) * G * width, width, valid)
                  : V16{};
        std::memcpy(d + k * 16, &v, sizeof v);
        sum += v;
      }
    }
    if (partial)
      for (int c = 0; c < B; ++c)
        partial[static_cast<int64_t>(tile) * width + cb * B + c] = group_sum<G>(sum, c);
  }
}

template <int B, typename S>
void pack_tiles(float* packed, const S* src, int N, int width) {
#pragma omp parallel for schedule(static)
  for (int tile = 0; tile < row_tiles<B>(N); ++tile)
    pack_tile<B>(packed, src, tile, N, width, nullptr);
}

// The register tile of one output block: acc[k] lane j * G + q += sum over the list's slots and
// b < B of token (k G + q)'s feature b of block column src_block(s) * wrows(s)[b][j]. The
// blocks of the slot PF places on in the list (up to e_end, the list's end: across output
// blocks, within the tile) are prefetched: a slot's blocks sit at another place of the tile and
// of the weights each time, which the hardware prefetcher cannot guess (without it a third of
// the time went to the first loads of a slot).
template <int B>
inline void row_tile(V16 (&acc)[kRowTile<B>], const float* tile, int e0, int e1, int e_end,
                     const int32_t* list, const int32_t* src_block, const float* wrows) {
  constexpr int G = kGroup<B>, R = kRowTile<B>;
  constexpr int PF = 4;  // slots ahead (from L2): 4 beat 2 by 3-8%, 6 was no faster
  for (int e = e0; e < e1; ++e) {
    const float* w = wrows + static_cast<int64_t>(list[e]) * B * B;
    const float* xb = tile + static_cast<int64_t>(src_block[e]) * kTileBlock<B>;
    if (e + PF < e_end) {
      const float* wn = wrows + static_cast<int64_t>(list[e + PF]) * B * B;
      const float* xn = tile + static_cast<int64_t>(src_block[e + PF]) * kTileBlock<B>;
#pragma GCC unroll 16
      for (int l = 0; l < B * B; l += 16) __builtin_prefetch(wn + l);
#pragma GCC unroll 24
      for (int l = 0; l < kTileBlock<B>; l += 16) __builtin_prefetch(xn + l);
    }
#pragma GCC unroll 16
    for (int b = 0; b < B; ++b) {
      const V16 wv = spread<B>(w + b * B);
#pragma GCC unroll 24
      for (int k = 0; k < R; ++k)
        if constexpr (G == 1)
          acc[k] += xb[k * 16 + b] * wv;  // one FMA with its operand broadcast from memory
        else
          acc[k] += repeat_group<G>(xb + k * 16 + b * G) * wv;
    }
  }
}

#if defined(__AVX2__) && !defined(__AVX512F__)
// row_tile for AVX2's 16 ymm registers, in 8-lane intrinsics (the 64-byte vectors' pairs went
// through the stack, as in row_weight_grad_ymm): the same sums, stored into acc[k][lane] with a
// packed vector's lanes j * G + q. A tile's vectors go RH at a time (2 RH accumulators, the
// weight row's two spread registers and a repeated input group: 15 of 16), each part through
// the slot list in order, so a sum's order is row_tile's.
template <int B>
inline void row_tile_ymm(float (&acc)[kRowTile<B>][16], const float* tile, int e0, int e1,
                         int e_end, const int32_t* list, const int32_t* src_block,
                         const float* wrows) {
  constexpr int G = kGroup<B>, R = kRowTile<B>, RH = R < 6 ? R : 6;
  static_assert(R % RH == 0);
  constexpr int PF = 4;  // slots ahead, as row_tile
  // Lane l of the weight row's two registers: w[l / G] and w[8 / G + l / G].
  const __m256i lo_idx = _mm256_setr_epi32(0 / G, 1 / G, 2 / G, 3 / G, 4 / G, 5 / G, 6 / G, 7 / G);
  const __m256i hi_idx = _mm256_add_epi32(lo_idx, _mm256_set1_epi32(8 / G));
  for (int part = 0; part < R; part += RH) {
    __m256 lo[RH], hi[RH];
    for (int k = 0; k < RH; ++k) lo[k] = hi[k] = _mm256_setzero_ps();
    for (int e = e0; e < e1; ++e) {
      const float* w = wrows + static_cast<int64_t>(list[e]) * B * B;
      const float* xb = tile + static_cast<int64_t>(src_block[e]) * kTileBlock<B> + part * 16;
      if (part == 0 && e + PF < e_end) {
        const float* wn = wrows + static_cast<int64_t>(list[e + PF]) * B * B;
        const float* xn = tile + static_cast<int64_t>(src_block[e + PF]) * kTileBlock<B>;
        for (int l = 0; l < B * B; l += 16) __builtin_prefetch(wn + l);
        for (int l = 0; l < kTileBlock<B>; l += 16) __builtin_prefetch(xn + l);
      }
#pragma GCC unroll 16
      for (int b = 0; b < B; ++b) {
        __m256 w_lo, w_hi;
        if constexpr (G == 1) {
          w_lo = _mm256_loadu_ps(w + b * B), w_hi = _mm256_loadu_ps(w + b * B + 8);
        } else {
          __m256 row;
          if constexpr (B == 8)
            row = _mm256_loadu_ps(w + b * B);
          else
            row = _mm256_castps128_ps256(_mm_loadu_ps(w + b * B));
          w_lo = _mm256_permutevar8x32_ps(row, lo_idx);
          w_hi = _mm256_permutevar8x32_ps(row, hi_idx);
        }
#pragma GCC unroll 6
        for (int k = 0; k < RH; ++k) {
          const float* x = xb + k * 16 + b * G;
          __m256 xr;
          if constexpr (G == 1)
            xr = _mm256_broadcast_ss(x);
          else if constexpr (G == 2)
            xr = _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(x)));
          else
            xr = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x));
          lo[k] = _mm256_fmadd_ps(xr, w_lo, lo[k]);
          hi[k] = _mm256_fmadd_ps(xr, w_hi, hi[k]);
        }
      }
    }
    for (int k = 0; k < RH; ++k) {
      _mm256_storeu_ps(&acc[part + k][0], lo[k]);
      _mm256_storeu_ps(&acc[part + k][8], hi[k]);
    }
  }
}
#endif

// out[t][ob * B ..] (+)= sum over the list's slots s and b < B of src[t][src_block(s) * B + b] *
// wrow(s, b) (+ bias), src packed (pack_tile, width ld_src), wrow(s, b) a row of B weights:
// forward, rows of the transposed blocks; input gradient, rows of the blocks as stored. One
// thread per (token tile, output block) sums in list order: independent of the thread count.
template <int B>
struct RowProduct {
  float* out;
  int ld_out;
  bool accumulate;
  const float* bias;  // may be null
  const float* packed;
  int ld_src, N;
  const std::vector<int32_t>&start, &list, &src_block;
  const float* wrows;

  int outputs() const { return static_cast<int>(start.size()) - 1; }

  // The tokens of tile `tile` for output block ob, into `out` (+= with accumulate).
  void operator()(int tile, int ob) const {
    const int t_first = tile * kTileTokens<B>;
    compute(tile, ob, out + static_cast<int64_t>(t_first) * ld_out + ob * B, ld_out, accumulate);
  }

  // The same into dst (the tile's first token, rows ld apart).
  void compute(int tile, int ob, float* dst, int64_t ld, bool add) const {
    using V = typename Lanes<B>::type;
    constexpr int G = kGroup<B>, R = kRowTile<B>, T = kTileTokens<B>;
    const int nt = std::min(T, N - tile * T);
    V bv = {};
#if defined(__AVX2__) && !defined(__AVX512F__)
    alignas(32) float acc[R][16];
    row_tile_ymm<B>(acc, packed + static_cast<int64_t>(tile) * T * ld_src, start[ob],
                    start[ob + 1], start[outputs()], list.data(), src_block.data(), wrows);
    if (bias) bv = load_lanes<B>(bias + ob * B);
    for (int t = 0; t < nt; ++t) {
      const int k = t / G, q = t % G;
      V v;
      for (int j = 0; j < B; ++j) v[j] = acc[k][j * G + q];
      float* o = dst + t * ld;
      store_lanes<B>(o, add ? load_lanes<B>(o) + v : v + bv);
    }
#else
    V16 acc[R] = {};
    row_tile<B>(acc, packed + static_cast<int64_t>(tile) * T * ld_src, start[ob], start[ob + 1],
                start[outputs()], list.data(), src_block.data(), wrows);
    if (bias) bv = load_lanes<B>(bias + ob * B);
      // Constant indexes into acc (unrolled), so the accumulators stay in registers.
#pragma GCC unroll 24
    for (int k = 0; k < R; ++k)
#pragma GCC unroll 4
      for (int q = 0; q < G; ++q) {
        const int t = k * G + q;
        if (nt < T && t >= nt) break;
        float* o = dst + t * ld;
        const V v = token_lanes<B>(acc[k], q);
        store_lanes<B>(o, add ? load_lanes<B>(o) + v : v + bv);
      }
#endif
  }
};

// The forward product over every (token tile, output block). A large output written over (25
// MB at BERT-base's FFN over 2,048 tokens) goes out with streamed stores, a whole cache line
// (16 features) of each token at a time: the 16 / B output blocks of a line are computed into
// a buffer first. Reading each line in before overwriting it would double the traffic.
template <int B>
void row_product(const RowProduct<B>& product) {
  const int tiles = row_tiles<B>(product.N), outputs = product.outputs();
#ifdef __AVX512F__
  constexpr int T = kTileTokens<B>, Lb = 16 / B;  // output blocks per line
  const bool stream =
      !product.accumulate && outputs % Lb == 0 &&
      reinterpret_cast<uintptr_t>(product.out) % 64 == 0 && product.ld_out % 16 == 0 &&
      static_cast<int64_t>(product.N) * product.ld_out * sizeof(float) >= kStreamBytes;
  if (stream) {
#pragma omp parallel
    {
      alignas(64) float line[T][16];
#pragma omp for collapse(2) schedule(static) nowait
      for (int tile = 0; tile < tiles; ++tile)
        for (int og = 0; og < outputs / Lb; ++og) {
          for (int j = 0; j < Lb; ++j)
            product.compute(tile, og * Lb + j, &line[0][j * B], 16, false);
          const int t_first = tile * T, nt = std::min(T, product.N - t_first);
          for (int t = 0; t < nt; ++t)
            _mm512_stream_ps(
                product.out + static_cast<int64_t>(t_first + t) * product.ld_out + og * 16,
                _mm512_load_ps(line[t]));
        }
      _mm_sfence();  // the streamed lines are visible before the team's closing barrier
    }
    return;
  }
#endif
#pragma omp parallel for collapse(2) schedule(static)
  for (int tile = 0; tile < tiles; ++tile)
    for (int ob = 0; ob < outputs; ++ob) product(tile, ob);
}

// dvalues[s][o][i] += sum over tokens of dout[t][row(s) * B + o] * inp[t][col(s) * B + i], both
// packed. S = G slots of one block row go together: for each group of G tokens, the output
// gradient's group (lane o * G + q; one load, shared by the S slots) times each slot's input
// feature i repeated (one broadcast), S x B = 16 accumulators whose lanes are summed at the end.
// Sharing the output gradient's loads and the per-tile work across S slots is what keeps the
// small blocks' weight gradient fed. One thread per group of slots, tiles in order: independent
// of the thread count.
template <int B>
void row_weight_grad(float* dvalues, const BlockPattern& p, const float* dout_packed,
                     const float* inp_packed, int N) {
  constexpr int G = kGroup<B>, R = kRowTile<B>, T = kTileTokens<B>;
  // S x B = 16 accumulators: half of AVX-512's register file. (The AVX2 build runs
  // row_weight_grad_ymm below; a build without either, the sanitizers', only needs it right.)
  constexpr int S = G, IB = B;
  constexpr int kAhead = 4;  // tiles
  const int tiles = row_tiles<B>(N);
  const int64_t dy_tile = static_cast<int64_t>(T) * p.rows,
                x_tile = static_cast<int64_t>(T) * p.cols;
#pragma omp parallel for schedule(dynamic, 4)
  for (int r = 0; r < p.block_rows(); ++r)
    for (int e0 = p.by_row_start[r]; e0 < p.by_row_start[r + 1]; e0 += S) {
      const int g = std::min(S, p.by_row_start[r + 1] - e0);
      const float* xs[S];  // a short group repeats its last slot (results dropped)
      for (int j = 0; j < S; ++j)
        xs[j] = inp_packed +
                static_cast<int64_t>(p.by_row_col[e0 + std::min(j, g - 1)]) * kTileBlock<B>;
      const float* dy0 = dout_packed + static_cast<int64_t>(r) * kTileBlock<B>;
      for (int i0 = 0; i0 < B; i0 += IB) {  // (one pass where IB = B)
        V16 acc[S][IB] = {};
        for (int tile = 0; tile < tiles; ++tile) {
          const float* dy = dy0 + tile * dy_tile;
          // The next tile's output gradient (the row's, in L2 after its first group) and, further
          // ahead, the inputs' (other block columns each time: from L3).
          if (tile + 1 < tiles)
#pragma GCC unroll 24
            for (int l = 0; l < kTileBlock<B>; l += 16) __builtin_prefetch(dy + dy_tile + l);
          if (tile + kAhead < tiles)
            for (int j = 0; j < S; ++j)
#pragma GCC unroll 24
              for (int l = 0; l < kTileBlock<B>; l += 16)
                __builtin_prefetch(xs[j] + (tile + kAhead) * x_tile + l);
          for (int k = 0; k < R; ++k) {
            const V16 d = load<float>(dy + k * 16);
#pragma GCC unroll 4
            for (int j = 0; j < S; ++j) {
              const float* x = xs[j] + tile * x_tile + k * 16;
#pragma GCC unroll 16
              for (int i = 0; i < IB; ++i)
                if constexpr (G == 1)
                  acc[j][i] += x[i0 + i] * d;  // operand broadcast from memory
                else
                  acc[j][i] += d * repeat_group<G>(x + (i0 + i) * G);
            }
          }
        }
        for (int j = 0; j < g; ++j) {
          float* dv = dvalues + static_cast<int64_t>(p.by_row[e0 + j]) * B * B;
          for (int i = 0; i < IB; ++i)
            for (int o = 0; o < B; ++o) dv[o * B + i0 + i] += group_sum<G>(acc[j][i], o);
        }
      }
    }
}

#if defined(__AVX2__) && !defined(__AVX512F__)
// row_weight_grad for AVX2's 16 ymm registers, in 8-lane intrinsics: GCC lowers the 16-lane
// vectors above to register pairs and moved the pairs and the repeated groups through the stack
// (perf under PACKBERT_MAX_ISA=avx2: 64% of the sparse layer's time in this kernel at B = 8, at
// a fifth of the FMA rate; sparse_bench 2.3x dense, 4.0x this way). A packed vector's lanes
// j * G + q are two registers here, output features [0, 8 / G) and [8 / G, 16 / G); input
// feature i's G values of the group, repeated (one 4-, 8- or 16-byte broadcast from memory),
// multiply both. One slot and IB = 4 input features a pass: 8 accumulators. A slot sums its
// tiles in order in one thread: independent of the thread count.
template <int B>
void row_weight_grad_ymm(float* dvalues, const BlockPattern& p, const float* dout_packed,
                         const float* inp_packed, int N) {
  constexpr int G = kGroup<B>, R = kRowTile<B>, T = kTileTokens<B>, IB = 4, H = 8 / G;
  constexpr int kAhead = 4;  // tiles
  const int tiles = row_tiles<B>(N);
  const int64_t dy_tile = static_cast<int64_t>(T) * p.rows,
                x_tile = static_cast<int64_t>(T) * p.cols;
  auto repeat = [](const float* x) {
    if constexpr (G == 1)
      return _mm256_broadcast_ss(x);
    else if constexpr (G == 2)
      return _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(x)));
    else
      return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x));
  };
#pragma omp parallel for schedule(dynamic, 4)
  for (int r = 0; r < p.block_rows(); ++r)
    for (int e = p.by_row_start[r]; e < p.by_row_start[r + 1]; ++e) {
      const float* x0 = inp_packed + static_cast<int64_t>(p.by_row_col[e]) * kTileBlock<B>;
      const float* dy0 = dout_packed + static_cast<int64_t>(r) * kTileBlock<B>;
      float* dv = dvalues + static_cast<int64_t>(p.by_row[e]) * B * B;
      for (int i0 = 0; i0 < B; i0 += IB) {
        __m256 lo[IB], hi[IB];  // output features [0, H) and [H, 2H) of the group's tokens
        for (int i = 0; i < IB; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
        for (int tile = 0; tile < tiles; ++tile) {
          const float* dy = dy0 + tile * dy_tile;
          const float* x = x0 + tile * x_tile;
          if (i0 == 0 && tile + 1 < tiles)
            for (int l = 0; l < kTileBlock<B>; l += 16) __builtin_prefetch(dy + dy_tile + l);
          if (i0 == 0 && tile + kAhead < tiles)
            for (int l = 0; l < kTileBlock<B>; l += 16)
              __builtin_prefetch(x + kAhead * x_tile + l);
#pragma GCC unroll 12
          for (int k = 0; k < R; ++k) {
            const __m256 d_lo = _mm256_loadu_ps(dy + k * 16), d_hi = _mm256_loadu_ps(dy + k * 16 + 8);
#pragma GCC unroll 4
            for (int i = 0; i < IB; ++i) {
              const __m256 xi = repeat(x + k * 16 + (i0 + i) * G);
              lo[i] = _mm256_fmadd_ps(d_lo, xi, lo[i]);
              hi[i] = _mm256_fmadd_ps(d_hi, xi, hi[i]);
            }
          }
        }
        for (int i = 0; i < IB; ++i) {
          alignas(32) float l[8], h[8];
          _mm256_store_ps(l, lo[i]);
          _mm256_store_ps(h, hi[i]);
          for (int o = 0; o < H; ++o) {
            float a = 0, b = 0;
            for (int q = 0; q < G; ++q) a += l[o * G + q], b += h[o * G + q];
            dv[o * B + i0 + i] += a;
            dv[(o + H) * B + i0 + i] += b;
          }
        }
      }
    }
}
#endif

// valuesT[s] = values[s]^T, each block transposed: the forward product's weight rows.
void transpose_blocks(float* valuesT, const float* values, int nnz, int B) {
#pragma omp parallel for schedule(static)
  for (int s = 0; s < nnz; ++s) {
    const float* v = values + static_cast<int64_t>(s) * B * B;
    float* vt = valuesT + static_cast<int64_t>(s) * B * B;
    for (int i = 0; i < B; ++i)
      for (int o = 0; o < B; ++o) vt[i * B + o] = v[o * B + i];
  }
}

// Calls f with the block size as a compile-time constant and the token vectors per tile that
// keep B * K accumulators within the 32 vector registers (with room for the inputs).
template <typename F>
void with_block(int block, F f) {
  switch (block) {
    case 1:
      return f.template operator()<1, 8>();
    case 4:
      return f.template operator()<4, 4>();
    case 8:
      return f.template operator()<8, 2>();
    case 16:
      return f.template operator()<16, 1>();
  }
  throw std::invalid_argument("block size " + std::to_string(block) +
                              " is not supported (1, 4, 8 or 16)");
}

// Float blocks of 4, 8 and 16 go row-major; 1 x 1 (a group of 16 tokens per vector with one
// weight broadcast, which is the token-major kernel) and double go token-major.
bool row_major(int block) {
  return block >= 4;
}

}  // namespace

int64_t sparse_linear_scratch(int rows, int cols, int block, int64_t nnz, int N) {
  const int64_t sides = rows + cols;
  // Token-major: both sides transposed, then the bias's sums per tile (every block size in
  // double, 1 in float), then (1 x 1) the weight gradient's sums per slot.
  const int64_t token = sides * token_tiles(N) * kTokenTile +
                        static_cast<int64_t>(token_tiles(N)) * rows + (block == 1 ? nnz : 0);
  if (!row_major(block)) return token;
  // Row-major (4, 8 and 16 in float): both sides packed, then the blocks transposed or the
  // bias's sums. Sized for the tiles of the AVX-512 and the AVX2 builds both (cpu/isa.h): the
  // caller sizes its scratch once, whichever build then runs.
  int64_t room = token;
  for (const bool avx512 : {true, false}) {
    const int vectors = row_tile_vectors(block, avx512);
    const int64_t tiles = row_tiles(N, block, vectors),
                  packed = sides * tiles * vectors * (16 / block);
    room = std::max(room, packed + std::max(nnz * block * block, tiles * rows));
  }
  return room;
}

int64_t sparse_linear_scratch(const BlockPattern& p, int N) {
  return sparse_linear_scratch(p.rows, p.cols, p.block, p.nnz(), N);
}

namespace {

template <typename T, typename S>
void forward_from(T* out, const S* inp, const BlockPattern& p, const T* values, const T* bias,
                  int N, T* scratch) {
  if constexpr (std::is_same_v<T, float>)
    if (row_major(p.block)) {
      // scratch: [values: blocks transposed][inp packed]
      float* valuesT = scratch;
      float* inp_packed = scratch + p.values_size();
      transpose_blocks(valuesT, values, p.nnz(), p.block);
      with_block(p.block, [&]<int B, int K>() {
        if constexpr (B > 1) {
          pack_tiles<B>(inp_packed, inp, N, p.cols);
          row_product<B>({out, p.rows, false, bias, inp_packed, p.cols, N, p.by_row_start, p.by_row,
                          p.by_row_col, valuesT});
        }
      });
      return;
    }
  T* inT = scratch;
  pack_tiles_transposed<T>(inT, inp, N, p.cols, nullptr, nullptr);
  with_block(p.block, [&]<int B, int K>() {
    token_product<T, B, K, false>(out, p.rows, false, bias, inT, p.cols, N, p.by_row_start,
                                  p.by_row, p.by_row_col, values);
  });
}

template <typename T, typename S>
void backward_from(T* dinp, T* dvalues, T* dbias, const T* dout, const S* inp,
                   const BlockPattern& p, const T* values, int N, T* scratch) {
  if constexpr (std::is_same_v<T, float>)
    if (row_major(p.block)) {
      // scratch: [dout packed][inp packed][the bias gradient's sums per tile]
      with_block(p.block, [&]<int B, int K>() {
        if constexpr (B > 1) {
          const int tiles = row_tiles<B>(N);
          const int64_t rows_packed = static_cast<int64_t>(tiles) * kTileTokens<B>;
          float* dout_packed = scratch;
          float* inp_packed = dout_packed + rows_packed * p.rows;
          float* partial = inp_packed + rows_packed * p.cols;
          // Tile by tile: dout's tile packed (its bias sums on the way), then the input gradient
          // of its tokens while the packed tile is in L2.
          const RowProduct<B> dinp_product{dinp,        p.cols,       true,  nullptr,
                                           dout_packed, p.rows,       N,     p.by_col_start,
                                           p.by_col,    p.by_col_row, values};
#pragma omp parallel
          {
#pragma omp for schedule(static)
            for (int tile = 0; tile < tiles; ++tile) {
              pack_tile<B>(dout_packed, dout, tile, N, p.rows, dbias ? partial : nullptr);
              if (dinp)
                for (int ob = 0; ob < dinp_product.outputs(); ++ob) dinp_product(tile, ob);
            }
            if (dbias) add_tile_sums(dbias, partial, tiles, p.rows);
#pragma omp for schedule(static)
            for (int tile = 0; tile < tiles; ++tile)
              pack_tile<B>(inp_packed, inp, tile, N, p.cols, nullptr);
          }
#if defined(__AVX2__) && !defined(__AVX512F__)
          row_weight_grad_ymm<B>(dvalues, p, dout_packed, inp_packed, N);
#else
          row_weight_grad<B>(dvalues, p, dout_packed, inp_packed, N);
#endif
        }
      });
      return;
    }
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

}  // namespace

template <typename T>
void sparse_linear_forward(T* out, const T* inp, const BlockPattern& p, const T* values,
                           const T* bias, int N, T* scratch) {
  forward_from(out, inp, p, values, bias, N, scratch);
}
template <typename T>
void sparse_linear_backward(T* dinp, T* dvalues, T* dbias, const T* dout, const T* inp,
                            const BlockPattern& p, const T* values, int N, T* scratch) {
  backward_from(dinp, dvalues, dbias, dout, inp, p, values, N, scratch);
}

#define PACKBERT_SPARSE_16(H)                                                                      \
  void sparse_linear_forward(float* out, const H* inp, const BlockPattern& p, const float* values, \
                             const float* bias, int N, float* scratch) {                           \
    forward_from(out, inp, p, values, bias, N, scratch);                                           \
  }                                                                                                \
  void sparse_linear_backward(float* dinp, float* dvalues, float* dbias, const float* dout,        \
                              const H* inp, const BlockPattern& p, const float* values, int N,     \
                              float* scratch) {                                                    \
    backward_from(dinp, dvalues, dbias, dout, inp, p, values, N, scratch);                         \
  }
PACKBERT_SPARSE_16(bf16)
PACKBERT_SPARSE_16(f16)
#undef PACKBERT_SPARSE_16

#define PACKBERT_SPARSE(T)                                                                      \
  template void sparse_linear_forward<T>(T*, const T*, const BlockPattern&, const T*, const T*, \
                                         int, T*);                                              \
  template void sparse_linear_backward<T>(T*, T*, T*, const T*, const T*, const BlockPattern&,  \
                                          const T*, int, T*);
PACKBERT_SPARSE(float)
PACKBERT_SPARSE(double)
#undef PACKBERT_SPARSE

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
