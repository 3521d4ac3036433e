// Pipeline parallelism's schedule: PipeDream-Flush ("1F1B", Narayanan et al. 2021; Megatron-LM's
// non-interleaved schedule). A step's M micro-batches flow through P stages (model::Stage):
// stage s first runs min(P - 1 - s, M) warm-up forwards, then alternates one forward and one
// backward, then runs the backwards left. The last stage runs each micro-batch's backward right
// after its forward; a stage holds at most P - s forwards in flight (one model pass each), not
// M as GPipe's all-forwards-then-all-backwards does. Backwards run in micro-batch order on every
// stage, so the gradients accumulate in the order one process accumulates them.
#pragma once

#include <vector>

namespace packbert::train {

struct PipelineAction {
  bool backward = false;
  int micro = 0;  // the micro-batch, from 0
  bool operator==(const PipelineAction&) const = default;
};

// Stage s's actions for one step of M micro-batches over P stages, in order.
std::vector<PipelineAction> one_f_one_b(int stages, int stage, int micro_batches);

// The forwards stage s holds at most (its model passes): min(P - s, M). Micro-batch j uses pass
// j % in_flight: the pass's previous micro-batch (j - in_flight) has finished its backward by
// the time j's forward starts.
int forwards_in_flight(int stages, int stage, int micro_batches);

// The share of a step the pipeline idles when every stage's forward and backward take the same
// time: (P - 1) / (M + P - 1).
double bubble_fraction(int stages, int micro_batches);

}  // namespace packbert::train
