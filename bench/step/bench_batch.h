// The batch the step benchmarks time: sequences of the given lengths, packed by the optimal
// packer into rows of S slots (or one per row), random tokens, the first 15% of each sequence's
// tokens after [CLS] masked, random NSP labels.
#pragma once

#include <algorithm>
#include <random>
#include <vector>

#include "model/batch.h"
#include "pack/assign.h"
#include "pack/plan.h"
#include "train/memory_plan.h"

namespace packbert::bench {

inline model::PackedBatch bench_batch(const std::vector<int>& lengths, int S, int vocab,
                                      bool one_per_row = false) {
  pack::PackOptions po;
  po.max_len = S;
  const pack::PackPlan plan = pack::run_packer(one_per_row ? pack::Algo::none : pack::Algo::optimal,
                                               pack::histogram_of(lengths, S), po);
  const pack::PackAssignment rows = pack::assign_sequences(plan, lengths, 1);
  int K = 0;
  for (int64_t p = 0; p < rows.packs(); ++p)
    K = std::max<int>(K, static_cast<int>(rows.offsets[p + 1] - rows.offsets[p]));
  model::BatchBuilder b(static_cast<int>(rows.packs()), S, K);
  std::mt19937 rng(7);
  auto token = [&] {
    return 1000 + static_cast<int32_t>(rng() % static_cast<unsigned>(vocab - 1000));
  };
  std::vector<int32_t> tokens;
  for (int64_t p = 0; p < rows.packs(); ++p)
    for (int64_t k = rows.offsets[p]; k < rows.offsets[p + 1]; ++k) {
      const int L = lengths[rows.ids[k]], n_mask = std::max(1, static_cast<int>(0.15 * L + 0.5));
      tokens.resize(static_cast<size_t>(L));
      for (int32_t& t : tokens) t = token();
      const size_t first =
          b.add(static_cast<int>(p), tokens, L / 2, static_cast<int32_t>(rng() % 2));
      for (int i = 1; i <= n_mask && i < L; ++i) b.batch().mlm_labels[first + i] = token();
    }
  return b.take();
}

// The step shape of one batch of these sequence lengths, for the plan (train/memory_plan.h).
inline model::StepShape shape_of_lengths(const std::vector<int>& lengths, int threads) {
  int64_t tokens = 0, sum_sq = 0, longest = 0;
  for (const int64_t L : lengths) tokens += L, sum_sq += L * L, longest = std::max(longest, L);
  model::StepShape shape = train::uniform_shape(tokens, 1, threads);
  shape.sequences = static_cast<int64_t>(lengths.size());
  shape.attention = sum_sq;
  shape.max_len = longest;
  return shape;
}

}  // namespace packbert::bench
