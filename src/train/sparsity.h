// Dynamic block-sparse training (Dietrich et al. 2021, "Towards Structured Dynamic Sparse
// Pre-Training of BERT"): every encoder linear weight keeps a fixed number of blocks on a
// pattern that starts uniformly random and evolves. n times during a run (every total/n steps)
// each weight prunes the fraction pr(t) of its blocks with the smallest L1 norm and regrows as
// many among the blocks that were not active before the update, at random or where the dense
// gradient is largest; the new blocks' weights and optimizer moments start at zero. pr(t) is
// cosine-decayed from prune_ratio at step 0 towards 0 at the last step. The pattern's slots never
// move in memory: a pruned slot takes a regrown block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/bert.h"
#include "train/optimizer.h"

namespace packbert::train {

enum class Regrow { random, gradient };
const char* regrow_name(Regrow r);
// "random" or "gradient"; InputError naming `flag` otherwise.
Regrow parse_regrow(const std::string& name, const std::string& flag);

struct SparseOptions {
  model::Sparsity sparsity;  // block 0: dense training, the rest unused
  double prune_ratio = 0.5;  // pr(0)
  int updates = 0;           // n; 0 = Graphcore's default (160 for 1 x 1 blocks, 80 otherwise)
  Regrow regrow = Regrow::random;
  // The learning rate's factor: a number, or <= 0 for `auto`, Graphcore's
  // eta(s) / eta(0) = exp(1.969 s^2 + 0.2905 s) (about 6.4x at s = 0.9).
  double lr_scale = 1;
  model::SparseInit init = model::SparseInit::dense;  // how the sparse weights start
  int updates_or_default() const;
  double lr_factor() const;  // lr_scale, or eta(s) / eta(0) when it is `auto`
};

// exp(1.969 s^2 + 0.2905 s).
double sparse_lr_scale(double sparsity);

// Whether an update of the patterns follows optimizer step `step` (from 1) of `total`: every
// total / n steps (rounded, at least 1), before the last step.
bool is_update_step(const SparseOptions& o, int64_t step, int64_t total);
// pr(step) = prune_ratio * (1 + cos(pi * step / total)) / 2.
double prune_fraction(const SparseOptions& o, int64_t step, int64_t total);
// The pattern updates a run of `total` steps makes (0 with prune_ratio 0: the pattern is fixed).
int64_t update_count(const SparseOptions& o, int64_t total);

// One line for a user: the block size and sparsity, when the pattern moves over a run of `total`
// steps and how much the first update moves (or that it stays fixed), how blocks regrow, and the
// learning rate's factor, e.g. "16 x 16 blocks at s = 0.9; pattern updated every 19 steps (78
// updates), the first moving 50% of each weight's blocks, regrown at random; learning rate x 6.4
// (auto)".
std::string schedule_summary(const SparseOptions& o, int64_t total);

struct UpdateStats {
  int64_t moved = 0, kept = 0;  // blocks pruned (= regrown) and held, over all sparse weights
  double churn() const { return kept ? static_cast<double>(moved) / static_cast<double>(kept) : 0; }
};

// One update at `step`: for each sparse weight of `m` prunes round(pr * kept) blocks with the
// smallest L1 norm (ties to the lower slot) and regrows as many among the blocks not active
// before the update (random: a counter-based draw keyed by (seed, step, tensor); gradient: the
// largest L1 norms of the dense gradient, m.block_grads()), zeroes their values and moments in
// `optimizer` (its shard), and re-indexes the patterns. Deterministic: every process of a run
// makes the same update.
UpdateStats update_patterns(model::BertModel& m, Optimizer& optimizer, const SparseOptions& o,
                            int64_t step, int64_t total, uint64_t seed);

// Training FLOPs per real token of the encoder's linear layers (the paper's non-embedding count,
// 3 x 2 x in x out x density per weight: forward, input and weight gradients).
double nonembedding_flops_per_token(const model::ParamLayout& layout);

}  // namespace packbert::train
