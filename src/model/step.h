// What one training or evaluation step is asked to do (StepOptions) and what it reports
// (Outputs): the types the model's step functions share (model/bert.h, model/heads.h).
#pragma once

#include <cstdint>

#include "model/workspace.h"

namespace packbert::model {

struct StepOptions {
  bool training = false;  // dropout on (with config's probabilities) when true
  uint64_t seed = 0;      // dropout stream seed
  uint64_t step = 0;      // dropout stream step: masks differ per step, repeat per (seed, step)
  Recompute recompute;    // what backward rebuilds instead of keeping (never `auto` here)
  Precision precision = Precision::fp32;  // 16-bit: f32 models only
  // Backward starts from the losses times this (loss scaling): every gradient backward writes is
  // scaled by it too. The losses forward reports are not.
  double loss_scale = 1;
};

// Loss conventions (docs/FORMATS.md): MLM = mean cross-entropy over the batch's masked tokens;
// NSP = mean over sequences with an NSP label; classification = mean over sequences; span =
// mean over sequences of (start CE + end CE) / 2. The total is the sum of the active ones. All
// are the same whether sequences arrive packed or one per row.
struct Outputs {
  double mlm_loss = 0, nsp_loss = 0, cls_loss = 0, span_loss = 0;
  int64_t mlm_count = 0, mlm_correct = 0, nsp_count = 0, nsp_correct = 0;
  int64_t cls_count = 0, cls_correct = 0, span_count = 0;
  double loss() const { return mlm_loss + nsp_loss + cls_loss + span_loss; }
};

}  // namespace packbert::model
