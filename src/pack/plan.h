// Pack plans: what every packer returns. A plan is a list of recipes (a multiset of sequence
// lengths that fit one pack) with repeat counts; it says nothing yet about which concrete
// sequences go where (see assign.h).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "pack/histogram.h"

namespace packbert::pack {

struct PackOptions {
  int max_len = 512;     // tokens per pack
  int max_per_pack = 0;  // cap on sequences per pack (depth); 0 = unlimited
  int depth() const { return max_per_pack > 0 ? max_per_pack : std::numeric_limits<int>::max(); }
};

struct Recipe {
  std::vector<int> lengths;  // sorted descending; sum <= max_len
  int64_t count = 0;         // how many packs follow this recipe
};

struct PackPlan {
  std::string algo;
  PackOptions options;
  std::vector<Recipe> recipes;
  double seconds = 0;  // wall time of the packer itself
  // Set by `optimal` (and by lp_lower_bound): the LP relaxation's value and its ceiling, a
  // proven lower bound on the number of packs any packing needs. lower_bound < 0: not computed.
  double lp_value = 0;
  int64_t lower_bound = -1;

  int64_t packs() const;
  int64_t sequences() const;
  int64_t tokens() const;
  double efficiency() const;      // real tokens / (packs * max_len)
  double packing_factor() const;  // sequences / packs
};

inline PackPlan empty_plan(std::string algo, const PackOptions& options) {
  PackPlan plan;
  plan.algo = std::move(algo);
  plan.options = options;
  return plan;
}

// Asserts the plan is a packing of h under its options: every sequence placed exactly once, no
// pack over max_len, depth cap honoured, counts positive. Throws std::logic_error otherwise.
void check_plan(const PackPlan& plan, const Histogram& h);

// Merges recipes with equal length multisets and sorts them (longest total first), so plans
// compare and print deterministically.
void normalize(PackPlan& plan);

enum class Algo { none, spfhp, lpfhp, nnlshp, optimal };
inline constexpr Algo kAllAlgos[] = {Algo::none, Algo::spfhp, Algo::lpfhp, Algo::nnlshp,
                                     Algo::optimal};
const char* algo_name(Algo algo);
Algo parse_algo(const std::string& name);  // throws InputError on an unknown name
// Whether `algo` supports these options (NNLSHP enumerates exact-fill strategies, depth <= 3).
bool algo_supports(Algo algo, const PackOptions& options);

PackPlan pack_none(const Histogram& h, const PackOptions& options);
PackPlan pack_spfhp(const Histogram& h, const PackOptions& options);
PackPlan pack_lpfhp(const Histogram& h, const PackOptions& options);
PackPlan pack_nnlshp(const Histogram& h, const PackOptions& options);
PackPlan pack_optimal(const Histogram& h, const PackOptions& options);
// The LP relaxation's bound alone (what `optimal` reports), for judging any other plan.
struct PackBound {
  double lp_value = 0;
  int64_t lower_bound = 0;
};
PackBound packing_lower_bound(const Histogram& h, const PackOptions& options);

// All non-decreasing lists of 1..depth lengths summing to exactly max_len (NNLSHP's strategies).
std::vector<std::vector<int>> exact_fill_strategies(int max_len, int depth);

// Runs one packer, timing it, normalizing and checking the result.
PackPlan run_packer(Algo algo, const Histogram& h, const PackOptions& options);

}  // namespace packbert::pack
