// NNLSHP (Krell et al. 2021): choose how often to use each exact-fill "strategy" (a multiset of
// at most 3 lengths summing to max_len) by non-negative least squares against the histogram,
// round to integers, cover what is left with two-sequence strategies, and let the strategies'
// surplus slots become padding. Short lengths (< 8) are weighted 0.09 in the fit, as in the
// reference, because leaving them over-covered costs little padding.
#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "pack/nnls.h"
#include "pack/plan.h"

namespace packbert::pack {

std::vector<std::vector<int>> exact_fill_strategies(int S, int depth) {
  std::vector<std::vector<int>> out;
  std::vector<int> cur;
  auto rec = [&](auto&& self, int start, int remaining) -> void {
    if (static_cast<int>(cur.size()) == depth - 1) {
      if (remaining >= start) {
        cur.push_back(remaining);
        out.push_back(cur);
        cur.pop_back();
      }
      return;
    }
    for (int v = start; v <= remaining; ++v) {
      cur.push_back(v);
      if (v == remaining)
        out.push_back(cur);
      else
        self(self, v, remaining - v);
      cur.pop_back();
    }
  };
  rec(rec, 1, S);
  return out;
}

PackPlan pack_nnlshp(const Histogram& h, const PackOptions& options) {
  const int S = options.max_len;
  const int depth = options.max_per_pack;
  if (depth < 1 || depth > 3) throw std::logic_error("nnlshp needs a depth cap of 1 to 3");
  std::vector<std::vector<int>> strategies = exact_fill_strategies(S, depth);

  auto weight = [](int len) { return len < 8 ? 0.09 : 1.0; };
  std::vector<SparseColumn> columns(strategies.size());
  for (size_t j = 0; j < strategies.size(); ++j) {
    std::map<int, int> multiplicity;
    for (int l : strategies[j]) ++multiplicity[l];
    for (auto [l, m] : multiplicity) columns[j].entries.push_back({l - 1, weight(l) * m});
  }
  std::vector<double> b(S);
  for (int l = 1; l <= S; ++l) b[l - 1] = weight(l) * static_cast<double>(h.count[l]);

  std::vector<double> x = nnls(S, columns, b);
  std::vector<int64_t> repeat(strategies.size());
  for (size_t j = 0; j < x.size(); ++j) repeat[j] = std::llround(x[j]);

  auto coverage = [&] {
    std::vector<int64_t> c(S + 1, 0);
    for (size_t j = 0; j < strategies.size(); ++j)
      for (int l : strategies[j]) c[l] += repeat[j];
    return c;
  };
  // Sequences the rounded solution leaves out go into [l, S - l] (or [S]) strategies.
  std::map<std::vector<int>, size_t> index;
  for (size_t j = 0; j < strategies.size(); ++j) index[strategies[j]] = j;
  std::vector<int64_t> covered = coverage();
  for (int l = 1; l <= S; ++l) {
    int64_t missing = h.count[l] - covered[l];
    if (missing <= 0) continue;
    std::vector<int> s =
        l == S ? std::vector<int>{S} : std::vector<int>{std::min(l, S - l), std::max(l, S - l)};
    auto it = index.find(s);
    if (it == index.end()) {  // depth 1: only [S] exists; a lone sequence is its own pack
      strategies.push_back({l});
      repeat.push_back(missing);
      index[{l}] = strategies.size() - 1;
    } else {
      repeat[it->second] += missing;
    }
  }

  // Surplus slots are padding: drop them from the recipes, one occurrence at a time.
  covered = coverage();
  std::vector<Recipe> groups;
  for (size_t j = 0; j < strategies.size(); ++j)
    if (repeat[j] > 0) groups.push_back({strategies[j], repeat[j]});
  for (int l = 1; l <= S; ++l) {
    int64_t surplus = covered[l] - h.count[l];
    for (size_t g = 0; g < groups.size() && surplus > 0; ++g) {
      auto pos = std::find(groups[g].lengths.begin(), groups[g].lengths.end(), l);
      if (pos == groups[g].lengths.end()) continue;
      int64_t take = std::min(surplus, groups[g].count);
      Recipe trimmed{groups[g].lengths, take};
      trimmed.lengths.erase(trimmed.lengths.begin() + (pos - groups[g].lengths.begin()));
      groups[g].count -= take;
      surplus -= take;
      groups.push_back(std::move(trimmed));  // may lose another l later in this loop
    }
  }
  PackPlan plan = empty_plan("nnlshp", options);
  for (Recipe& g : groups)
    if (g.count > 0 && !g.lengths.empty()) plan.recipes.push_back(std::move(g));
  return plan;
}

}  // namespace packbert::pack
