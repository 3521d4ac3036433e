// One thread's bf16 matrix product for attention's per-(sequence, head) blocks: the products run
// inside a parallel region over blocks, where oneDNN's bf16 matmul primitive cannot (it takes the
// whole team), so without this they would stay fp32 sgemm. Operands are fp32 or bf16 strided
// views, rounded to bf16 as they are packed (the fp32 ones round to nearest even, as every bf16
// operand of the engine does); products use AVX512-BF16's VDPBF16PS with fp32 accumulation.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/tensor.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

// A row-major matrix view, read as its transpose when `trans`: element (i, j) of the operand is
// p[i * ld + j], or p[j * ld + i] when trans.
template <typename S>
struct MatView {
  const S* p;
  int ld;
  bool trans = false;
};

// Where the product goes: C[i][j] (+)= alpha * (A B)[i][j], or, when `trans`, C[j][i] (+)= the
// same: the product of the transposed operands written back transposed, which lets a product
// whose left operand is a transposed L x L block (such as attention's dV = Pᵀ dO, as (dOᵀ P)ᵀ)
// pack that block row by row instead. Each tile writes short pieces of many rows of C this way;
// attention itself computes dVᵀ into scratch and transposes it back in registers
// (attention.cpp's store_transposed), which is faster for its tall outputs.
struct OutView {
  float* p;
  int ld;
  bool trans = false;
  bool accumulate = false;
};

// Whether this CPU runs the bf16 block product (AVX512-BF16); without it the callers keep their
// fp32 products.
bool block_gemm_bf16_available();

// bf16 elements of packing room block_gemm_bf16 needs for an M x N x K product.
int64_t block_gemm_pack_elems(int M, int N, int K);

// C = alpha * A[M, K] . B[K, N] (see OutView), one thread, in a fixed order (bit-identical on any
// thread count). pack: block_gemm_pack_elems(M, N, K) bf16 of the caller's scratch.
// Requires block_gemm_bf16_available().
template <typename SA, typename SB>
void block_gemm_bf16(int M, int N, int K, float alpha, MatView<SA> A, MatView<SB> B, OutView C,
                     bf16* pack);

// A right operand packed once for several products that share it: attention multiplies each row
// strip of a block by the same keys and values.
struct PackedB {
  const uint32_t* p = nullptr;
  int K = 0, N = 0;
};
// bf16 elements of room block_gemm_pack_b needs for a K x N operand.
int64_t block_gemm_packed_b_elems(int K, int N);
template <typename SB>
PackedB block_gemm_pack_b(int K, int N, MatView<SB> B, bf16* room);
// C = alpha * A[M, B.K] . B, bit for bit what the unpacked form gives for the same rows (each
// element's sum runs over k in the same order). pack: block_gemm_pack_elems(M, 0, B.K) bf16 for
// A when it is not a bf16 row-major view with B.K even (read in place); may be null then.
template <typename SA>
void block_gemm_bf16(int M, float alpha, MatView<SA> A, const PackedB& B, OutView C, bf16* pack);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
