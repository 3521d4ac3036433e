// From recipes to concrete packs: which sequence ids go into which pack.
#pragma once

#include <cstdint>
#include <vector>

#include "pack/plan.h"
#include "rng.h"

namespace packbert::pack {

// Packs in CSR form: pack p holds sequence ids ids[offsets[p] .. offsets[p+1]).
struct PackAssignment {
  std::vector<int64_t> offsets{0};
  std::vector<int64_t> ids;
  int64_t packs() const { return static_cast<int64_t>(offsets.size()) - 1; }
};

// Assigns every sequence (lengths[i] is sequence i's length) to a pack of `plan`. Which
// sequence of a given length fills which slot, and the order of the packs, are shuffled by
// `seed`; the result depends on nothing else (not on thread count or platform). Throws
// InputError if the lengths' histogram differs from the one the plan was made for.
PackAssignment assign_sequences(const PackPlan& plan, const std::vector<int>& lengths,
                                uint64_t seed);

}  // namespace packbert::pack
