// What `packbert demo` pre-trains: the model, learning rate and held-out accuracy target that fit
// the demo's time budget on this CPU. Each setting carries the steps its runs took to each target
// at the demo's defaults (docs/BENCHMARKS.md, "make demo"); a short measured calibration of the
// step times projects each (setting, target) to minutes, and the choice keeps the target where it
// can by shrinking the model first.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace packbert::cli {

struct DemoReached {
  double accuracy;
  int64_t step;  // the most steps any measured seed took to reach it
};

struct DemoSetting {
  std::string preset;                // bert-<preset>
  double lr;                         // LAMB's peak learning rate for it
  std::vector<DemoReached> reached;  // highest accuracy first
  const DemoReached* find(double accuracy) const;
};

// The settings, largest model first: bert-mini, then bert-tiny.
const std::vector<DemoSetting>& demo_settings();
const DemoSetting* demo_setting(const std::string& preset);

// Seconds a step of each run takes.
struct DemoStepTimes {
  double padded = 0, packed = 0;
  double minutes(int64_t steps) const {
    return static_cast<double>(steps) * (padded + packed) / 60;
  }
};

// The demo's wall-time budget and how a choice's projected training becomes wall time: the
// minutes already spent (packing tables, corpus, calibration) + the two runs' projected training x
// kOverhead (their held-out evaluations, best-state writes and a shared machine's noise: both
// bert-tiny runs to 0.20 on a Zen 3 took 1.09x their projection, evaluations included) +
// kTailMinutes (the last evaluation, table, plot).
struct DemoBudget {
  static constexpr double kOverhead = 1.15, kTailMinutes = 0.5;
  double wall_minutes = 15;
  double spent_minutes = 0;
  double wall(double training_minutes) const {
    return spent_minutes + kOverhead * training_minutes + kTailMinutes;
  }
};

struct DemoChoice {
  const DemoSetting* setting = nullptr;
  DemoReached at{};
  DemoStepTimes times;
  double minutes = 0;       // both runs' projected training time
  double wall_minutes = 0;  // the whole demo's projected wall time (DemoBudget::wall)
  bool fits = false;        // within the budget
  std::string why;          // what was measured and why this was chosen, one paragraph
};

// The targets the choice may take, highest first: all past the frequent-token plateau (its top
// is about 0.15).
inline constexpr double kDemoTargets[] = {0.20, 0.19, 0.18};

// For each target, highest first, each setting, largest first: the first whose projected wall
// time fits the budget; where none does, the smallest setting at the lowest target, said to be
// over. `measure` is asked once per setting, only when the choice needs it; the wall time it
// takes counts as spent.
DemoChoice choose_demo_setting(DemoBudget budget,
                               const std::function<DemoStepTimes(const DemoSetting&)>& measure);

}  // namespace packbert::cli
