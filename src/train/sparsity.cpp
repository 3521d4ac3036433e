#include "train/sparsity.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "error.h"
#include "rng.h"

namespace packbert::train {

const char* regrow_name(Regrow r) {
  return r == Regrow::gradient ? "gradient" : "random";
}

Regrow parse_regrow(const std::string& name, const std::string& flag) {
  if (name == "random") return Regrow::random;
  if (name == "gradient") return Regrow::gradient;
  throw InputError(flag + " " + name + ": expected random or gradient");
}

int SparseOptions::updates_or_default() const {
  if (updates > 0) return updates;
  return sparsity.block == 1 ? 160 : 80;
}

double sparse_lr_scale(double s) {
  return std::exp(1.969 * s * s + 0.2905 * s);
}

double SparseOptions::lr_factor() const {
  return lr_scale > 0 ? lr_scale : sparse_lr_scale(sparsity.sparsity);
}

namespace {

int64_t update_interval(const SparseOptions& o, int64_t total) {
  return std::max<int64_t>(1, std::llround(static_cast<double>(total) / o.updates_or_default()));
}

// The block gradient norms of the layer pattern a tensor lives in.
const std::vector<float>& block_grads_of(const model::BertModel& m, const model::SparseTensor& t) {
  const model::LayerBlockGrads& g = m.block_grads().at(t.layer);
  const model::LayerPatterns& lp = m.patterns().at(t.layer);
  if (t.pattern == &lp.qkv) return g.qkv;
  if (t.pattern == &lp.attn_out) return g.attn_out;
  if (t.pattern == &lp.inter) return g.inter;
  return g.out;
}

}  // namespace

bool is_update_step(const SparseOptions& o, int64_t step, int64_t total) {
  return o.sparsity.on() && step < total && step % update_interval(o, total) == 0;
}

double prune_fraction(const SparseOptions& o, int64_t step, int64_t total) {
  const double x = static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, total));
  return o.prune_ratio * 0.5 * (1.0 + std::cos(M_PI * x));
}

int64_t update_count(const SparseOptions& o, int64_t total) {
  if (!o.sparsity.on() || o.prune_ratio <= 0 || total < 2) return 0;
  return (total - 1) / update_interval(o, total);
}

std::string schedule_summary(const SparseOptions& o, int64_t total) {
  std::ostringstream s;
  s << o.sparsity.block << " x " << o.sparsity.block << " blocks at s = " << o.sparsity.sparsity;
  const int64_t updates = update_count(o, total);
  if (updates == 0) {
    s << "; pattern fixed" << (o.prune_ratio <= 0 ? " (`prune_ratio` 0)" : " (a run this short)");
  } else {
    const int64_t every = update_interval(o, total);
    s << "; pattern updated every " << every << (every == 1 ? " step (" : " steps (") << updates
      << (updates == 1 ? " update), " : " updates), ") << "the first moving "
      << std::llround(100 * prune_fraction(o, every, total)) << "% of each weight's blocks, "
      << (o.regrow == Regrow::random ? "regrown at random"
                                     : "regrown where the gradient is largest");
  }
  s << "; learning rate x " << std::setprecision(3) << o.lr_factor()
    << (o.lr_scale > 0 ? "" : " (auto)");
  return s.str();
}

UpdateStats update_patterns(model::BertModel& m, Optimizer& optimizer, const SparseOptions& o,
                            int64_t step, int64_t total, uint64_t seed) {
  UpdateStats stats;
  const double pr = prune_fraction(o, step, total);
  std::vector<model::SparseTensor> tensors = m.sparse_tensors();
  const std::span<float> params = m.params();
  if (o.regrow == Regrow::gradient && m.block_grads().empty())
    throw std::logic_error(
        "gradient regrow needs the block gradients of the step (collect_block_grads)");
  uint64_t index = 0;
  for (const model::SparseTensor& t : tensors) {
    ++index;
    const int B = t.spec->block, kept = t.spec->kept_blocks;
    const int R = static_cast<int>(t.spec->shape[0]) / B,
              Cb = static_cast<int>(t.spec->shape[1]) / B;
    const int64_t all = static_cast<int64_t>(R) * Cb;
    const int k = static_cast<int>(std::min<int64_t>(std::llround(pr * kept), all - kept));
    stats.kept += kept;
    if (k <= 0) continue;
    float* values = params.data() + t.spec->offset;
    // Prune: the k slots of smallest L1 norm (ties to the lower slot).
    std::vector<double> l1(kept, 0.0);
    for (int j = 0; j < kept; ++j)
      for (int e = 0; e < B * B; ++e)
        l1[j] += std::abs(static_cast<double>(values[static_cast<int64_t>(j) * B * B + e]));
    std::vector<int> order(kept);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return l1[a] < l1[b] || (l1[a] == l1[b] && a < b); });
    std::vector<int> pruned(order.begin(), order.begin() + k);
    std::sort(pruned.begin(), pruned.end());
    // Regrow among blocks not active before the update (the pruned ones included).
    std::vector<uint8_t> active(all, 0);
    for (int j = 0; j < kept; ++j)
      active[static_cast<int64_t>(t.pattern->slot_row[t.first_slot + j] - t.first_row) * Cb +
             t.pattern->slot_col[t.first_slot + j]] = 1;
    std::vector<int64_t> grown;
    grown.reserve(k);
    if (o.regrow == Regrow::random) {
      // Uniform draws, rejecting active or already chosen blocks: at most `all - kept` are free
      // and k of them are taken, so this ends (quickly when the weight is sparse).
      SplitMix64 rng(mix64(seed ^ mix64(static_cast<uint64_t>(step) * kGolden64 + index)));
      while (static_cast<int>(grown.size()) < k) {
        const int64_t b = static_cast<int64_t>(rng.below(static_cast<uint64_t>(all)));
        if (active[b]) continue;
        active[b] = 2;
        grown.push_back(b);
      }
    } else {
      const std::vector<float>& g = block_grads_of(m, t);
      std::vector<int64_t> free;
      for (int64_t b = 0; b < all; ++b)
        if (!active[b]) free.push_back(b);
      const int64_t offset = static_cast<int64_t>(t.first_row) * Cb;  // the tensor's rows in g
      std::partial_sort(free.begin(), free.begin() + k, free.end(), [&](int64_t a, int64_t b) {
        const float ga = g[offset + a], gb = g[offset + b];
        return ga > gb || (ga == gb && a < b);
      });
      grown.assign(free.begin(), free.begin() + k);
    }
    for (int i = 0; i < k; ++i) {
      const int j = pruned[i], slot = t.first_slot + j;
      t.pattern->slot_row[slot] = static_cast<int32_t>(grown[i] / Cb) + t.first_row;
      t.pattern->slot_col[slot] = static_cast<int32_t>(grown[i] % Cb);
      const size_t first = t.spec->offset + static_cast<size_t>(j) * B * B;
      std::fill_n(params.data() + first, B * B, 0.0f);
      optimizer.zero_moments(first, static_cast<size_t>(B) * B);
    }
    stats.moved += k;
  }
  model::index_patterns(m.patterns());
  return stats;
}

double nonembedding_flops_per_token(const model::ParamLayout& layout) {
  return 6.0 * layout.config().num_hidden_layers *
         static_cast<double>(model::layer_linear_numel(layout));
}

}  // namespace packbert::train
