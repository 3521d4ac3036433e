// Block-sparse weight patterns, the bookkeeping every backend shares: which B x B blocks of a
// weight of dense shape [rows, cols] are kept, in storage slots [nnz][B][B] (row-major inside a
// block: values[s][o][i] = W[slot_row[s] * B + o][slot_col[s] * B + i]), indexed by block row and
// by block column; random patterns, the top blocks by L1 norm, and dense <-> blocks copies. The
// kernels that multiply with them are the backends' (kernels/cpu/sparse.h).
#pragma once

#include <cstdint>
#include <vector>

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

// The pattern of the nnz blocks of dense[rows, cols] with the largest L1 norms (ties to the
// lower block index), slots in row-major block order: `--init` from a dense model.
template <typename T>
BlockPattern top_blocks_by_l1(const T* dense, int rows, int cols, int block, int nnz);

}  // namespace packbert::kernels
