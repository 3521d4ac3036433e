// The LP relaxation of histogram bin packing, solved by column generation (Gilmore & Gomory):
//   minimise sum_p x_p  subject to  sum_p a_ip x_p >= d_i for every length i,  x >= 0,
// over patterns p (multisets of lengths with total <= max_len and at most `depth` items). The
// master LP is a revised simplex with a dense basis inverse; new patterns come from a bounded
// knapsack over lengths that maximises the dual value of a pattern.
#pragma once

#include <cstdint>
#include <vector>

namespace packbert::pack {

struct Pattern {
  std::vector<std::pair<int, int>> items;  // (length, how many), lengths distinct
};

struct LpSolution {
  std::vector<Pattern> patterns;  // every column generated (for warm starts)
  std::vector<double> x;          // value of each column; nonzero only on the final basis
  double value = 0;               // optimal objective (sum of x)
  double dual_bound = 0;          // Farley bound from the final duals: a proven lower bound
  int iterations = 0;
  int generated = 0;
};

// demand[l] for l in [0, max_len]: how many sequences of length l must be placed.
// `seeds` are patterns to start from (e.g. a greedy packer's recipes); may be empty.
LpSolution solve_packing_lp(const std::vector<int64_t>& demand, int max_len, int64_t depth,
                            const std::vector<Pattern>& seeds);

}  // namespace packbert::pack
