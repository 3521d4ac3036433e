// The row-major block-sparse kernels (float blocks of 4, 8 and 16; cpu/sparse.h): one 16-lane
// vector holds a block's B features for 16 / B tokens (cpu/sparse_lanes.h).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/sparse_lanes.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA::sparse_kernels {

namespace {

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
    row_tile_ymm<B>(acc, packed + static_cast<int64_t>(tile) * T * ld_src, start[ob], start[ob + 1],
                    start[outputs()], list.data(), src_block.data(), wrows);
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
            for (int l = 0; l < kTileBlock<B>; l += 16) __builtin_prefetch(x + kAhead * x_tile + l);
#pragma GCC unroll 12
          for (int k = 0; k < R; ++k) {
            const __m256 d_lo = _mm256_loadu_ps(dy + k * 16),
                         d_hi = _mm256_loadu_ps(dy + k * 16 + 8);
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

}  // namespace

template <typename S>
void row_forward(float* out, const S* inp, const BlockPattern& p, const float* values,
                 const float* bias, int N, float* scratch) {
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
}

template <typename S>
void row_backward(float* dinp, float* dvalues, float* dbias, const float* dout, const S* inp,
                  const BlockPattern& p, const float* values, int N, float* scratch) {
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
}

template void row_forward(float*, const float*, const BlockPattern&, const float*, const float*,
                          int, float*);
template void row_forward(float*, const bf16*, const BlockPattern&, const float*, const float*, int,
                          float*);
template void row_forward(float*, const f16*, const BlockPattern&, const float*, const float*, int,
                          float*);
template void row_backward(float*, float*, float*, const float*, const float*, const BlockPattern&,
                           const float*, int, float*);
template void row_backward(float*, float*, float*, const float*, const bf16*, const BlockPattern&,
                           const float*, int, float*);
template void row_backward(float*, float*, float*, const float*, const f16*, const BlockPattern&,
                           const float*, int, float*);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA::sparse_kernels
