#include "cli/pack_report.h"

namespace packbert::cli {

Table plan_table(const std::vector<pack::PackPlan>& plans, const pack::PackBound& bound) {
  Table t({"algo", "packs", "efficiency %", "packing factor", "lower bound", "gap", "seconds"});
  for (const pack::PackPlan& p : plans)
    t.add_row({p.algo, with_commas(p.packs()), fixed(100.0 * p.efficiency(), 3),
               fixed(p.packing_factor(), 4), with_commas(bound.lower_bound),
               with_commas(p.packs() - bound.lower_bound), seconds_text(p.seconds)});
  return t;
}

nlohmann::json plan_to_json(const pack::PackPlan& plan, const pack::PackBound& bound) {
  nlohmann::json recipes = nlohmann::json::array();
  for (const pack::Recipe& r : plan.recipes)
    recipes.push_back({{"lengths", r.lengths}, {"count", r.count}});
  return {
      {"format", "packbert.pack_plan"},
      {"version", 1},
      {"algo", plan.algo},
      {"max_seq_len", plan.options.max_len},
      {"max_per_pack", plan.options.max_per_pack},
      {"packs", plan.packs()},
      {"sequences", plan.sequences()},
      {"tokens", plan.tokens()},
      {"efficiency", plan.efficiency()},
      {"packing_factor", plan.packing_factor()},
      {"lp_value", bound.lp_value},
      {"lower_bound", bound.lower_bound},
      {"gap", plan.packs() - bound.lower_bound},
      {"seconds", plan.seconds},
      {"recipes", recipes},
  };
}

}  // namespace packbert::cli
