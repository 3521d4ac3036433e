// Packed batches for model tests: packs from lists of sequence lengths, deterministic random
// content, labels for every head (class labels in [0, 3)).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <span>
#include <vector>

#include "kernels/tensor.h"
#include "model/batch.h"
#include "model/bert.h"

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

// a (fp32 masters) and b (bf16 masters holding a's values, which are bf16 values) take the same
// step bit for bit, `run(m)` giving its loss and gradients; and again after every master of b is
// halved, b's fp32 tensors following once told (masters_written), a's halved alike.
template <typename Run>
void expect_bf16_masters_step_as_fp32(BertModel& a, BertModel& b, Run run) {
  const auto [loss_a, grads_a] = run(a);
  const auto [loss_b, grads_b] = run(b);
  EXPECT_EQ(loss_a, loss_b);
  EXPECT_EQ(grads_a, grads_b);
  kernels::bf16* w16 = b.masters().as<kernels::bf16>();
  for (size_t i = 0; i < b.layout().total(); ++i)
    w16[i] = kernels::to_bf16(0.5f * kernels::to_float(w16[i]));
  b.masters_written();
  for (float& w : a.params()) w *= 0.5f;
  EXPECT_EQ(run(a).first, run(b).first);
}

}  // namespace packbert::model
