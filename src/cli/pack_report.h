// What `pack`, `demo` and the pack benchmark print and write about pack plans.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "cli/table.h"
#include "pack/plan.h"

namespace packbert::cli {

// One row per plan: algo, packs, efficiency %, packing factor, lower bound, gap, seconds.
// `bound` is the LP lower bound for these options (the gap column is packs - bound).
Table plan_table(const std::vector<pack::PackPlan>& plans, const pack::PackBound& bound);

// The plan as JSON (docs/FORMATS.md, "pack plan").
nlohmann::json plan_to_json(const pack::PackPlan& plan, const pack::PackBound& bound);

}  // namespace packbert::cli
