#include "train/pipeline.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace packbert::train {

namespace {

void check(int stages, int stage, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw std::logic_error("pipeline schedule: stage " + std::to_string(stage) + " of " +
                           std::to_string(stages) + ", " + std::to_string(micro_batches) +
                           " micro-batches");
}

}  // namespace

std::vector<PipelineAction> one_f_one_b(int stages, int stage, int micro_batches) {
  check(stages, stage, micro_batches);
  const int M = micro_batches, warmup = std::min(stages - 1 - stage, M);
  std::vector<PipelineAction> actions;
  int forward = 0, backward = 0;
  for (; forward < warmup; ++forward) actions.push_back({false, forward});
  for (; forward < M; ++forward, ++backward) {
    actions.push_back({false, forward});
    actions.push_back({true, backward});
  }
  for (; backward < M; ++backward) actions.push_back({true, backward});
  return actions;
}

int forwards_in_flight(int stages, int stage, int micro_batches) {
  check(stages, stage, micro_batches);
  return std::min(stages - stage, micro_batches);
}

double bubble_fraction(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace packbert::train
