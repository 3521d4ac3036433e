// Packed batches for model tests: packs from lists of sequence lengths, deterministic random
// content, labels for every head (class labels in [0, 3)).
#pragma once

#include <algorithm>
#include <random>
#include <vector>

#include "model/batch.h"

namespace packbert::model {

inline PackedBatch make_batch(const std::vector<std::vector<int>>& packs, int S, int vocab,
                              uint32_t seed) {
  std::mt19937 rng(seed);
  int K = 0;
  for (auto& p : packs) K = std::max(K, static_cast<int>(p.size()));
  PackedBatch b = empty_batch(static_cast<int>(packs.size()), S, K);
  for (int p = 0; p < b.B; ++p) {
    int o = 0;
    for (size_t k = 0; k < packs[p].size(); ++k) {
      int L = packs[p][k];
      for (int i = 0; i < L; ++i) {
        size_t s = static_cast<size_t>(p) * S + o + i;
        b.input_ids[s] = 1 + static_cast<int>(rng() % (vocab - 1));
        b.token_type_ids[s] = i >= L / 2;
        b.position_ids[s] = i;
        b.sequence_ids[s] = static_cast<int>(k) + 1;
        if (i > 0 && rng() % 4 == 0) b.mlm_labels[s] = static_cast<int>(rng() % vocab);
      }
      b.nsp_labels[static_cast<size_t>(p) * b.K + k] = static_cast<int>(rng() % 2);
      b.class_labels.push_back(static_cast<int>(rng() % 3));
      b.span_starts.push_back(static_cast<int>(rng() % L));
      b.span_ends.push_back(static_cast<int>(rng() % L));
      o += L;
    }
  }
  return b;
}

}  // namespace packbert::model
