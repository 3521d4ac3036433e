#include "pack/plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>

#include "error.h"
#include "stopwatch.h"

namespace packbert::pack {

int64_t PackPlan::packs() const {
  int64_t n = 0;
  for (const Recipe& r : recipes) n += r.count;
  return n;
}

int64_t PackPlan::sequences() const {
  int64_t n = 0;
  for (const Recipe& r : recipes) n += r.count * static_cast<int64_t>(r.lengths.size());
  return n;
}

int64_t PackPlan::tokens() const {
  int64_t n = 0;
  for (const Recipe& r : recipes)
    n += r.count * std::accumulate(r.lengths.begin(), r.lengths.end(), int64_t{0});
  return n;
}

double PackPlan::efficiency() const {
  int64_t p = packs();
  return p ? static_cast<double>(tokens()) / (static_cast<double>(p) * options.max_len) : 0.0;
}

double PackPlan::packing_factor() const {
  int64_t p = packs();
  return p ? static_cast<double>(sequences()) / static_cast<double>(p) : 0.0;
}

void check_plan(const PackPlan& plan, const Histogram& h) {
  auto fail = [&](const std::string& what) {
    throw std::logic_error(plan.algo + " produced an invalid plan: " + what);
  };
  std::vector<int64_t> placed(h.max_len + 1, 0);
  for (const Recipe& r : plan.recipes) {
    if (r.count <= 0) fail("recipe with count " + std::to_string(r.count));
    if (r.lengths.empty()) fail("empty recipe");
    if (static_cast<int64_t>(r.lengths.size()) > plan.options.depth())
      fail("recipe holds " + std::to_string(r.lengths.size()) + " sequences, cap is " +
           std::to_string(plan.options.max_per_pack));
    int sum = 0;
    for (int l : r.lengths) {
      if (l < 1 || l > h.max_len) fail("sequence length " + std::to_string(l) + " out of range");
      sum += l;
      placed[l] += r.count;
    }
    if (sum > plan.options.max_len) fail("recipe of " + std::to_string(sum) + " tokens");
  }
  for (int l = 1; l <= h.max_len; ++l)
    if (placed[l] != h.count[l])
      fail("length " + std::to_string(l) + " placed " + std::to_string(placed[l]) +
           " times, histogram has " + std::to_string(h.count[l]));
}

void normalize(PackPlan& plan) {
  std::map<std::vector<int>, int64_t> merged;
  for (Recipe& r : plan.recipes) {
    std::sort(r.lengths.begin(), r.lengths.end(), std::greater<>());
    if (r.count > 0 && !r.lengths.empty()) merged[r.lengths] += r.count;
  }
  plan.recipes.clear();
  for (auto& [lengths, count] : merged) plan.recipes.push_back({lengths, count});
  auto total = [](const Recipe& r) {
    return std::accumulate(r.lengths.begin(), r.lengths.end(), 0);
  };
  std::stable_sort(plan.recipes.begin(), plan.recipes.end(),
                   [&](const Recipe& a, const Recipe& b) { return total(a) > total(b); });
}

const char* algo_name(Algo algo) {
  switch (algo) {
    case Algo::none:
      return "none";
    case Algo::spfhp:
      return "spfhp";
    case Algo::lpfhp:
      return "lpfhp";
    case Algo::nnlshp:
      return "nnlshp";
    case Algo::optimal:
      return "optimal";
  }
  return "?";
}

Algo parse_algo(const std::string& name) {
  for (Algo a : kAllAlgos)
    if (name == algo_name(a)) return a;
  throw InputError("`algo`: unknown packer '" + name +
                   "', expected none|spfhp|lpfhp|nnlshp|optimal");
}

bool algo_supports(Algo algo, const PackOptions& options) {
  if (algo == Algo::nnlshp) return options.max_per_pack >= 1 && options.max_per_pack <= 3;
  return true;
}

PackPlan pack_none(const Histogram& h, const PackOptions& options) {
  PackPlan plan = empty_plan("none", options);
  for (int l = 1; l <= h.max_len; ++l)
    if (h.count[l] > 0) plan.recipes.push_back({{l}, h.count[l]});
  return plan;
}

PackPlan run_packer(Algo algo, const Histogram& h, const PackOptions& options) {
  if (options.max_len != h.max_len)
    throw InputError("histogram max length " + std::to_string(h.max_len) +
                     " does not match `max_seq_len` " + std::to_string(options.max_len));
  if (!algo_supports(algo, options))
    throw InputError(std::string("`algo` ") + algo_name(algo) +
                     ": needs `max_per_pack` between 1 and 3 (it enumerates exact-fill "
                     "strategies of at most 3 sequences)");
  const Stopwatch clock;
  PackPlan plan;
  switch (algo) {
    case Algo::none:
      plan = pack_none(h, options);
      break;
    case Algo::spfhp:
      plan = pack_spfhp(h, options);
      break;
    case Algo::lpfhp:
      plan = pack_lpfhp(h, options);
      break;
    case Algo::nnlshp:
      plan = pack_nnlshp(h, options);
      break;
    case Algo::optimal:
      plan = pack_optimal(h, options);
      break;
  }
  plan.seconds = clock.seconds();
  normalize(plan);
  check_plan(plan, h);
  return plan;
}

}  // namespace packbert::pack
