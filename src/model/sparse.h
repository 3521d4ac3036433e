// The patterns of a block-sparse model (model/params.h, Sparsity): one kernels::BlockPattern per
// linear layer of each encoder layer, the query, key and value weights fused into one [3C, C]
// pattern as their values are fused in the arena. Each Hugging Face tensor keeps its own fixed
// count of blocks (a SparseTensor: its slots and block rows within the layer's pattern), which
// is what prune and regrow keep exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/block_pattern.h"
#include "kernels/ops.h"
#include "model/params.h"

namespace packbert::model {

struct LayerPatterns {
  kernels::BlockPattern qkv, attn_out, inter, out;
};

// Per linear layer of a layer: the L1 norm of every block of its dense weight gradient, [rows /
// block, cols / block] row-major, summed over the backward passes that collected them (what
// gradient regrow ranks the inactive blocks by).
struct LayerBlockGrads {
  std::vector<float> qkv, attn_out, inter, out;
};

// One block-sparse weight of the layout: its spec, the layer pattern holding it, and its slots
// [first_slot, first_slot + spec->kept_blocks) there, whose rows lie in [first_row, first_row +
// rows / block).
struct SparseTensor {
  const TensorSpec* spec;
  kernels::BlockPattern* pattern;
  int layer = 0, first_slot = 0, first_row = 0;
};

// Every sparse weight of the layout in arena order, pointing into `patterns` (one per layer).
std::vector<SparseTensor> sparse_tensors(const ParamLayout& layout,
                                         std::vector<LayerPatterns>& patterns);
// The same for reading only (the patterns are not changed through the result).
std::vector<SparseTensor> sparse_tensors(const ParamLayout& layout,
                                         const std::vector<LayerPatterns>& patterns);

// Uniformly random patterns for every layer (each tensor its own draw from `seed`), indexed.
// Empty when the layout is dense.
std::vector<LayerPatterns> random_patterns(const ParamLayout& layout, uint64_t seed);

// Rebuilds the indexes of every pattern after slots moved.
void index_patterns(std::vector<LayerPatterns>& patterns);

// Elements of scratch backend `be`'s block-sparse linear layers of one step over `tokens` tokens
// need (the largest of the layer's four; 0 when dense).
int64_t sparse_scratch_elems(const ParamLayout& layout, int64_t tokens, const kernels::Backend& be);

// The tensor's dense [rows, cols] weight from its values (zeros outside the pattern).
std::vector<float> dense_weight(const SparseTensor& t, const float* values);
// Sets the tensor's slots to the blocks of `dense` with the largest L1 norms and its values
// to them (`--init` from a dense model). Re-index the patterns afterwards.
void prune_to_l1(const SparseTensor& t, const float* dense, float* values);

// The tensor's slot coordinates relative to itself (rows from 0): what a checkpoint stores.
void tensor_slots(const SparseTensor& t, std::vector<int32_t>& rows, std::vector<int32_t>& cols);
// Sets them back; throws InputError naming `source` when they do not fit the tensor. Re-index
// the patterns afterwards (index_patterns checks that no block is held twice).
void set_tensor_slots(const SparseTensor& t, const std::vector<int32_t>& rows,
                      const std::vector<int32_t>& cols, const std::string& source);

}  // namespace packbert::model
