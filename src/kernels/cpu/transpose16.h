// A 16 x 16 transpose of 32-bit lanes in AVX-512 registers, shared by the kernels that
// transpose tiles (block_gemm.cpp's packing, sparse.cpp's activation tiles, attention.cpp's
// write-back of dVᵀ and dKᵀ). Callers run it only where the CPU has AVX-512F (their own target
// attribute or -march).
#pragma once

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized (and,
// at -O2 without -march=native, -Wuninitialized) reports wherever they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "kernels/cpu/isa.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

// Transposes 16 x 16 dwords in registers: afterwards r[j] lane i holds what r[i] lane j held.
__attribute__((target("avx512f"))) inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // Per group g of 4 rows, u[4g + k] holds column 4l + k of the group's rows in lane l.
  __m512i u[16];
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i w0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd);
    const __m512i w2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
    const __m512i w3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xdd);
    r[k] = _mm512_shuffle_i32x4(w0, w2, 0x88);
    r[k + 8] = _mm512_shuffle_i32x4(w0, w2, 0xdd);
    r[k + 4] = _mm512_shuffle_i32x4(w1, w3, 0x88);
    r[k + 12] = _mm512_shuffle_i32x4(w1, w3, 0xdd);
  }
}

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA

#pragma GCC diagnostic pop
