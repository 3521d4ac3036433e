// What the two families of block-sparse kernels (cpu/sparse.h) share, private to
// cpu/sparse*.cpp: the vector lanes (every `#if` on the instruction set that picks how a lane
// operation is done), the tile constants the callers size scratch with, and each family's entry
// points (sparse_token.cpp: token-major, every block size, float and double; sparse_rows.cpp:
// row-major, float blocks of 4, 8 and 16), which sparse.cpp dispatches between.
#pragma once

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which -Wmaybe-uninitialized
// reports wherever they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The vector types below never cross the boundary of a file that includes this: how a build
// without AVX passes them between its own inline functions does not matter.
#pragma GCC diagnostic ignored "-Wpsabi"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/block_pattern.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/transpose16.h"
#include "kernels/tensor.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA::sparse_kernels {

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

inline int token_tiles(int N) {
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

inline int row_tiles(int N, int B, int vectors) {
  const int tokens = vectors * (16 / B);
  return (N + tokens - 1) / tokens;
}
inline int row_tiles(int N, int B) {
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
inline bool row_major(int block) {
  return block >= 4;
}

// The families' entry points: forward (out = inp . W^T + bias) and backward (dinp += dout . W,
// dvalues and dbias +=) as cpu/sparse.h states them, each over its scratch layout.
template <typename T, typename S>
void token_forward(T* out, const S* inp, const BlockPattern& p, const T* values, const T* bias,
                   int N, T* scratch);
template <typename T, typename S>
void token_backward(T* dinp, T* dvalues, T* dbias, const T* dout, const S* inp,
                    const BlockPattern& p, const T* values, int N, T* scratch);
template <typename S>
void row_forward(float* out, const S* inp, const BlockPattern& p, const float* values,
                 const float* bias, int N, float* scratch);
template <typename S>
void row_backward(float* dinp, float* dvalues, float* dbias, const float* dout, const S* inp,
                  const BlockPattern& p, const float* values, int N, float* scratch);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA::sparse_kernels
