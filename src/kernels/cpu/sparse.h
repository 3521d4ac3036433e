// Block-sparse linear layers on the CPU (patterns: kernels/block_pattern.h). A weight of dense
// shape [rows, cols] keeps a fixed number of non-zero B x B blocks, B in {1, 4, 8, 16}; a
// pattern update moves a slot to another block, so the storage never moves or grows and the
// optimizer's moments stay attached to their slot.
//
// Two layouts, both over activations packed into the caller's scratch (no allocation):
// - row-major (float, B = 4, 8 and 16): one 512-bit vector holds a block's B outputs (inputs,
//   weight rows) for G = 16 / B tokens, 24 vectors the register tile; the activations are
//   packed tile by tile with each group's G tokens interleaved, so a tile's block columns sit
//   at fixed offsets from one pointer and a group's values of one feature are one broadcast.
// - token-major (B = 1, and every size in double): one vector holds one feature of 16 tokens
//   (8 in double), the activations transposed in tiles of 128 tokens; a block's weights are
//   broadcast. At 1 x 1 the weight and input gradients go through the slots a chunk of 64 rows
//   at a time (by_chunk), so the chunk's rows of the output gradient stay in L1.
// Either way every output element is one thread's sum in a fixed order: the results do not
// depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/block_pattern.h"
#include "kernels/cpu/isa.h"
#include "kernels/tensor.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

// Elements of scratch the kernels need for N tokens (about (rows + cols) * N: both sides packed),
// in every build of them (cpu/isa.h): a caller sizes once, whichever build then runs.
int64_t sparse_linear_scratch(const BlockPattern& p, int N);
int64_t sparse_linear_scratch(int rows, int cols, int block, int64_t nnz, int N);

// out[N, rows] = inp[N, cols] . W^T + bias (bias [rows], may be null); W as p and values hold it.
template <typename T>
void sparse_linear_forward(T* out, const T* inp, const BlockPattern& p, const T* values,
                           const T* bias, int N, T* scratch);
// Accumulates (+=): dinp[N, cols] += dout . W, dvalues [nnz, B, B] += the pattern's blocks of
// dout^T . inp (no other weight gradient is formed), dbias[rows] += column sums of dout. dinp
// and dbias may be null.
template <typename T>
void sparse_linear_backward(T* dinp, T* dvalues, T* dbias, const T* dout, const T* inp,
                            const BlockPattern& p, const T* values, int N, T* scratch);
// The same over the 16-bit activations of a bf16 or fp16 step (fp32 values, bias, outputs and
// gradients): the input is widened, exactly, as the kernels pack it, so the results are the fp32
// kernels' on the widened input, bit for bit, with no widened copy of it in memory.
void sparse_linear_forward(float* out, const bf16* inp, const BlockPattern& p, const float* values,
                           const float* bias, int N, float* scratch);
void sparse_linear_forward(float* out, const f16* inp, const BlockPattern& p, const float* values,
                           const float* bias, int N, float* scratch);
void sparse_linear_backward(float* dinp, float* dvalues, float* dbias, const float* dout,
                            const bf16* inp, const BlockPattern& p, const float* values, int N,
                            float* scratch);
void sparse_linear_backward(float* dinp, float* dvalues, float* dbias, const float* dout,
                            const f16* inp, const BlockPattern& p, const float* values, int N,
                            float* scratch);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
