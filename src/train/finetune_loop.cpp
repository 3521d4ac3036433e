#include "train/finetune_loop.h"

#include <omp.h>

#include "rng.h"
#include "train/memory_plan.h"

namespace packbert::train {

// The recompute policy a fine-tuning step of full rows fits memory with (`auto` resolved).
model::Recompute step_policy(const model::BertModel& m, const FinetuneOptions& o) {
  const LoopOptions& lo = o.loop;
  PlanRequest plan{m.config(),
                   m.layout().heads(),
                   lo.optimizer.kind,
                   {},
                   lo.precision,
                   lo.optimizer.masters,
                   m.layout().sparsity(),
                   {},
                   1};
  plan.shape = uniform_shape(static_cast<int64_t>(lo.rows_per_batch) * o.max_seq_len,
                             lo.rows_per_batch, omp_get_max_threads());
  plan.backend = lo.backend;
  return check_step_fits(plan, lo.recompute, lo.memory_limit);
}

// Whether any rank was asked to stop (SIGINT/SIGTERM): every rank stops after the same step.
bool stop_requested(const FinetuneOptions& o, dist::Comm& comm) {
  double stop_now = o.stop && o.stop->load() ? 1.0 : 0.0;
  comm.allreduce_max(&stop_now, 1);
  return stop_now > 0;
}

// The order an epoch visits n rows in: a shuffle seeded by (seed, epoch).
std::vector<size_t> epoch_order(size_t n, uint64_t seed, int epoch) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  SplitMix64 rng(seed * kGolden64 + static_cast<uint64_t>(epoch));
  shuffle(order, rng);
  return order;
}

// The run's length: steps per epoch (of processes x rows_per_batch rows x accumulation), its
// steps in all (max_steps, or epochs of them) and the epochs those begin.
RunLength run_length(const FinetuneOptions& o, int64_t micros) {
  RunLength length;
  length.steps_per_epoch = (micros + o.loop.accumulation - 1) / o.loop.accumulation;
  length.max_steps = o.max_steps > 0 ? o.max_steps : length.steps_per_epoch * o.epochs;
  length.epochs =
      static_cast<int>((length.max_steps + length.steps_per_epoch - 1) / length.steps_per_epoch);
  return length;
}

}  // namespace packbert::train
