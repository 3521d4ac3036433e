#include "kernels/block_pattern.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "rng.h"

namespace packbert::kernels {

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
  by_row_col.resize(n);
  by_col_row.resize(n);
  for (int e = 0; e < n; ++e) {
    by_row_col[e] = slot_col[by_row[e]];
    by_col_row[e] = slot_row[by_col[e]];
  }
  // 1 x 1: a stable counting sort of by_col (ascending row inside a column) by row chunk.
  if (block == 1) {
    const int chunks = (R + kRowChunk - 1) / kRowChunk;
    by_chunk_start.assign(chunks + 1, 0);
    for (int s = 0; s < n; ++s) ++by_chunk_start[slot_row[s] / kRowChunk + 1];
    std::partial_sum(by_chunk_start.begin(), by_chunk_start.end(), by_chunk_start.begin());
    by_chunk.assign(n, 0);
    fill.assign(by_chunk_start.begin(), by_chunk_start.end() - 1);
    for (int s : by_col) by_chunk[fill[slot_row[s] / kRowChunk]++] = s;
    by_chunk_row.resize(n);
    by_chunk_col.resize(n);
    for (int e = 0; e < n; ++e) {
      by_chunk_row[e] = slot_row[by_chunk[e]];
      by_chunk_col[e] = slot_col[by_chunk[e]];
    }
  } else {
    by_chunk_start.clear();
    by_chunk.clear();
    by_chunk_row.clear();
    by_chunk_col.clear();
  }
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

template <typename T>
BlockPattern top_blocks_by_l1(const T* dense, int rows, int cols, int block, int nnz) {
  BlockPattern p;
  p.rows = rows;
  p.cols = cols;
  p.block = block;
  const int Cb = cols / block;
  const int64_t all = static_cast<int64_t>(rows / block) * Cb;
  std::vector<double> l1(all, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      l1[static_cast<int64_t>(r / block) * Cb + c / block] +=
          std::abs(static_cast<double>(dense[static_cast<int64_t>(r) * cols + c]));
  std::vector<int64_t> ids(all);
  std::iota(ids.begin(), ids.end(), 0);
  // Largest first; ties to the lower block number, so the choice is reproducible.
  std::partial_sort(ids.begin(), ids.begin() + nnz, ids.end(), [&](int64_t a, int64_t b) {
    return l1[a] > l1[b] || (l1[a] == l1[b] && a < b);
  });
  ids.resize(nnz);
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) {
    p.slot_row.push_back(static_cast<int32_t>(id / Cb));
    p.slot_col.push_back(static_cast<int32_t>(id % Cb));
  }
  p.index();
  return p;
}

#define PACKBERT_PATTERN(T)                                                \
  template BlockPattern top_blocks_by_l1<T>(const T*, int, int, int, int); \
  template void densify<T>(T*, const BlockPattern&, const T*);             \
  template void gather_blocks<T>(T*, const BlockPattern&, const T*);
PACKBERT_PATTERN(float)
PACKBERT_PATTERN(double)
#undef PACKBERT_PATTERN

}  // namespace packbert::kernels
