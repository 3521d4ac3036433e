#include "kernels/sparse.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "rng.h"
#include "stopwatch.h"

namespace packbert::kernels {

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

// Token padding of the transposed activations: every tile width below divides it.
constexpr int kTokenPad = 128;

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

int padded_tokens(int N) {
  return (N + kTokenPad - 1) / kTokenPad * kTokenPad;
}

// dst[C][Np] = src[N][C] transposed, tokens N..Np zero. Tiles of 16 x 16 keep both sides'
// lines in cache.
template <typename T>
void transpose_tokens(T* __restrict dst, const T* __restrict src, int N, int C, int Np) {
  constexpr int kTile = 16;
  const int tiles_c = (C + kTile - 1) / kTile, tiles_t = Np / kTile;
#pragma omp parallel for collapse(2) schedule(static)
  for (int tc = 0; tc < tiles_c; ++tc)
    for (int tt = 0; tt < tiles_t; ++tt) {
      const int c0 = tc * kTile, c1 = std::min(C, c0 + kTile);
      const int t0 = tt * kTile, t1 = std::min(N, t0 + kTile);
      for (int c = c0; c < c1; ++c) {
        T* d = dst + static_cast<int64_t>(c) * Np;
        for (int t = t0; t < t1; ++t) d[t] = src[static_cast<int64_t>(t) * C + c];
        for (int t = std::max(t0, t1); t < t0 + kTile; ++t) d[t] = T(0);
      }
    }
}

// The product both directions share: for each output block `ob` and tile of K vectors of
// tokens, acc[a] = sum over the list's slots s and b < B of w(s, a, b) * srcT[src_block(s) * B +
// b][tile], then out[t][ob * B + a] (+)= acc[a][t] (+ bias). Forward: outputs are W's rows,
// the list is by block row, w = values[s][a][b]. Input gradient: outputs are W's columns, the
// list by block column, w = values[s][b][a] (Transposed). Each output element is one thread's
// sum in list order: the result does not depend on the thread count.
template <typename T, int B, int K, bool Transposed>
void block_product(T* out, int ld_out, bool accumulate, const T* bias, const T* srcT, int Np, int N,
                   const std::vector<int32_t>& start, const std::vector<int32_t>& list,
                   const std::vector<int32_t>& src_block, const T* values) {
  constexpr int L = kLanes<T>, TW = K * L;
  const int n_out = static_cast<int>(start.size()) - 1;
  const int n_tiles = (N + TW - 1) / TW;
#pragma omp parallel for collapse(2) schedule(static)
  for (int tile = 0; tile < n_tiles; ++tile)
    for (int ob = 0; ob < n_out; ++ob) {
      Vec<T> acc[B][K] = {};
      for (int e = start[ob]; e < start[ob + 1]; ++e) {
        const int s = list[e];
        const T* w = values + static_cast<int64_t>(s) * B * B;
        const T* src = srcT + static_cast<int64_t>(src_block[s]) * B * Np + tile * TW;
        for (int b = 0; b < B; ++b) {
          Vec<T> x[K];
          for (int k = 0; k < K; ++k) x[k] = load(src + static_cast<int64_t>(b) * Np + k * L);
          for (int a = 0; a < B; ++a) {
            const T wv = Transposed ? w[b * B + a] : w[a * B + b];
            for (int k = 0; k < K; ++k) acc[a][k] += wv * x[k];
          }
        }
      }
      const int t0 = tile * TW, t1 = std::min(N, t0 + TW);
      for (int t = t0; t < t1; ++t) {
        T* row = out + static_cast<int64_t>(t) * ld_out + ob * B;
        const int k = (t - t0) / L, lane = (t - t0) % L;
        for (int a = 0; a < B; ++a) {
          T v = acc[a][k][lane];
          if (bias) v += bias[ob * B + a];
          row[a] = accumulate ? row[a] + v : v;
        }
      }
    }
}

// dvalues[s][o][i] += sum over tokens of doutT[row(s) * B + o][t] * inT[col(s) * B + i][t], in
// sub-tiles of SO x SI dot products held in registers (U vectors of tokens in flight each, so
// the 1 x 1 case is not bound by the FMA latency). Slots go row by row, so a thread reuses the
// output gradient's rows across a row's slots.
template <typename T, int B>
void block_weight_grad(T* dvalues, const BlockPattern& p, const T* doutT, const T* inT, int Np) {
  constexpr int L = kLanes<T>;
  constexpr int S = B < 4 ? B : 4;   // sub-tile side
  constexpr int U = B == 1 ? 4 : 1;  // independent accumulators per dot product
  const int n = p.nnz();
#pragma omp parallel for schedule(static)
  for (int e = 0; e < n; ++e) {
    const int s = p.by_row[e];
    const T* dy = doutT + static_cast<int64_t>(p.slot_row[s]) * B * Np;
    const T* x = inT + static_cast<int64_t>(p.slot_col[s]) * B * Np;
    T* dv = dvalues + static_cast<int64_t>(s) * B * B;
    for (int o0 = 0; o0 < B; o0 += S)
      for (int i0 = 0; i0 < B; i0 += S) {
        Vec<T> acc[U][S][S] = {};
        for (int t = 0; t < Np; t += U * L)
          for (int u = 0; u < U; ++u) {
            Vec<T> d[S], v[S];
            for (int a = 0; a < S; ++a)
              d[a] = load(dy + static_cast<int64_t>(o0 + a) * Np + t + u * L);
            for (int b = 0; b < S; ++b)
              v[b] = load(x + static_cast<int64_t>(i0 + b) * Np + t + u * L);
            for (int a = 0; a < S; ++a)
              for (int b = 0; b < S; ++b) acc[u][a][b] += d[a] * v[b];
          }
        for (int a = 0; a < S; ++a)
          for (int b = 0; b < S; ++b) {
            Vec<T> sum = acc[0][a][b];
            for (int u = 1; u < U; ++u) sum += acc[u][a][b];
            dv[(o0 + a) * B + i0 + b] += hsum<T>(sum);
          }
      }
  }
}

// dbias[OC] += column sums of dout[N, OC], each column summed in token order by one thread.
template <typename T>
void bias_grad(T* dbias, const T* dout, int N, int OC) {
  constexpr int kCols = 64;
  const int blocks = (OC + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int cb = 0; cb < blocks; ++cb) {
    const int c0 = cb * kCols, c1 = std::min(OC, c0 + kCols);
    T sum[kCols] = {};
    for (int t = 0; t < N; ++t) {
      const T* row = dout + static_cast<int64_t>(t) * OC;
#pragma omp simd
      for (int c = c0; c < c1; ++c) sum[c - c0] += row[c];
    }
    for (int c = c0; c < c1; ++c) dbias[c] += sum[c - c0];
  }
}

// Row-major kernels, float only, one vector of B lanes per block row or column: they need no
// transposed activations, only the activations packed tile by tile: [tiles][blocks][R][B], R
// tokens per tile (zeros past N). A tile's values of one block column sit together, so R
// tokens of one block are R x B floats at fixed offsets from one pointer, and a whole tile (R
// rows of the activation) is one contiguous stretch that stays in cache while every output
// block is computed from it. A block's B outputs (forward), B inputs (input gradient) or B
// columns (weight gradient) are one vector; R tokens are the register tile.
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

constexpr int kRowTile = 24;  // tokens per tile and register tile of the row-major kernels

int row_tiles(int N) {
  return (N + kRowTile - 1) / kRowTile;
}

// packed = src [N, width] packed tile by tile (above). With colsum, also colsum[c] += sum over
// t of src[t][c] (the bias gradient, taken while dout streams by): each tile's sums go to
// partial[tile][width], then each column adds its tiles in order, so the sum does not depend on
// the thread count.
template <int B>
void pack_tiles(float* packed, const float* src, int N, int width, float* colsum, float* partial) {
  using V = typename Lanes<B>::type;
  constexpr int R = kRowTile;
  const int blocks = width / B, tiles = row_tiles(N);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int tile = 0; tile < tiles; ++tile) {
      float* dst = packed + static_cast<int64_t>(tile) * R * width;
      float* sums = colsum ? partial + static_cast<int64_t>(tile) * width : nullptr;
      if (sums) std::fill(sums, sums + width, 0.0f);
      for (int r = 0; r < R; ++r) {
        const int t = tile * R + r;
        for (int cb = 0; cb < blocks; ++cb) {
          const V v = t < N ? load_lanes<B>(src + static_cast<int64_t>(t) * width + cb * B) : V{};
          store_lanes<B>(dst + (cb * R + r) * B, v);
          if (sums) store_lanes<B>(sums + cb * B, load_lanes<B>(sums + cb * B) + v);
        }
      }
    }
    if (colsum) {
#pragma omp for schedule(static)
      for (int c = 0; c < width; ++c) {
        float sum = 0;
        for (int tile = 0; tile < tiles; ++tile)
          sum += partial[static_cast<int64_t>(tile) * width + c];
        colsum[c] += sum;
      }
    }
  }
}

// R tokens of one output block: acc[t] += sum over the list's slots and b < B of
// tile[src_block(s)][t][b] * wrows(s)[b][:]. R is a constant so the accumulators stay in
// registers and the R chains of FMAs interleave.
template <int B, int R>
inline void row_tile(typename Lanes<B>::type (&acc)[R], const float* tile, int e0, int e1,
                     const int32_t* list, const int32_t* src_block, const float* wrows) {
  using V = typename Lanes<B>::type;
  for (int e = e0; e < e1; ++e) {
    const int s = list[e];
    const float* w = wrows + static_cast<int64_t>(s) * B * B;
    const float* xb = tile + src_block[s] * R * B;
#pragma GCC unroll 16
    for (int b = 0; b < B; ++b) {
      const V wv = load_lanes<B>(w + b * B);
#pragma GCC unroll 32
      for (int t = 0; t < R; ++t) acc[t] += xb[t * B + b] * wv;
    }
  }
}

// out[t][ob * B ..] (+)= sum over the list's slots s and b < B of src[t][src_block(s) * B + b] *
// wrow(s, b) (+ bias), src packed (pack_tiles, width ld_src), wrow(s, b) a row of B weights:
// forward, rows of the transposed blocks; input gradient, rows of the blocks as stored. One
// thread per (token tile, output block) sums in list order: independent of the thread count.
template <int B>
void row_product(float* out, int ld_out, bool accumulate, const float* bias, const float* packed,
                 int ld_src, int N, const std::vector<int32_t>& start,
                 const std::vector<int32_t>& list, const std::vector<int32_t>& src_block,
                 const float* wrows) {
  using V = typename Lanes<B>::type;
  constexpr int R = kRowTile;
  const int n_out = static_cast<int>(start.size()) - 1;
#pragma omp parallel for collapse(2) schedule(static)
  for (int tile = 0; tile < row_tiles(N); ++tile)
    for (int ob = 0; ob < n_out; ++ob) {
      const int t0 = tile * R, nt = std::min(R, N - t0);
      V acc[R] = {};
      row_tile<B, R>(acc, packed + static_cast<int64_t>(tile) * R * ld_src, start[ob],
                     start[ob + 1], list.data(), src_block.data(), wrows);
      V bv = {};
      if (bias) bv = load_lanes<B>(bias + ob * B);
      for (int t = 0; t < nt; ++t) {
        float* o = out + static_cast<int64_t>(t0 + t) * ld_out + ob * B;
        store_lanes<B>(o, accumulate ? load_lanes<B>(o) + acc[t] : acc[t] + bv);
      }
    }
}

// dvalues[s][o][:] += sum over tokens of dout[t][row(s) * B + o] * inp[t][col(s) * B ..], both
// packed: one slot's B row vectors in registers over all tiles in order. Slots go row by row,
// so a thread keeps the output gradient's block row in cache across the row's slots. A slot is
// one thread's sum in token order: independent of the thread count.
template <int B>
void row_weight_grad(float* dvalues, const BlockPattern& p, const float* dout_packed,
                     const float* inp_packed, int N) {
  using V = typename Lanes<B>::type;
  constexpr int R = kRowTile;
  const int n = p.nnz(), tiles = row_tiles(N);
#pragma omp parallel for schedule(static)
  for (int e = 0; e < n; ++e) {
    const int s = p.by_row[e];
    float* dv = dvalues + static_cast<int64_t>(s) * B * B;
    V acc[B];
    for (int o = 0; o < B; ++o) acc[o] = load_lanes<B>(dv + o * B);
    for (int tile = 0; tile < tiles; ++tile) {
      const float* dy =
          dout_packed + static_cast<int64_t>(tile) * R * p.rows + p.slot_row[s] * R * B;
      const float* x = inp_packed + static_cast<int64_t>(tile) * R * p.cols + p.slot_col[s] * R * B;
      for (int t = 0; t < R; ++t) {
        const V xv = load_lanes<B>(x + t * B);
#pragma GCC unroll 16
        for (int o = 0; o < B; ++o) acc[o] += dy[t * B + o] * xv;
      }
    }
    for (int o = 0; o < B; ++o) store_lanes<B>(dv + o * B, acc[o]);
  }
}

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

bool row_major(int block) {
  static const char* path = std::getenv("PACKBERT_SPARSE_PATH");
  if (path && std::string(path) == "token") return false;
  if (path && std::string(path) == "row") return block > 1;
  return block > 1;
}

}  // namespace

bool supported_block(int block) {
  return block == 1 || block == 4 || block == 8 || block == 16;
}

void BlockPattern::index() {
  const int R = block_rows(), Cb = block_cols(), n = nnz();
  if (static_cast<int>(slot_col.size()) != n)
    throw std::invalid_argument("block pattern: slot_row and slot_col differ in length");
  by_row_start.assign(R + 1, 0);
  by_col_start.assign(Cb + 1, 0);
  for (int s = 0; s < n; ++s) {
    if (slot_row[s] < 0 || slot_row[s] >= R || slot_col[s] < 0 || slot_col[s] >= Cb)
      throw std::invalid_argument("block pattern: slot " + std::to_string(s) + " holds block (" +
                                  std::to_string(slot_row[s]) + ", " + std::to_string(slot_col[s]) +
                                  "), outside " + std::to_string(R) + " x " + std::to_string(Cb) +
                                  " blocks");
    ++by_row_start[slot_row[s] + 1];
    ++by_col_start[slot_col[s] + 1];
  }
  std::partial_sum(by_row_start.begin(), by_row_start.end(), by_row_start.begin());
  std::partial_sum(by_col_start.begin(), by_col_start.end(), by_col_start.begin());
  // Counting sorts: by column first, then a stable pass by row gives rows in ascending column;
  // the column index is filled from slots in row order, so its rows ascend too.
  std::vector<int32_t> by_c(n), fill(by_col_start.begin(), by_col_start.end() - 1);
  for (int s = 0; s < n; ++s) by_c[fill[slot_col[s]]++] = s;
  by_row.assign(n, 0);
  fill.assign(by_row_start.begin(), by_row_start.end() - 1);
  for (int s : by_c) by_row[fill[slot_row[s]]++] = s;
  by_col.assign(n, 0);
  fill.assign(by_col_start.begin(), by_col_start.end() - 1);
  for (int s : by_row) by_col[fill[slot_col[s]]++] = s;
  for (int r = 0; r < R; ++r)
    for (int e = by_row_start[r] + 1; e < by_row_start[r + 1]; ++e)
      if (slot_col[by_row[e]] == slot_col[by_row[e - 1]])
        throw std::invalid_argument("block pattern: block (" + std::to_string(r) + ", " +
                                    std::to_string(slot_col[by_row[e]]) + ") is held by two slots");
}

int blocks_kept(int rows, int cols, int block, double sparsity) {
  const int64_t all = static_cast<int64_t>(rows / block) * (cols / block);
  const int64_t kept = std::llround((1.0 - sparsity) * static_cast<double>(all));
  return static_cast<int>(std::clamp<int64_t>(kept, 1, all));
}

BlockPattern random_block_pattern(int rows, int cols, int block, int nnz, uint64_t seed) {
  if (!supported_block(block) || rows % block || cols % block)
    throw std::invalid_argument("block pattern: " + std::to_string(rows) + " x " +
                                std::to_string(cols) + " does not split into blocks of " +
                                std::to_string(block));
  BlockPattern p;
  p.rows = rows;
  p.cols = cols;
  p.block = block;
  const int Cb = p.block_cols();
  const int64_t all = static_cast<int64_t>(p.block_rows()) * Cb;
  if (nnz < 0 || nnz > all)
    throw std::invalid_argument("block pattern: " + std::to_string(nnz) + " blocks of " +
                                std::to_string(all));
  // A partial Fisher-Yates over the block numbers: the first nnz of a uniform permutation.
  std::vector<int64_t> ids(all);
  std::iota(ids.begin(), ids.end(), 0);
  SplitMix64 rng(seed);
  for (int64_t i = 0; i < nnz; ++i) std::swap(ids[i], ids[i + rng.below(all - i)]);
  p.slot_row.resize(nnz);
  p.slot_col.resize(nnz);
  for (int s = 0; s < nnz; ++s) {
    p.slot_row[s] = static_cast<int32_t>(ids[s] / Cb);
    p.slot_col[s] = static_cast<int32_t>(ids[s] % Cb);
  }
  p.index();
  return p;
}

template <typename T>
void densify(T* dense, const BlockPattern& p, const T* values) {
  const int B = p.block;
  std::fill(dense, dense + static_cast<int64_t>(p.rows) * p.cols, T(0));
  for (int s = 0; s < p.nnz(); ++s)
    for (int o = 0; o < B; ++o)
      std::copy_n(values + (static_cast<int64_t>(s) * B + o) * B, B,
                  dense + static_cast<int64_t>(p.slot_row[s] * B + o) * p.cols + p.slot_col[s] * B);
}

template <typename T>
void gather_blocks(T* values, const BlockPattern& p, const T* dense) {
  const int B = p.block;
  for (int s = 0; s < p.nnz(); ++s)
    for (int o = 0; o < B; ++o)
      std::copy_n(dense + static_cast<int64_t>(p.slot_row[s] * B + o) * p.cols + p.slot_col[s] * B,
                  B, values + (static_cast<int64_t>(s) * B + o) * B);
}

int64_t sparse_linear_scratch(const BlockPattern& p, int N) {
  const int64_t sides = p.cols + p.rows;
  const int64_t packed = sides * row_tiles(N) * kRowTile;
  return std::max({sides * padded_tokens(N), packed + p.values_size(),
                   packed + static_cast<int64_t>(row_tiles(N)) * p.rows});
}

template <typename T>
void sparse_linear_forward(T* out, const T* inp, const BlockPattern& p, const T* values,
                           const T* bias, int N, T* scratch) {
  if constexpr (std::is_same_v<T, float>)
    if (row_major(p.block)) {
      // scratch: [values: blocks transposed][inp packed]
      float* valuesT = scratch;
      float* inp_packed = scratch + p.values_size();
      transpose_blocks(valuesT, values, p.nnz(), p.block);
      with_block(p.block, [&]<int B, int K>() {
        if constexpr (B > 1) {
          pack_tiles<B>(inp_packed, inp, N, p.cols, nullptr, nullptr);
          row_product<B>(out, p.rows, false, bias, inp_packed, p.cols, N, p.by_row_start, p.by_row,
                         p.slot_col, valuesT);
        }
      });
      return;
    }
  const int Np = padded_tokens(N);
  transpose_tokens(scratch, inp, N, p.cols, Np);
  with_block(p.block, [&]<int B, int K>() {
    block_product<T, B, K, false>(out, p.rows, false, bias, scratch, Np, N, p.by_row_start,
                                  p.by_row, p.slot_col, values);
  });
}

template <typename T>
void sparse_linear_backward(T* dinp, T* dvalues, T* dbias, const T* dout, const T* inp,
                            const BlockPattern& p, const T* values, int N, T* scratch) {
  if constexpr (std::is_same_v<T, float>)
    if (row_major(p.block)) {
      // scratch: [dout packed][inp packed][the bias gradient's sums per tile]
      const int64_t rows_packed = static_cast<int64_t>(row_tiles(N)) * kRowTile;
      float* dout_packed = scratch;
      float* inp_packed = dout_packed + rows_packed * p.rows;
      float* partial = inp_packed + rows_packed * p.cols;
      with_block(p.block, [&]<int B, int K>() {
        if constexpr (B > 1) {
          pack_tiles<B>(dout_packed, dout, N, p.rows, dbias, partial);
          pack_tiles<B>(inp_packed, inp, N, p.cols, nullptr, nullptr);
          if (dinp)
            row_product<B>(dinp, p.cols, true, nullptr, dout_packed, p.rows, N, p.by_col_start,
                           p.by_col, p.slot_row, values);
          row_weight_grad<B>(dvalues, p, dout_packed, inp_packed, N);
        }
      });
      return;
    }
  const int Np = padded_tokens(N);
  T* inT = scratch;
  T* doutT = scratch + static_cast<int64_t>(p.cols) * Np;
  transpose_tokens(inT, inp, N, p.cols, Np);
  transpose_tokens(doutT, dout, N, p.rows, Np);
  with_block(p.block, [&]<int B, int K>() {
    if (dinp)
      block_product<T, B, K, true>(dinp, p.cols, true, nullptr, doutT, Np, N, p.by_col_start,
                                   p.by_col, p.slot_row, values);
    block_weight_grad<T, B>(dvalues, p, doutT, inT, Np);
  });
  if (dbias) bias_grad(dbias, dout, N, p.rows);
}

#define PACKBERT_SPARSE(T)                                                                      \
  template void densify<T>(T*, const BlockPattern&, const T*);                                  \
  template void gather_blocks<T>(T*, const BlockPattern&, const T*);                            \
  template void sparse_linear_forward<T>(T*, const T*, const BlockPattern&, const T*, const T*, \
                                         int, T*);                                              \
  template void sparse_linear_backward<T>(T*, T*, T*, const T*, const T*, const BlockPattern&,  \
                                          const T*, int, T*);
PACKBERT_SPARSE(float)
PACKBERT_SPARSE(double)
#undef PACKBERT_SPARSE

}  // namespace packbert::kernels
