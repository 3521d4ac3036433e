// `packbert plan`: what one training step holds and costs for a model and micro-batch, under
// each recompute policy, against a memory limit: the numbers come from the same record
// declarations the engine allocates from (model/workspace.cpp), not from a second formula.
#include <omp.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/table.h"
#include "error.h"
#include "model/config.h"
#include "train/memory_plan.h"
#include "train/pipeline.h"

namespace packbert::cli {

namespace {

// plan names its model: there is no default preset.
model::ShapeRequest no_default_preset() {
  model::ShapeRequest s;
  s.preset.clear();
  return s;
}

struct PlanArgs {
  model::ShapeRequest shape = no_default_preset();
  std::string optimizer = "lamb", head = "pretraining";
  int64_t tokens = 0, sequences = 0;
  model::Recompute recompute;
  bool recompute_given = false;
  std::optional<double> memory_limit;
  model::Precision precision = model::Precision::fp32;
  train::Masters masters = train::Masters::fp32;
  train::SparseOptions sparse;
  int pipeline_stages = 1, accumulation = 1;
  std::vector<int> stage_layers;
  bool json = false;
};

std::string gib(size_t bytes) {
  return fixed(static_cast<double>(bytes) / (1024.0 * 1024 * 1024), 2);
}

// The request `plan` answers, from its flags (each contradiction refused in one line).
train::PlanRequest request_of(const PlanArgs& a) {
  train::PlanRequest r;
  r.config = model::resolve_shape(a.shape);
  if (a.head == "classify")
    r.heads = model::Heads{false, true, false};
  else if (a.head == "squad")
    r.heads = model::Heads{false, false, true};
  else if (a.head != "pretraining")
    throw InputError("--head: expected pretraining|classify|squad");
  r.optimizer = train::parse_optimizer(a.optimizer, "--optimizer");
  if (a.sequences > a.tokens) throw InputError("--sequences cannot exceed --tokens");
  if (a.tokens / a.sequences > r.config.max_position_embeddings)
    throw InputError("--tokens / --sequences = " + std::to_string(a.tokens / a.sequences) +
                     " tokens per sequence, more than the model's " +
                     std::to_string(r.config.max_position_embeddings) + " positions");
  r.shape =
      train::uniform_shape(a.tokens, a.sequences, omp_get_max_threads(), r.config.local_window());
  r.precision = a.precision;
  r.masters = a.masters;
  r.sparsity = a.sparse.sparsity;
  if (a.masters != train::Masters::fp32 && a.precision != model::Precision::bf16)
    throw InputError("--master-weights " + std::string(train::masters_name(a.masters)) +
                     " needs --precision bf16");
  if (a.masters != train::Masters::fp32 && r.sparsity.on())
    throw InputError(
        "--sparsity needs fp32 master weights (the block-sparse kernels read their values in "
        "fp32): drop --master-weights");
  return r;
}

// The policies the table compares: auto's candidates, every:4, and the one asked for.
std::vector<model::Recompute> policies_of(const PlanArgs& a) {
  std::vector<model::Recompute> policies = train::auto_candidates();
  policies.push_back(model::parse_recompute("every:4"));
  if (a.recompute_given && !a.recompute.automatic &&
      std::find(policies.begin(), policies.end(), a.recompute) == policies.end())
    policies.push_back(a.recompute);
  return policies;
}

nlohmann::json summary_json(const PlanArgs& a, const train::PlanRequest& r,
                            const train::StepPlan& asked,
                            const std::optional<train::StepPlan>& chosen, double limit) {
  return {{"model", a.shape.name()},
          {"tokens", a.tokens},
          {"sequences", a.sequences},
          {"optimizer", a.optimizer},
          {"threads", r.shape.threads},
          {"memory_limit_bytes", limit},
          {"recompute", asked.policy.name()},
          {"precision", model::precision_name(a.precision)},
          {"master_weights", train::masters_name(a.masters)},
          {"sparsity", a.sparse.sparsity.sparsity},
          {"block", a.sparse.sparsity.block},
          {"params_bytes", asked.params_bytes},
          {"grads_bytes", asked.grads_bytes},
          {"optimizer_bytes", asked.optimizer_bytes},
          {"activation_bytes", asked.activation_bytes},
          {"workspace_bytes", asked.workspace_bytes},
          {"runtime_bytes", asked.runtime_bytes},
          {"total_bytes", asked.total_bytes},
          {"flops_per_step", asked.flops_per_step},
          {"fits", static_cast<double>(asked.total_bytes) <= limit},
          {"auto", chosen ? nlohmann::json(chosen->policy.name()) : nullptr}};
}

// Each policy's step: a row of the table and an entry of out["policies"].
Table policy_table(const train::PlanRequest& r, const std::vector<model::Recompute>& policies,
                   double limit, nlohmann::json& out) {
  Table t({"recompute", "activations GiB", "workspace GiB", "total GiB", "fits",
           "max tokens that fit", "TFLOP/step"});
  for (const model::Recompute& p : policies) {
    const train::StepPlan s = train::plan_step(r, p);
    const bool fits = static_cast<double>(s.total_bytes) <= limit;
    const int64_t most = train::max_tokens_that_fit(r, p, limit);
    out["policies"].push_back({{"recompute", p.name()},
                               {"activation_bytes", s.activation_bytes},
                               {"workspace_bytes", s.workspace_bytes},
                               {"total_bytes", s.total_bytes},
                               {"flops_per_step", s.flops_per_step},
                               {"fits", fits},
                               {"max_tokens", most}});
    t.add_row({p.name(), gib(s.activation_bytes), gib(s.workspace_bytes), gib(s.total_bytes),
               fits ? "yes" : "no", with_commas(most), fixed(s.flops_per_step * 1e-12, 2)});
  }
  return t;
}

// Pipeline stages: each stage's step under 1F1B with --accumulation micro-batches (none without
// --pipeline-stages or --stage-layers), into out["pipeline"] too.
std::optional<train::PipelinePlan> pipeline_of(const PlanArgs& a, const train::PlanRequest& r,
                                               const model::Recompute& policy,
                                               nlohmann::json& out) {
  if (a.pipeline_stages <= 1 && a.stage_layers.empty()) return std::nullopt;
  if (r.sparsity.on()) throw InputError("--pipeline-stages: block-sparse stages are not built");
  const std::vector<model::Stage> stages =
      a.stage_layers.empty()
          ? train::balance_stages(r, a.pipeline_stages)
          : train::stages_of_layers(a.stage_layers, r.config.num_hidden_layers, "--stage-layers");
  if (!a.stage_layers.empty() && a.pipeline_stages > 1 &&
      static_cast<int>(stages.size()) != a.pipeline_stages)
    throw InputError("--stage-layers names " + std::to_string(stages.size()) +
                     " stages, --pipeline-stages " + std::to_string(a.pipeline_stages));
  train::PipelinePlan pipeline = train::plan_pipeline(r, policy, stages, a.accumulation);
  nlohmann::json& pj = out["pipeline"];
  pj["micro_batches"] = a.accumulation;
  pj["bubble"] = pipeline.bubble;
  for (size_t s = 0; s < stages.size(); ++s) {
    const train::StepPlan& p = pipeline.plans[s];
    pj["stages"].push_back(
        {{"first_layer", stages[s].first},
         {"end_layer", stages[s].end},
         {"forwards_in_flight", train::forwards_in_flight(static_cast<int>(stages.size()),
                                                          static_cast<int>(s), a.accumulation)},
         {"params_bytes", p.params_bytes},
         {"grads_bytes", p.grads_bytes},
         {"optimizer_bytes", p.optimizer_bytes},
         {"activation_bytes", p.activation_bytes},
         {"workspace_bytes", p.workspace_bytes},
         {"total_bytes", p.total_bytes},
         {"forward_flops_per_micro_batch", pipeline.forward_flops[s]}});
  }
  return pipeline;
}

void print_header(const PlanArgs& a, const train::PlanRequest& r, const train::StepPlan& asked,
                  const std::string& limit_text) {
  std::cout << a.shape.name() << ": " << with_commas(a.tokens) << " tokens in " << a.sequences
            << " sequences per micro-batch, " << a.optimizer << ", "
            << model::precision_name(a.precision)
            << (r.sparsity.on() ? ", block-sparse " + fixed(r.sparsity.sparsity, 3) + " (" +
                                      std::to_string(r.sparsity.block) + "x" +
                                      std::to_string(r.sparsity.block) + " blocks)"
                                : std::string())
            << ", " << r.shape.threads << " threads; limit " << limit_text << "\n"
            << "parameters " << gib(asked.params_bytes)
            << (a.masters != train::Masters::fp32       ? " GiB (bf16 masters)"
                : a.precision == model::Precision::bf16 ? " GiB (with their bf16 copy)"
                : a.precision == model::Precision::fp16 ? " GiB (with their fp16 copy)"
                                                        : " GiB")
            << ", gradients " << gib(asked.grads_bytes) << " GiB, optimizer state "
            << gib(asked.optimizer_bytes) << " GiB, runtime " << gib(asked.runtime_bytes)
            << " GiB (in every total)\n\n";
}

// The asked policy's records (--recompute given).
void print_records(const train::StepPlan& asked, double limit) {
  std::cout << "\n--recompute " << asked.policy.name() << ": " << gib(asked.total_bytes)
            << " GiB in all, "
            << (static_cast<double>(asked.total_bytes) <= limit ? "fits" : "does NOT fit")
            << "; its records:\n";
  Table rt({"record", "kept/scratch", "copies", "MiB"});
  for (const model::RecordSize& rec : asked.records)
    rt.add_row({rec.name, rec.storage == model::Storage::activation ? "kept" : "scratch",
                std::to_string(rec.copies),
                fixed(static_cast<double>(rec.bytes()) / 1048576.0, 1)});
  rt.print(std::cout);
}

void print_pipeline(const train::PipelinePlan& pipeline, const train::PlanRequest& r,
                    const train::StepPlan& asked, int accumulation) {
  const size_t P = pipeline.stages.size();
  std::cout << "\n"
            << P << " pipeline stages, --recompute " << asked.policy.name() << ", " << accumulation
            << " micro-batches a step (1F1B): bubble (P - 1) / (M + P - 1) = "
            << fixed(pipeline.bubble, 3) << " of the step\n";
  Table pt({"stage", "layers", "in flight", "params GiB", "grads GiB", "optimizer GiB",
            "activations GiB", "workspace GiB", "total GiB", "GFLOP/micro-batch"});
  for (size_t s = 0; s < P; ++s) {
    const train::StepPlan& p = pipeline.plans[s];
    const model::Stage& st = pipeline.stages[s];
    std::string held = std::to_string(st.first) + "-" + std::to_string(st.end - 1);
    if (st.first == 0) held += " + embeddings";
    if (st.end == r.config.num_hidden_layers) held += " + heads";
    pt.add_row({std::to_string(s), held,
                std::to_string(train::forwards_in_flight(static_cast<int>(P), static_cast<int>(s),
                                                         accumulation)),
                gib(p.params_bytes), gib(p.grads_bytes), gib(p.optimizer_bytes),
                gib(p.activation_bytes), gib(p.workspace_bytes), gib(p.total_bytes),
                fixed(pipeline.forward_flops[s] * 1e-9, 1)});
  }
  pt.print(std::cout);
}

void run_plan(const PlanArgs& a) {
  const train::PlanRequest r = request_of(a);
  const double limit = a.memory_limit.value_or(train::available_memory());
  const std::string limit_text =
      train::format_bytes(limit) + (a.memory_limit ? " (--memory-limit)" : " (available now)");
  const train::StepPlan fixed_part = train::plan_step(r, model::Recompute{});
  if (static_cast<double>(fixed_part.state_bytes()) > limit)
    throw InputError("--memory-limit " + train::format_bytes(limit) +
                     " is smaller than the parameters, gradients and optimizer state alone (" +
                     train::format_bytes(static_cast<double>(fixed_part.state_bytes())) + ")");
  const std::vector<model::Recompute> policies = policies_of(a);
  const std::optional<train::StepPlan> chosen = train::choose_policy(r, limit);
  const train::StepPlan asked = a.recompute.automatic
                                    ? (chosen ? *chosen : train::plan_step(r, policies.back()))
                                    : train::plan_step(r, a.recompute);
  nlohmann::json out = summary_json(a, r, asked, chosen, limit);
  const Table t = policy_table(r, policies, limit, out);
  const std::optional<train::PipelinePlan> pipeline = pipeline_of(a, r, asked.policy, out);
  if (a.json) {
    std::cout << out.dump() << '\n';
    return;
  }
  print_header(a, r, asked, limit_text);
  t.print(std::cout);
  std::cout << "\nauto picks: "
            << (chosen ? chosen->policy.name() : std::string("nothing (no policy fits)")) << '\n';
  if (a.recompute_given) print_records(asked, limit);
  if (pipeline) print_pipeline(*pipeline, r, asked, a.accumulation);
}

}  // namespace

void register_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "What a training step holds and costs under each recompute policy, and what fits");
  shape_flags(cmd, a->shape, "Model shape: tiny|mini|small|medium|base|large");
  number(cmd, "--tokens", a->tokens, "Real tokens per micro-batch", 1, 1e9)->required();
  number(cmd, "--sequences", a->sequences, "Sequences per micro-batch (equal lengths)", 1, 1e9)
      ->required();
  cmd->add_option("--optimizer", a->optimizer, "lamb | adamw")->capture_default_str();
  cmd->add_option("--head", a->head, "pretraining (MLM + NSP) | classify | squad")
      ->capture_default_str();
  recompute_flags(cmd, a->recompute, &a->memory_limit);
  precision_flag(cmd, a->precision, false);
  master_weights_flag(cmd, a->masters);
  sparse_flags(cmd, a->sparse, false);
  number(cmd, "--pipeline-stages", a->pipeline_stages,
         "Pipeline stages: each stage's bytes and FLOPs under the 1F1B schedule, the layers "
         "balanced by FLOPs unless --stage-layers gives them",
         1, 1024)
      ->capture_default_str();
  cmd->add_option("--stage-layers", a->stage_layers,
                  "Encoder layers of each pipeline stage, first to last (e.g. 5,7)")
      ->delimiter(',');
  number(cmd, "--accumulation", a->accumulation,
         "Micro-batches a step (a pipeline's M: its bubble and forwards in flight)", 1, 1 << 20)
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "One JSON object instead of the tables");
  cmd->callback([a, cmd] {
    a->recompute_given = cmd->count("--recompute") > 0;
    run_plan(*a);
  });
}

}  // namespace packbert::cli
