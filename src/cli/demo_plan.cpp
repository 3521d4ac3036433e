#include "cli/demo_plan.h"

#include <cmath>
#include <map>
#include <sstream>

#include "cli/table.h"
#include "stopwatch.h"
#include "text.h"

namespace packbert::cli {

const DemoReached* DemoSetting::find(double accuracy) const {
  for (const DemoReached& r : reached)
    if (std::abs(r.accuracy - accuracy) < 1e-9) return &r;
  return nullptr;
}

// Steps to each held-out accuracy at the demo's defaults (16 packs a step, LAMB, warmup 40, the
// 2,000-step cap's linear decay), the most any measured seed took, rounded up to the evaluation
// (every 100 steps). bert-mini at 5e-3: 0.20 took 900, 900 and 1,000 steps on seeds 1-3; seed 1
// passed 0.18 and 0.19 at 700 and 800, and each lower target allows seed 3's extra 100.
// bert-tiny at 1e-2 (fp32, seeds 1-3 on a Zen 3; 1e-2 beat 5e-3 and 2e-2 on seed 1): 0.18 at 900,
// 1,000 and 1,000 steps, 0.19 at 1,300, 1,200 and 1,300, 0.20 at 1,700, 1,600 and 1,800.
const std::vector<DemoSetting>& demo_settings() {
  static const std::vector<DemoSetting> settings = {
      {"mini", 5e-3, {{0.20, 1000}, {0.19, 900}, {0.18, 800}}},
      {"tiny", 1e-2, {{0.20, 1800}, {0.19, 1300}, {0.18, 1000}}},
  };
  return settings;
}

const DemoSetting* demo_setting(const std::string& preset) {
  for (const DemoSetting& s : demo_settings())
    if (s.preset == preset) return &s;
  return nullptr;
}

DemoChoice choose_demo_setting(DemoBudget budget,
                               const std::function<DemoStepTimes(const DemoSetting&)>& measure) {
  std::map<const DemoSetting*, DemoStepTimes> measured;
  std::ostringstream why;
  auto times = [&](const DemoSetting& s) {
    auto it = measured.find(&s);
    if (it != measured.end()) return it->second;
    const double t0 = now_seconds();
    const DemoStepTimes t = measure(s);
    budget.spent_minutes += (now_seconds() - t0) / 60;
    why << (measured.empty() ? "" : " ") << "bert-" << s.preset << " (lr " << general(s.lr, 3)
        << ") takes " << fixed(t.padded, 3) << " s a step padded, " << fixed(t.packed, 3)
        << " s packed";
    bool first = true;
    for (const DemoReached& r : s.reached) {
      why << (first ? ": " : ", ") << with_commas(r.step) << " steps to " << fixed(r.accuracy, 2)
          << " ~" << fixed(t.minutes(r.step), 1) << " min of training";
      first = false;
    }
    why << ".";
    measured.emplace(&s, t);
    return t;
  };
  DemoChoice c;
  auto fits = [&](const DemoSetting& s, double target) {
    const DemoReached* r = s.find(target);
    if (!r) return false;
    const DemoStepTimes t = times(s);
    const double minutes = t.minutes(r->step), wall = budget.wall(minutes);
    c = {&s, *r, t, minutes, wall, wall <= budget.wall_minutes, ""};
    return c.fits;
  };
  [&] {
    for (const double target : kDemoTargets)
      for (const DemoSetting& s : demo_settings())
        if (fits(s, target)) return;
  }();
  why << (c.fits ? " The demo trains"
                 : " Nothing fits the " + general(budget.wall_minutes, 3) +
                       "-minute budget; the demo trains")
      << " bert-" << c.setting->preset << " to " << fixed(c.at.accuracy, 2) << ": ~"
      << fixed(c.wall_minutes, 1) << " min wall in all (" << fixed(budget.spent_minutes, 1)
      << " spent, " << general(DemoBudget::kOverhead, 3) << " x " << fixed(c.minutes, 1)
      << " of training for evaluations and noise, " << general(DemoBudget::kTailMinutes, 2)
      << " to finish)"
      << (c.fits ? ", within the " + general(budget.wall_minutes, 3) + "-minute budget" : "")
      << ".";
  c.why = why.str();
  return c;
}

}  // namespace packbert::cli
