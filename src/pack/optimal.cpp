// `optimal`: the LP relaxation of histogram bin packing (column generation, colgen.h) gives
// both a proven lower bound and a fractional packing; the packing is made integral by
// repeatedly taking the whole part of every pattern and re-solving the LP on what is left, and
// the last, small residual is packed by diving (fix the LP's most-used pattern once, re-solve).
#include <algorithm>
#include <cmath>

#include "pack/colgen.h"
#include "pack/plan.h"

namespace packbert::pack {

namespace {

constexpr double kDiveOneAtATime = 24;
constexpr double kBatchThreshold = 0.75;

std::vector<Pattern> patterns_of(const PackPlan& plan) {
  std::vector<Pattern> out;
  for (const Recipe& r : plan.recipes) {
    Pattern p;
    for (int l : r.lengths) {
      if (!p.items.empty() && p.items.back().first == l)
        ++p.items.back().second;
      else
        p.items.push_back({l, 1});
    }
    out.push_back(std::move(p));
  }
  return out;
}

// How many whole copies of p the remaining demand still holds.
int64_t copies_available(const Pattern& p, const std::vector<int64_t>& remaining) {
  int64_t n = std::numeric_limits<int64_t>::max();
  for (auto [l, a] : p.items) n = std::min(n, remaining[l] / a);
  return n;
}

void take(const Pattern& p, int64_t copies, std::vector<int64_t>& remaining, PackPlan& plan) {
  Recipe r{{}, copies};
  for (auto [l, a] : p.items) {
    remaining[l] -= a * copies;
    r.lengths.insert(r.lengths.end(), a, l);
  }
  plan.recipes.push_back(std::move(r));
}

bool empty(const std::vector<int64_t>& remaining) {
  return std::all_of(remaining.begin(), remaining.end(), [](int64_t v) { return v == 0; });
}

// Columns with positive value first, so a warm start meets them early.
std::vector<Pattern> useful_patterns(const LpSolution& lp) {
  std::vector<Pattern> out;
  for (size_t j = 0; j < lp.patterns.size(); ++j)
    if (lp.x[j] > 1e-9) out.push_back(lp.patterns[j]);
  return out;
}

// Starting columns: the greedy LPFHP packing's recipes, and with a small depth cap also every
// exact-fill strategy (the LP optimum is made mostly of those; having them spares pricing).
std::vector<Pattern> seeds_for(const Histogram& h, const PackOptions& options) {
  PackPlan greedy = pack_lpfhp(h, options);
  if (options.max_per_pack >= 1 && options.max_per_pack <= 3)
    for (auto& s : exact_fill_strategies(options.max_len, options.max_per_pack))
      greedy.recipes.push_back({std::move(s), 1});
  return patterns_of(greedy);
}

// The Farley bound sum_i d_i y_i / max(1, best pattern value) holds for any duals y, so it is a
// lower bound even if the LP stopped early; its ceiling bounds the integer optimum.
int64_t bound_of(const LpSolution& lp) {
  return static_cast<int64_t>(std::ceil(lp.dual_bound - 1e-6));
}

}  // namespace

PackBound packing_lower_bound(const Histogram& h, const PackOptions& options) {
  LpSolution lp =
      solve_packing_lp(h.count, options.max_len, options.depth(), seeds_for(h, options));
  return {lp.value, bound_of(lp)};
}

PackPlan pack_optimal(const Histogram& h, const PackOptions& options) {
  const int S = options.max_len;
  const int64_t depth = options.depth();
  PackPlan plan = empty_plan("optimal", options);
  std::vector<int64_t> remaining = h.count;

  LpSolution lp = solve_packing_lp(remaining, S, depth, seeds_for(h, options));
  plan.lp_value = lp.value;
  plan.lower_bound = bound_of(lp);

  // Whole parts of the LP solution, re-solved on the residual until nothing whole is left.
  for (int round = 0; round < 64 && !empty(remaining); ++round) {
    std::vector<size_t> order(lp.patterns.size());
    for (size_t j = 0; j < order.size(); ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lp.x[a] > lp.x[b]; });
    bool took = false;
    for (size_t j : order) {
      if (lp.x[j] < 1.0 - 1e-9) break;
      int64_t want = static_cast<int64_t>(std::floor(lp.x[j] + 1e-9));
      int64_t n = std::min(want, copies_available(lp.patterns[j], remaining));
      if (n > 0) take(lp.patterns[j], n, remaining, plan), took = true;
    }
    if (!took || empty(remaining)) break;
    lp = solve_packing_lp(remaining, S, depth, useful_patterns(lp));
  }

  // Diving on the small residual: commit one pack of the LP's most-used pattern, trimmed to
  // what is left, and re-solve. While the residual is still large (LP value above
  // kDiveOneAtATime packs) every pattern used at least half a time is committed at once, which
  // saves most re-solves at the cost of a pack or two.
  while (!empty(remaining)) {
    lp = solve_packing_lp(remaining, S, depth, useful_patterns(lp));
    std::vector<size_t> order;
    for (size_t j = 0; j < lp.x.size(); ++j)
      if (lp.x[j] > 1e-9) order.push_back(j);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lp.x[a] > lp.x[b]; });
    const bool batch = lp.value > kDiveOneAtATime;
    for (size_t n = 0; n < order.size() && (n == 0 || (batch && lp.x[order[n]] >= kBatchThreshold));
         ++n) {
      Pattern p;
      for (auto [l, a] : lp.patterns[order[n]].items) {
        int64_t k = std::min<int64_t>(a, remaining[l]);
        if (k > 0) p.items.push_back({l, static_cast<int>(k)});
      }
      if (!p.items.empty()) take(p, 1, remaining, plan);
    }
  }
  return plan;
}

}  // namespace packbert::pack
