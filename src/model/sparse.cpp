#include "model/sparse.h"

#include <algorithm>

#include "error.h"
#include "rng.h"

namespace packbert::model {

namespace {

// The layer's pattern a tensor belongs to and its place in the fused q | k | v one.
struct Place {
  kernels::BlockPattern LayerPatterns::*pattern;
  int part;  // 0, 1, 2: query, key, value within qkv; 0 otherwise
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Place place_of(const std::string& name) {
  if (ends_with(name, "attention.self.query.weight")) return {&LayerPatterns::qkv, 0};
  if (ends_with(name, "attention.self.key.weight")) return {&LayerPatterns::qkv, 1};
  if (ends_with(name, "attention.self.value.weight")) return {&LayerPatterns::qkv, 2};
  if (ends_with(name, "attention.output.dense.weight")) return {&LayerPatterns::attn_out, 0};
  if (ends_with(name, "intermediate.dense.weight")) return {&LayerPatterns::inter, 0};
  return {&LayerPatterns::out, 0};  // output.dense.weight
}

int layer_of(const std::string& name) {
  const std::string prefix = "bert.encoder.layer.";
  return std::stoi(name.substr(prefix.size()));
}

// An empty pattern of a layer's linear layer: its dense shape.
void shape_patterns(LayerPatterns& lp, const BertConfig& c, int block) {
  const int C = c.hidden_size, I = c.intermediate_size;
  auto shape = [&](kernels::BlockPattern& p, int rows, int cols) {
    p = kernels::BlockPattern{};
    p.rows = rows;
    p.cols = cols;
    p.block = block;
  };
  shape(lp.qkv, 3 * C, C);
  shape(lp.attn_out, C, C);
  shape(lp.inter, I, C);
  shape(lp.out, C, I);
}

}  // namespace

std::vector<SparseTensor> sparse_tensors(const ParamLayout& layout,
                                         std::vector<LayerPatterns>& patterns) {
  std::vector<SparseTensor> out;
  for (const TensorSpec& t : layout.tensors()) {
    if (!t.block) continue;
    const Place pl = place_of(t.name);
    const int rows = static_cast<int>(t.shape[0]);
    const int layer = layer_of(t.name);
    out.push_back({&t, &(patterns.at(layer).*pl.pattern), layer, pl.part * t.kept_blocks,
                   pl.part * rows / t.block});
  }
  return out;
}

std::vector<SparseTensor> sparse_tensors(const ParamLayout& layout,
                                         const std::vector<LayerPatterns>& patterns) {
  return sparse_tensors(layout, const_cast<std::vector<LayerPatterns>&>(patterns));
}

std::vector<LayerPatterns> random_patterns(const ParamLayout& layout, uint64_t seed) {
  if (!layout.sparsity().on()) return {};
  std::vector<LayerPatterns> patterns(layout.config().num_hidden_layers);
  for (LayerPatterns& lp : patterns) shape_patterns(lp, layout.config(), layout.sparsity().block);
  uint64_t k = 0;
  for (const SparseTensor& t : sparse_tensors(layout, patterns)) {
    const kernels::BlockPattern one = kernels::random_block_pattern(
        static_cast<int>(t.spec->shape[0]), static_cast<int>(t.spec->shape[1]), t.spec->block,
        t.spec->kept_blocks, mix64(seed ^ (++k * kGolden64)));
    for (int s = 0; s < one.nnz(); ++s) {
      t.pattern->slot_row.push_back(one.slot_row[s] + t.first_row);
      t.pattern->slot_col.push_back(one.slot_col[s]);
    }
  }
  index_patterns(patterns);
  return patterns;
}

void index_patterns(std::vector<LayerPatterns>& patterns) {
  for (LayerPatterns& lp : patterns)
    for (kernels::BlockPattern* p : {&lp.qkv, &lp.attn_out, &lp.inter, &lp.out}) p->index();
}

int64_t sparse_scratch_elems(const ParamLayout& layout, int64_t tokens,
                             const kernels::Backend& be) {
  if (!layout.sparsity().on()) return 0;
  const BertConfig& c = layout.config();
  const int B = layout.sparsity().block, C = c.hidden_size, I = c.intermediate_size;
  const double s = layout.sparsity().sparsity;
  const int N = static_cast<int>(tokens);
  auto need = [&](int rows, int cols, int64_t nnz) {
    return be.sparse_linear_scratch_elems(rows, cols, B, nnz, N);
  };
  return std::max({need(3 * C, C, 3 * int64_t{kernels::blocks_kept(C, C, B, s)}),
                   need(C, C, kernels::blocks_kept(C, C, B, s)),
                   need(I, C, kernels::blocks_kept(I, C, B, s)),
                   need(C, I, kernels::blocks_kept(C, I, B, s))});
}

std::vector<float> dense_weight(const SparseTensor& t, const float* values) {
  const int B = t.spec->block, cols = static_cast<int>(t.spec->shape[1]);
  std::vector<float> dense(t.spec->shape[0] * t.spec->shape[1], 0.0f);
  for (int j = 0; j < t.spec->kept_blocks; ++j) {
    const int s = t.first_slot + j;
    const int r = t.pattern->slot_row[s] - t.first_row, c = t.pattern->slot_col[s];
    for (int o = 0; o < B; ++o)
      std::copy_n(values + (static_cast<int64_t>(j) * B + o) * B, B,
                  dense.data() + static_cast<int64_t>(r * B + o) * cols + c * B);
  }
  return dense;
}

void prune_to_l1(const SparseTensor& t, const float* dense, float* values) {
  const int rows = static_cast<int>(t.spec->shape[0]), cols = static_cast<int>(t.spec->shape[1]);
  const kernels::BlockPattern top =
      kernels::top_blocks_by_l1(dense, rows, cols, t.spec->block, t.spec->kept_blocks);
  kernels::gather_blocks(values, top, dense);
  for (int j = 0; j < top.nnz(); ++j) {
    t.pattern->slot_row[t.first_slot + j] = top.slot_row[j] + t.first_row;
    t.pattern->slot_col[t.first_slot + j] = top.slot_col[j];
  }
}

void tensor_slots(const SparseTensor& t, std::vector<int32_t>& rows, std::vector<int32_t>& cols) {
  rows.assign(t.pattern->slot_row.begin() + t.first_slot,
              t.pattern->slot_row.begin() + t.first_slot + t.spec->kept_blocks);
  cols.assign(t.pattern->slot_col.begin() + t.first_slot,
              t.pattern->slot_col.begin() + t.first_slot + t.spec->kept_blocks);
  for (int32_t& r : rows) r -= t.first_row;
}

void set_tensor_slots(const SparseTensor& t, const std::vector<int32_t>& rows,
                      const std::vector<int32_t>& cols, const std::string& source) {
  const int R = static_cast<int>(t.spec->shape[0]) / t.spec->block;
  const int Cb = static_cast<int>(t.spec->shape[1]) / t.spec->block;
  if (rows.size() != static_cast<size_t>(t.spec->kept_blocks) || cols.size() != rows.size())
    throw InputError(source + ": the pattern of " + t.spec->name + " has " +
                     std::to_string(rows.size()) + " blocks, expected " +
                     std::to_string(t.spec->kept_blocks));
  for (size_t j = 0; j < rows.size(); ++j) {
    if (rows[j] < 0 || rows[j] >= R || cols[j] < 0 || cols[j] >= Cb)
      throw InputError(source + ": the pattern of " + t.spec->name + " holds block (" +
                       std::to_string(rows[j]) + ", " + std::to_string(cols[j]) + "), outside " +
                       std::to_string(R) + " x " + std::to_string(Cb));
    t.pattern->slot_row[t.first_slot + j] = rows[j] + t.first_row;
    t.pattern->slot_col[t.first_slot + j] = cols[j];
  }
}

}  // namespace packbert::model
