// Packed batches for model tests: packs from lists of sequence lengths, deterministic random
// content, labels for every head (class labels in [0, 3)).
#pragma once

#include <algorithm>
#include <random>
#include <span>
#include <vector>

#include "model/batch.h"

namespace packbert::model {

// A copy of a model's weights or gradients (BertModel::params(), grads()), to compare or keep.
template <typename T>
std::vector<std::remove_const_t<T>> as_vector(std::span<T> s) {
  return {s.begin(), s.end()};
}

inline PackedBatch make_batch(const std::vector<std::vector<int>>& packs, int S, int vocab,
                              uint32_t seed) {
  std::mt19937 rng(seed);
  int K = 0;
  for (auto& p : packs) K = std::max(K, static_cast<int>(p.size()));
  BatchBuilder b(static_cast<int>(packs.size()), S, K);
  std::vector<int32_t> tokens, labels;
  for (size_t p = 0; p < packs.size(); ++p)
    for (size_t k = 0; k < packs[p].size(); ++k) {
      const int L = packs[p][k];
      tokens.assign(static_cast<size_t>(L), 0);
      labels.assign(static_cast<size_t>(L), -100);
      for (int i = 0; i < L; ++i) {
        tokens[i] = 1 + static_cast<int>(rng() % (vocab - 1));
        if (i > 0 && rng() % 4 == 0) labels[i] = static_cast<int>(rng() % vocab);
      }
      const size_t first = b.add(static_cast<int>(p), tokens, L / 2, static_cast<int>(rng() % 2));
      std::copy(labels.begin(), labels.end(), b.batch().mlm_labels.begin() + first);
      b.batch().class_labels.push_back(static_cast<int>(rng() % 3));
      b.batch().span_starts.push_back(static_cast<int>(rng() % L));
      b.batch().span_ends.push_back(static_cast<int>(rng() % L));
    }
  return b.take();
}

}  // namespace packbert::model
