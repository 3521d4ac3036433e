// What a run records: one StepMetrics per optimizer step and one EvalMetrics per evaluation,
// each with the one to_json that metrics.jsonl's lines come from (pretrain and finetune alike;
// docs/FORMATS.md), and the Schedule that says when a run evaluates, checkpoints and stops.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/params.h"
#include "train/loop.h"

namespace packbert::train {

struct StepMetrics {
  int64_t step = 0;
  int epoch = 0;  // fine-tuning's epoch, from 1 (0: a run counted in steps, pre-training)
  // The model's heads: which losses and accuracies the step has.
  model::Heads heads;
  bool regression = false;  // the classifier is a regression head: a loss, no accuracy
  double loss = 0, lr = 0, grad_norm = 0;
  double mlm_loss = 0, nsp_loss = 0, mlm_acc = 0, nsp_acc = 0;  // pre-training
  double cls_loss = 0, cls_acc = 0, span_loss = 0;              // fine-tuning
  int64_t real_tokens = 0, sequences = 0;  // real tokens exclude computed padding
  double seconds = 0, elapsed = 0;         // this step; since the run began (excluding evaluation)
  // Steps count from 1: `step` is the number of optimizer steps done once this one is. elapsed
  // is training time only (no evaluation, no checkpoint writing), summed over resumed runs.
  bool skipped = false;     // no update was applied
  std::string skip_reason;  // StepResult's
  int64_t outlier_skips = 0;
  // The loss scale this step ran with, and the overflows so far; written under loss scaling.
  bool loss_scaling = false;
  double loss_scale = 1;
  int64_t loss_scale_overflows = 0;
  // Under mpirun (processes > 1): the most real tokens one process computed over the mean, and
  // the seconds spent waiting on collectives outside backward.
  int processes = 1;
  double imbalance = 1, comm_seconds = 0;
  // Pipeline stages: each stage's wait on its neighbours (StepResult's); the JSON line adds
  // "bubble", their mean over the step's seconds.
  std::vector<double> stage_wait_seconds;
  // Training FLOPs of the encoder's linear layers so far (nonembedding_flops_per_token x real
  // tokens, summed over resumed runs), and, after a step that updated the sparse patterns, the
  // blocks it moved and their share of all kept blocks.
  double train_flops = 0;
  bool pattern_update = false;
  int64_t blocks_moved = 0;
  double churn = 0;

  // The losses, accuracies, counts and skip of a Stepper's result.
  void take(const StepResult& r);
  // A step's metrics from its result, the model's heads and the Stepper's counters (the step
  // number, epoch, times and FLOPs are the caller's).
  static StepMetrics of(const StepResult& r, const model::Heads& heads, Stepper& stepper,
                        const LoopOptions& o, int processes);
  // The metrics.jsonl line ("type": "step"): the heads' losses and accuracies, the optional
  // parts (loss scaling, pattern updates, processes) only where they apply.
  nlohmann::json to_json() const;
};

struct EvalMetrics {
  int64_t step = 0;
  double mlm_loss = 0, mlm_acc = 0, nsp_loss = 0, nsp_acc = 0;
  int64_t mlm_count = 0, sequences = 0;
  double elapsed = 0;              // training seconds when it ran (the clock of the step records)
  double eval_seconds = 0;         // how long the evaluation took
  nlohmann::json to_json() const;  // ("type": "eval")
};

// When a run evaluates, checkpoints and stops, in steps counted from 1 (the step just done).
// The last step's evaluation and checkpoint are the run's end's, not the schedule's.
struct Schedule {
  int64_t max_steps = 0;
  int64_t eval_every = 0, checkpoint_every = 0;  // 0 = never before the end
  double max_minutes = 0;                        // 0 = no time limit

  bool evaluates_after(int64_t step) const {
    return eval_every > 0 && step % eval_every == 0 && step < max_steps;
  }
  bool checkpoints_after(int64_t step) const {
    return checkpoint_every > 0 && step % checkpoint_every == 0 && step < max_steps;
  }
  bool out_of_time(double elapsed_seconds) const {
    return max_minutes > 0 && elapsed_seconds > max_minutes * 60;
  }
};

}  // namespace packbert::train
