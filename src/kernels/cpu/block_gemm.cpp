#include "kernels/cpu/block_gemm.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized (and,
// at -O2 without -march=native, as in the sanitizer build, -Wuninitialized) reports wherever they
// are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/transpose16.h"
#include "kernels/cpu_features.h"

// The packed layouts: A as [M][Kp] bf16 rows (Kp = K rounded up to even, a zero past K), B as
// [Kp / 2][Np] pairs (Np = N rounded up to 32): pair (kk, n) holds B[2kk][n] in its low half and
// B[2kk + 1][n] in its high half, the operand order VDPBF16PS multiplies a broadcast pair of A
// with. Every register tile is R rows of A by 32 columns of B (two vectors), R <= 8, so 16
// accumulators, 2 loads of B and R broadcasts of A per pair of k.
#define PACKBERT_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

namespace {

constexpr int kRows = 8;   // rows of A per register tile
constexpr int kCols = 32;  // columns of B per register tile

int even(int k) {
  return (k + 1) & ~1;
}
int cols_padded(int n) {
  return (n + kCols - 1) / kCols * kCols;
}

// The first n (<= 16, or all when n >= 16) of a vector's 16 lanes.
inline __mmask16 tail_mask(int n) {
  return static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << n) - 1);
}

// The bf16 bits of 16 floats (round to nearest even, VCVTNEPS2BF16), widened to 32-bit lanes;
// the first n (<= 16) are read, the rest are zero.
PACKBERT_BF16_TARGET inline __m512i bits16(const float* p, int n) {
  const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail_mask(n), p));
  __m256i raw;
  std::memcpy(&raw, &h, sizeof raw);
  return _mm512_cvtepu16_epi32(raw);
}
PACKBERT_BF16_TARGET inline __m512i bits16(const bf16* p, int n) {
  return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(tail_mask(n), p));
}

// 16 pairs of bf16 bits as 16 dwords: elements 2l and 2l + 1 of p (32 of them) in dword l, the
// first in the low half.
PACKBERT_BF16_TARGET inline __m512i pairs32(const float* p) {
  const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
  __m512i raw;
  std::memcpy(&raw, &h, sizeof raw);
  return raw;
}
PACKBERT_BF16_TARGET inline __m512i pairs32(const bf16* p) {
  return _mm512_loadu_si512(p);
}

inline uint16_t bits_of(float x) {
  return to_bf16(x).bits;
}
inline uint16_t bits_of(bf16 x) {
  return x.bits;
}

// dst[i][k] = A(i, k) for i < M, k < K, rows Kp apart, a zero at k = K when K is odd.
template <typename S>
PACKBERT_BF16_TARGET void pack_a(uint16_t* dst, int M, int K, int Kp, MatView<S> A) {
  if (!A.trans) {
    for (int i = 0; i < M; ++i) {
      const S* row = A.p + static_cast<int64_t>(i) * A.ld;
      uint16_t* d = dst + static_cast<int64_t>(i) * Kp;
      for (int k = 0; k < K; k += 16) {
        const int n = std::min(16, K - k);
        _mm256_mask_storeu_epi16(d + k, tail_mask(n), _mm512_cvtepi32_epi16(bits16(row + k, n)));
      }
      if (Kp > K) d[K] = 0;
    }
    return;
  }
  // A(., k) is stored row k. Blocks of 16 rows of dst by 32 k: 16 pairs of stored rows read
  // as 16-lane vectors, paired, and transposed in registers; the edges one element at a time.
  const int M16 = M / 16 * 16, K32 = K / 32 * 32;
  for (int i0 = 0; i0 < M16; i0 += 16)
    for (int k0 = 0; k0 < K32; k0 += 32) {
      __m512i v[16];
      for (int kk = 0; kk < 16; ++kk) {
        const S* r0 = A.p + static_cast<int64_t>(k0 + 2 * kk) * A.ld + i0;
        v[kk] = _mm512_or_si512(bits16(r0, 16), _mm512_slli_epi32(bits16(r0 + A.ld, 16), 16));
      }
      transpose16(v);
      for (int l = 0; l < 16; ++l)
        _mm512_storeu_si512(dst + static_cast<int64_t>(i0 + l) * Kp + k0, v[l]);
    }
  for (int k = 0; k < K; ++k) {
    const S* row = A.p + static_cast<int64_t>(k) * A.ld;
    for (int i = k < K32 ? M16 : 0; i < M; ++i)
      dst[static_cast<int64_t>(i) * Kp + k] = bits_of(row[i]);
  }
  if (Kp > K)
    for (int i = 0; i < M; ++i) dst[static_cast<int64_t>(i) * Kp + K] = 0;
}

// dst[kk][n] = B(2kk, n) | B(2kk + 1, n) << 16, zero past K and N; rows Np apart.
template <typename S>
PACKBERT_BF16_TARGET void pack_b(uint32_t* dst, int K, int N, int Np, MatView<S> B) {
  const int K2 = even(K) / 2;
  if (!B.trans) {
    for (int kk = 0; kk < K2; ++kk) {
      const S* r0 = B.p + static_cast<int64_t>(2 * kk) * B.ld;
      const S* r1 = 2 * kk + 1 < K ? r0 + B.ld : nullptr;
      uint32_t* d = dst + static_cast<int64_t>(kk) * Np;
      for (int n = 0; n < Np; n += 16) {
        const int cnt = std::max(0, std::min(16, N - n));
        __m512i v = cnt ? bits16(r0 + n, cnt) : _mm512_setzero_si512();
        if (r1 && cnt) v = _mm512_or_si512(v, _mm512_slli_epi32(bits16(r1 + n, cnt), 16));
        _mm512_storeu_si512(d + n, v);
      }
    }
    return;
  }
  for (int kk = 0; kk < K2; ++kk)
    std::fill(dst + static_cast<int64_t>(kk) * Np + N, dst + static_cast<int64_t>(kk + 1) * Np, 0u);
  // B(., n) is stored row n, where a pair of k is two neighbours. Blocks of 16 columns by 16
  // pairs: 32 elements of 16 stored rows read as 16 pairs each and transposed in registers; the
  // edges one element at a time.
  const int N16 = N / 16 * 16, P16 = K / 32 * 16;
  for (int n0 = 0; n0 < N16; n0 += 16)
    for (int kk0 = 0; kk0 < P16; kk0 += 16) {
      __m512i v[16];
      for (int l = 0; l < 16; ++l)
        v[l] = pairs32(B.p + static_cast<int64_t>(n0 + l) * B.ld + 2 * kk0);
      transpose16(v);
      for (int kk = 0; kk < 16; ++kk)
        _mm512_storeu_si512(dst + static_cast<int64_t>(kk0 + kk) * Np + n0, v[kk]);
    }
  for (int n = 0; n < N; ++n) {
    const S* row = B.p + static_cast<int64_t>(n) * B.ld;
    for (int kk = n < N16 ? P16 : 0; kk < K2; ++kk) {
      const uint32_t lo = bits_of(row[2 * kk]);
      const uint32_t hi = 2 * kk + 1 < K ? bits_of(row[2 * kk + 1]) : 0u;
      dst[static_cast<int64_t>(kk) * Np + n] = lo | hi << 16;
    }
  }
}

// R rows of the product (from row m0) by the 32 columns from n0, written to C.
// A's rows are lda apart (Kp when packed); Kp / 2 pairs of k.
template <int R>
PACKBERT_BF16_TARGET void tile(const uint16_t* A, int lda, int Kp, const uint32_t* B, int Np,
                               int m0, int n0, int N, float alpha, const OutView& C) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const uint16_t* a = A + static_cast<int64_t>(m0) * lda;
  const uint32_t* b = B + n0;
  for (int kk = 0; kk < Kp / 2; ++kk) {
    __m512bh b0, b1;
    const __m512i raw0 = _mm512_loadu_si512(b + static_cast<int64_t>(kk) * Np),
                  raw1 = _mm512_loadu_si512(b + static_cast<int64_t>(kk) * Np + 16);
    std::memcpy(&b0, &raw0, sizeof b0);
    std::memcpy(&b1, &raw1, sizeof b1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + static_cast<int64_t>(r) * lda + 2 * kk, sizeof pair);
      const __m512i bc = _mm512_set1_epi32(pair);
      __m512bh av;
      std::memcpy(&av, &bc, sizeof av);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
  float out[R][kCols];  // the tile, when C is written transposed
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v) {
      const int col = n0 + 16 * v, cnt = std::min(16, N - col);
      if (cnt <= 0) continue;
      const __m512 val = _mm512_mul_ps(scale, acc[r][v]);
      if (!C.trans) {
        const __mmask16 m = tail_mask(cnt);
        float* c = C.p + static_cast<int64_t>(m0 + r) * C.ld + col;
        _mm512_mask_storeu_ps(c, m,
                              C.accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, c), val) : val);
      } else {
        _mm512_storeu_ps(out[r] + 16 * v, val);
      }
    }
  if (!C.trans) return;
  // Transposed: column j of the tile is R consecutive floats of C's row n0 + j.
  const __m512i rows =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(kCols));
  const __mmask16 m = tail_mask(R);
  for (int j = 0; j < std::min(kCols, N - n0); ++j) {
    const __m512 col = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, rows, &out[0][j], 4);
    float* c = C.p + static_cast<int64_t>(n0 + j) * C.ld + m0;
    _mm512_mask_storeu_ps(c, m,
                          C.accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, c), col) : col);
  }
}

template <int... Rs>
void tile_rows(int rows, std::integer_sequence<int, Rs...>, const uint16_t* A, int lda, int Kp,
               const uint32_t* B, int Np, int m0, int n0, int N, float alpha, const OutView& C) {
  ((rows == Rs + 1 ? tile<Rs + 1>(A, lda, Kp, B, Np, m0, n0, N, alpha, C) : void()), ...);
}

}  // namespace

bool block_gemm_bf16_available() {
  return cpu_features().avx512_bf16;
}

int64_t block_gemm_pack_elems(int M, int N, int K) {
  return static_cast<int64_t>(M) * even(K) + static_cast<int64_t>(even(K)) * cols_padded(N);
}

int64_t block_gemm_packed_b_elems(int K, int N) {
  return static_cast<int64_t>(even(K)) * cols_padded(N);
}

template <typename SB>
PackedB block_gemm_pack_b(int K, int N, MatView<SB> B, bf16* room) {
  uint32_t* b = reinterpret_cast<uint32_t*>(room);
  if (K > 0 && N > 0) pack_b(b, K, N, cols_padded(N), B);
  return {b, K, N};
}

template <typename SA>
void block_gemm_bf16(int M, float alpha, MatView<SA> A, const PackedB& B, OutView C, bf16* pack) {
  const int K = B.K, N = B.N;
  if (M <= 0 || N <= 0) return;
  const int Kp = even(K), Np = cols_padded(N);
  // A bf16 A stored row by row with K even is already in the packed layout, rows ld apart: the
  // tiles read it in place.
  const uint16_t* rows = reinterpret_cast<const uint16_t*>(pack);
  int lda = Kp;
  bool in_place = false;
  if constexpr (std::is_same_v<SA, bf16>)
    if (!A.trans && K % 2 == 0)
      rows = reinterpret_cast<const uint16_t*>(A.p), lda = A.ld, in_place = true;
  if (K > 0 && !in_place) pack_a(reinterpret_cast<uint16_t*>(pack), M, K, Kp, A);
  for (int n0 = 0; n0 < N; n0 += kCols)
    for (int m0 = 0; m0 < M; m0 += kRows)
      tile_rows(std::min(kRows, M - m0), std::make_integer_sequence<int, kRows>{}, rows, lda, Kp,
                B.p, Np, m0, n0, N, alpha, C);
}

template <typename SA, typename SB>
void block_gemm_bf16(int M, int N, int K, float alpha, MatView<SA> A, MatView<SB> B, OutView C,
                     bf16* pack) {
  if (M <= 0 || N <= 0) return;
  // A's packing room first, then B's.
  const PackedB packed = block_gemm_pack_b(K, N, B, pack + block_gemm_pack_elems(M, 0, K));
  block_gemm_bf16(M, alpha, A, packed, C, pack);
}

template PackedB block_gemm_pack_b<float>(int, int, MatView<float>, bf16*);
template PackedB block_gemm_pack_b<bf16>(int, int, MatView<bf16>, bf16*);
template void block_gemm_bf16<float>(int, float, MatView<float>, const PackedB&, OutView, bf16*);
template void block_gemm_bf16<bf16>(int, float, MatView<bf16>, const PackedB&, OutView, bf16*);
template void block_gemm_bf16<float, float>(int, int, int, float, MatView<float>, MatView<float>,
                                            OutView, bf16*);
template void block_gemm_bf16<float, bf16>(int, int, int, float, MatView<float>, MatView<bf16>,
                                           OutView, bf16*);
template void block_gemm_bf16<bf16, float>(int, int, int, float, MatView<bf16>, MatView<float>,
                                           OutView, bf16*);
template void block_gemm_bf16<bf16, bf16>(int, int, int, float, MatView<bf16>, MatView<bf16>,
                                          OutView, bf16*);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
