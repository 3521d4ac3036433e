#include "pack/assign.h"

#include "error.h"

namespace packbert::pack {

PackAssignment assign_sequences(const PackPlan& plan, const std::vector<int>& lengths,
                                uint64_t seed) {
  const int S = plan.options.max_len;
  std::vector<std::vector<int64_t>> by_length(S + 1);
  for (size_t i = 0; i < lengths.size(); ++i) {
    int l = lengths[i];
    if (l < 1 || l > S)
      throw InputError("sequence " + std::to_string(i) + " has length " + std::to_string(l) +
                       ", outside [1, " + std::to_string(S) + "]");
    by_length[l].push_back(static_cast<int64_t>(i));
  }
  std::vector<int64_t> needed(S + 1, 0);
  for (const Recipe& r : plan.recipes)
    for (int l : r.lengths) needed[l] += r.count;
  for (int l = 1; l <= S; ++l)
    if (needed[l] != static_cast<int64_t>(by_length[l].size()))
      throw InputError("plan places " + std::to_string(needed[l]) + " sequences of length " +
                       std::to_string(l) + " but the data has " +
                       std::to_string(by_length[l].size()) + "; the plan was made for other data");

  SplitMix64 rng(seed);
  for (auto& ids : by_length) shuffle(ids, rng);
  // Pack order: a shuffled list of (recipe, copy) indices.
  std::vector<std::pair<uint32_t, int64_t>> order;
  order.reserve(static_cast<size_t>(plan.packs()));
  for (size_t r = 0; r < plan.recipes.size(); ++r)
    for (int64_t c = 0; c < plan.recipes[r].count; ++c)
      order.push_back({static_cast<uint32_t>(r), c});
  shuffle(order, rng);

  std::vector<size_t> next(S + 1, 0);
  PackAssignment out;
  out.offsets.reserve(order.size() + 1);
  out.ids.reserve(lengths.size());
  for (auto [r, copy] : order) {
    (void)copy;
    for (int l : plan.recipes[r].lengths) out.ids.push_back(by_length[l][next[l]++]);
    out.offsets.push_back(static_cast<int64_t>(out.ids.size()));
  }
  return out;
}

}  // namespace packbert::pack
