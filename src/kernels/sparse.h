// Block-sparse linear layers. A weight of dense shape [rows, cols] (PyTorch's [OC, C]) keeps a
// fixed number of non-zero B x B blocks, B in {1, 4, 8, 16} (B divides both sides). The values
// live in storage slots, [nnz][B][B], row-major inside a block:
//   values[s][o][i] = W[slot_row[s] * B + o][slot_col[s] * B + i].
// A pattern update moves a slot to another block; the storage never moves or grows, so the
// optimizer's moments stay attached to their slot. Two indexes over the slots (BSR by block
// row for the forward product, by block column for the input gradient) are rebuilt after each
// update by a counting sort, O(nnz + rows / B + cols / B).
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

#include "kernels/tensor.h"

namespace packbert::kernels {

struct BlockPattern {
  int rows = 0, cols = 0, block = 1;        // dense shape [rows, cols], block size B
  std::vector<int32_t> slot_row, slot_col;  // [nnz]: the block each storage slot holds
  // Slots by block row: by_row[by_row_start[r] .. by_row_start[r + 1]) in ascending column;
  // by_row_col[e] = slot_col[by_row[e]] (so a kernel's next block needs no dependent load).
  std::vector<int32_t> by_row_start, by_row, by_row_col;
  // Slots by block column: by_col[by_col_start[c] .. by_col_start[c + 1]) in ascending row;
  // by_col_row[e] = slot_row[by_col[e]].
  std::vector<int32_t> by_col_start, by_col, by_col_row;
  // 1 x 1 only (empty otherwise), the weight gradient's order: slots by chunk of kRowChunk
  // block rows, by column inside a chunk, by row inside a column: chunk k's slots are
  // by_chunk[by_chunk_start[k] .. by_chunk_start[k + 1]); by_chunk_row/col[e] their block.
  static constexpr int kRowChunk = 64;
  std::vector<int32_t> by_chunk_start, by_chunk, by_chunk_row, by_chunk_col;

  int nnz() const { return static_cast<int>(slot_row.size()); }
  int block_rows() const { return rows / block; }
  int block_cols() const { return cols / block; }
  int64_t values_size() const { return static_cast<int64_t>(nnz()) * block * block; }
  // Rebuilds by_row*, by_col* and by_chunk* from slot_row/slot_col. Throws std::invalid_argument
  // when a slot is out of range or two slots hold the same block.
  void index();
};

// The block sizes the kernels run.
bool supported_block(int block);

// A uniformly random pattern: nnz distinct blocks of the [rows, cols] weight drawn with
// SplitMix64(seed), indexed. rows and cols must be multiples of block; 0 <= nnz <= all blocks.
BlockPattern random_block_pattern(int rows, int cols, int block, int nnz, uint64_t seed);
// The number of blocks a weight keeps at sparsity s (the fraction of blocks that are zero):
// round((1 - s) * blocks), at least 1.
int blocks_kept(int rows, int cols, int block, double sparsity);

// dense[rows, cols] = the pattern's values, zeros elsewhere (overwrites every element).
template <typename T>
void densify(T* dense, const BlockPattern& p, const T* values);
// values = the pattern's blocks read out of dense[rows, cols].
template <typename T>
void gather_blocks(T* values, const BlockPattern& p, const T* dense);

// Elements of scratch the kernels need for N tokens (about (rows + cols) * N: both sides packed).
int64_t sparse_linear_scratch(const BlockPattern& p, int N);
int64_t sparse_linear_scratch(int rows, int cols, int block, int64_t nnz, int N);

// The pattern of the nnz blocks of dense[rows, cols] with the largest L1 norms (ties to the
// lower block index), slots in row-major block order: `--init` from a dense model.
template <typename T>
BlockPattern top_blocks_by_l1(const T* dense, int rows, int cols, int block, int nnz);

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

}  // namespace packbert::kernels
