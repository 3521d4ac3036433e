// What a training step holds and costs, from the same declarations the engine allocates from
// (model/workspace.h, model/params.h): parameters, gradients, optimizer state, kept activations
// and scratch, FLOPs; which recompute policy fits a memory limit, and the largest micro-batch
// that does. `packbert plan` prints it; pretrain and finetune check their step against it
// before training starts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/workspace.h"
#include "train/optimizer.h"

namespace packbert::train {

struct StepPlan {
  model::Recompute policy;
  size_t params_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;
  size_t activation_bytes = 0, workspace_bytes = 0;
  size_t runtime_bytes = 0;  // the process itself: code, libraries, threads, batch buffers
  size_t total_bytes = 0;
  // What training holds whatever the batch: parameters, gradients and optimizer state.
  size_t state_bytes() const { return params_bytes + grads_bytes + optimizer_bytes; }
  double flops_per_step = 0;  // forward + backward + what the policy recomputes
  std::vector<model::RecordSize> records;
};

struct PlanRequest {
  model::BertConfig config;
  model::Heads heads;
  OptimizerKind optimizer = OptimizerKind::lamb;
  model::StepShape shape;
  model::Precision precision = model::Precision::fp32;
  Masters masters = Masters::fp32;
  model::Sparsity sparsity;  // block-sparse encoder weights (block 0: dense)
  // A pipeline stage's step (the whole model by default): its tensors, its layers' records, and
  // `in_flight` forwards held at once, each in a model pass with a workspace of its own.
  model::Stage stage;
  int in_flight = 1;
  kernels::BackendKind backend = kernels::BackendKind::cpu;  // whose kernels' scratch is counted
};

StepPlan plan_step(const PlanRequest& request, const model::Recompute& policy);

// A pipeline of request's model (docs/DESIGN.md §7: pipeline stages): each stage's step under
// the 1F1B schedule (train/pipeline.h) with M micro-batches a step, its forward FLOPs per
// micro-batch, and the bubble (P - 1) / (M + P - 1).
struct PipelinePlan {
  std::vector<model::Stage> stages;
  int micro_batches = 1;
  std::vector<StepPlan> plans;
  std::vector<double> forward_flops;
  double bubble = 0;
};
PipelinePlan plan_pipeline(const PlanRequest& request, const model::Recompute& policy,
                           const std::vector<model::Stage>& stages, int micro_batches);
// P stages of contiguous layers that balance the stages' forward FLOPs (the embeddings cost
// none, the pooler and heads of the last stage do), the fewest bytes breaking a tie.
std::vector<model::Stage> balance_stages(const PlanRequest& request, int stages);
// Stages of the given layer counts ("5,7"); InputError naming `flag` unless each is at least 1
// and they sum to the model's layers.
std::vector<model::Stage> stages_of_layers(const std::vector<int>& layers, int model_layers,
                                           const std::string& flag);

// A micro-batch of `tokens` tokens in `sequences` equal-length sequences, 15% of tokens masked.
// local_window: ModernBERT's local layers' window (0: none), for their probabilities' bands.
model::StepShape uniform_shape(int64_t tokens, int64_t sequences, int threads,
                               int local_window = 0);

// The policies `auto` chooses among, cheapest in time first.
std::vector<model::Recompute> auto_candidates();

// The first of auto_candidates() whose step fits `limit` bytes; none if even the last does not.
std::optional<StepPlan> choose_policy(const PlanRequest& request, double limit);

// The largest number of tokens per micro-batch (same tokens per sequence as request.shape) whose
// step fits `limit` under `policy`; 0 if none does.
int64_t max_tokens_that_fit(const PlanRequest& request, const model::Recompute& policy,
                            double limit);

// Memory the system says is available now (/proc/meminfo MemAvailable), in bytes.
double available_memory();

// "20G", "512M", "1.5GiB", "3000000000": bytes. Throws InputError naming `flag` and the text.
double parse_bytes(const std::string& text, const std::string& flag);

// "1.23 GiB" / "456.0 MiB".
std::string format_bytes(double bytes);

// The step of `request` under `policy` (resolving `auto`) against `limit` (unset: available
// memory): the policy to run with, or an InputError naming the predicted and available bytes.
model::Recompute check_step_fits(const PlanRequest& request, const model::Recompute& policy,
                                 std::optional<double> limit);

}  // namespace packbert::train
