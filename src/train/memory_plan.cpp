#include "train/memory_plan.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "error.h"
#include "kernels/attention_layout.h"
#include "model/params.h"
#include "model/sparse.h"
#include "train/pipeline.h"

namespace packbert::train {

namespace {

// The process without the model: code and libraries, OpenMP thread stacks, oneDNN's kernels,
// batch buffers. Measured as the peak RSS of a tiny-model run (docs/BENCHMARKS.md).
constexpr size_t kRuntimeBytes = 64ull << 20;

// Forward FLOPs of one step (matmuls only), and those a policy re-runs in backward.
struct Flops {
  double forward = 0, recompute = 0;
};

Flops step_flops(const model::ParamLayout& layout, const model::StepShape& s,
                 const model::Recompute& p) {
  const model::BertConfig& c = layout.config();
  const model::Heads& h = layout.heads();
  const double T = static_cast<double>(s.tokens), C = c.hidden_size;
  const double n = static_cast<double>(s.sequences), M = static_cast<double>(s.masked);
  const double attn_scores = 2.0 * static_cast<double>(s.attention) * C;  // Q Kᵀ, all heads
  const double weights = static_cast<double>(model::layer_linear_numel(layout));
  const double layer = 2 * T * weights + 2 * attn_scores;
  const double L = layout.stage_config().num_hidden_layers;  // (a stage's layers)
  Flops f;
  f.forward = L * layer;
  if (layout.has_heads()) {
    f.forward += 2 * n * C * C;
    if (h.pretraining) f.forward += 2 * M * C * (C + c.vocab_size) + 2 * n * C * 2;
    if (h.classifier) f.forward += 2 * n * C * c.num_labels;
    if (h.span) f.forward += 2 * T * C * 2;
  } else if (layout.forms_decoder_grad()) {
    // A pipeline's first stage forms the MLM decoder's logits again for the tied word table's
    // weight gradient (BertModel::hand_decoder_to_first_stage): the decoder's forward here too,
    // and of its backward the weight's product here, the input's on the last stage.
    f.forward += 2 * M * C * c.vocab_size;
  }
  if (p.every > 0) {
    f.recompute = L * layer;
  } else {
    if (p.attention) f.recompute += L * attn_scores;
    if (p.residual) f.recompute += L * 2 * T * C * C;
  }
  return f;
}

}  // namespace

model::StepShape uniform_shape(int64_t tokens, int64_t sequences, int threads, int local_window) {
  model::StepShape s;
  sequences = std::max<int64_t>(1, std::min(sequences, tokens));
  const int64_t len = (tokens + sequences - 1) / sequences;
  s.tokens = tokens;
  s.sequences = sequences;
  s.masked = static_cast<int64_t>(std::llround(0.15 * static_cast<double>(tokens)));
  s.attention = 0;
  for (int64_t i = 0, left = tokens; i < sequences; ++i) {
    const int64_t L = std::min(len, left - (sequences - 1 - i));  // every sequence >= 1 token
    s.attention += L * L;
    s.attention_local += L * (local_window ? kernels::attention_band(L, local_window) : L);
    left -= L;
  }
  s.max_len = len;
  s.threads = threads;
  return s;
}

StepPlan plan_step(const PlanRequest& r, const model::Recompute& policy) {
  StepPlan p;
  p.policy = policy;
  const model::ParamLayout layout(r.config, r.heads, r.sparsity, r.stage);
  const size_t n = layout.total();
  p.params_bytes = p.grads_bytes = n * sizeof(float);
  // The two moments (LAMB rebuilds its update direction from them: no buffer), and LAMB's two
  // squared norms per tensor.
  const size_t lamb =
      r.optimizer == OptimizerKind::lamb ? 2 * layout.tensors().size() * sizeof(double) : 0;
  p.optimizer_bytes = 2 * n * sizeof(float) + lamb;
  // Under a 16-bit precision the weights also have their 16-bit copy; 16-bit masters are that
  // copy, with the tensors also read in fp32 beside it, and 16-bit moments.
  const size_t copy = kernels::traits(model::storage_dtype(r.precision)).bytes;
  if (model::is_16bit(r.precision)) p.params_bytes += n * copy;
  if (model::is_16bit(r.masters)) {
    const size_t master = kernels::traits(model::masters_dtype(r.masters)).bytes;
    p.params_bytes = n * master + model::fp32_kept_arena(layout).total * sizeof(float);
    p.optimizer_bytes = 2 * n * master + lamb;
  }
  // A sparse weight's pattern: each slot's block row and column, and the two indexes over them
  // (slot, and the other coordinate, per entry), plus their start arrays.
  if (r.sparsity.on()) {
    size_t blocks = 0, starts = 0;
    for (const model::TensorSpec& t : layout.tensors())
      if (t.block) blocks += static_cast<size_t>(t.kept_blocks);
    const int B = r.sparsity.block, C = r.config.hidden_size, I = r.config.intermediate_size;
    starts = static_cast<size_t>(r.config.num_hidden_layers) *
             ((3 * C + C + I + C) / B + (C + C + C + I) / B + 8);
    p.params_bytes += (6 * blocks + starts) * sizeof(int32_t);
  }
  model::StepShape shape = r.shape;
  model::size_kernel_scratch(shape, layout, kernels::backend(r.backend));
  // A stage's workspace: its own layers, the heads' records on the last stage only; one
  // workspace a forward in flight (BertModel's passes).
  p.records = model::workspace_records(layout.stage_config(), layout.workspace_heads(), policy,
                                       shape, r.precision);
  for (const model::RecordSize& rec : p.records)
    (rec.storage == model::Storage::activation ? p.activation_bytes : p.workspace_bytes) +=
        rec.bytes() * static_cast<size_t>(r.in_flight);
  p.runtime_bytes = kRuntimeBytes;
  p.total_bytes = p.state_bytes() + p.activation_bytes + p.workspace_bytes + p.runtime_bytes;
  const Flops f = step_flops(layout, r.shape, policy);
  p.flops_per_step = 3 * f.forward + f.recompute;
  return p;
}

PipelinePlan plan_pipeline(const PlanRequest& request, const model::Recompute& policy,
                           const std::vector<model::Stage>& stages, int micro_batches) {
  PipelinePlan out;
  out.stages = stages;
  out.micro_batches = micro_batches;
  const int P = static_cast<int>(stages.size());
  for (int s = 0; s < P; ++s) {
    PlanRequest r = request;
    r.stage = stages[static_cast<size_t>(s)];
    r.in_flight = forwards_in_flight(P, s, micro_batches);
    out.plans.push_back(plan_step(r, policy));
    const model::ParamLayout layout(r.config, r.heads, r.sparsity, r.stage);
    out.forward_flops.push_back(step_flops(layout, r.shape, model::Recompute{}).forward);
  }
  out.bubble = bubble_fraction(P, micro_batches);
  return out;
}

std::vector<model::Stage> balance_stages(const PlanRequest& request, int stages) {
  const int L = request.config.num_hidden_layers;
  if (stages < 1 || stages > L)
    throw InputError("`pipeline_stages` " + std::to_string(stages) + ": expected 1 to the " +
                     std::to_string(L) + " layers");
  // cost[a][b]: the forward FLOPs and parameters of a stage of layers [a, b) (a stage's cost
  // depends on where it ends: the model's last stage has the heads).
  using Cost = std::pair<double, double>;
  const Cost none{1e300, 1e300};
  std::vector<std::vector<Cost>> cost(static_cast<size_t>(L),
                                      std::vector<Cost>(static_cast<size_t>(L) + 1, none));
  for (int a = 0; a < L; ++a)
    for (int b = a + 1; b <= L; ++b) {
      const model::ParamLayout layout(request.config, request.heads, request.sparsity, {a, b});
      cost[a][b] = {step_flops(layout, request.shape, model::Recompute{}).forward,
                    static_cast<double>(layout.total())};
    }
  // best[k][b]: the least (largest stage FLOPs, largest stage parameters) over the first b
  // layers in k stages, and the cut before the last of them.
  std::vector<std::vector<Cost>> best(static_cast<size_t>(stages) + 1,
                                      std::vector<Cost>(static_cast<size_t>(L) + 1, none));
  std::vector<std::vector<int>> cut(best.size(), std::vector<int>(static_cast<size_t>(L) + 1, 0));
  best[0][0] = {0, 0};
  for (int k = 1; k <= stages; ++k)
    for (int b = k; b <= L; ++b)
      for (int a = k - 1; a < b; ++a) {
        if (best[k - 1][a] == none) continue;
        const Cost here = cost[a][b], before = best[k - 1][a];
        const Cost c{std::max(before.first, here.first), std::max(before.second, here.second)};
        if (c < best[k][b]) best[k][b] = c, cut[k][b] = a;
      }
  std::vector<model::Stage> out(static_cast<size_t>(stages));
  for (int k = stages, b = L; k > 0; --k) {
    out[static_cast<size_t>(k - 1)] = model::Stage{cut[k][b], b};
    b = cut[k][b];
  }
  return out;
}

std::vector<model::Stage> stages_of_layers(const std::vector<int>& layers, int model_layers,
                                           const std::string& flag) {
  std::vector<model::Stage> out;
  int first = 0;
  for (int n : layers) {
    if (n < 1) throw InputError(flag + ": every stage needs at least one layer");
    out.push_back({first, first + n});
    first += n;
  }
  if (first != model_layers)
    throw InputError(flag + ": the stages' layers sum to " + std::to_string(first) + ", not the " +
                     "model's " + std::to_string(model_layers));
  return out;
}

std::vector<model::Recompute> auto_candidates() {
  std::vector<model::Recompute> out;
  for (const char* name :
       {"none", "gelu", "gelu,ln", "gelu,ln,residual", "attention", "gelu,ln,attention",
        "gelu,ln,residual,attention", "layer", "layer,gelu,ln,residual,attention"})
    out.push_back(model::parse_recompute(name));
  return out;
}

std::optional<StepPlan> choose_policy(const PlanRequest& request, double limit) {
  for (const model::Recompute& p : auto_candidates()) {
    StepPlan plan = plan_step(request, p);
    if (static_cast<double>(plan.total_bytes) <= limit) return plan;
  }
  return std::nullopt;
}

int64_t max_tokens_that_fit(const PlanRequest& request, const model::Recompute& policy,
                            double limit) {
  const double per_seq = static_cast<double>(request.shape.tokens) /
                         static_cast<double>(std::max<int64_t>(1, request.shape.sequences));
  auto fits = [&](int64_t tokens) {
    PlanRequest r = request;
    const int64_t seqs = std::max<int64_t>(1, std::llround(static_cast<double>(tokens) / per_seq));
    r.shape = uniform_shape(tokens, seqs, request.shape.threads, request.config.local_window());
    return static_cast<double>(plan_step(r, policy).total_bytes) <= limit;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (fits(hi) && hi < (int64_t{1} << 40)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

double available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 0;
}

double parse_bytes(const std::string& text, const std::string& flag) {
  auto bad = [&] {
    return InputError(flag + " " + text +
                      ": expected a size such as 20G, 512M, 1.5GiB or a number of bytes");
  };
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  double scale = 1;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "K")
    scale = 1024.0;
  else if (unit == "M")
    scale = 1024.0 * 1024;
  else if (unit == "G")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    throw bad();
  if (!std::isfinite(v) || v <= 0) throw bad();
  return v * scale;
}

std::string format_bytes(double bytes) {
  char buf[32];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024));
  return buf;
}

model::Recompute check_step_fits(const PlanRequest& request, const model::Recompute& policy,
                                 std::optional<double> limit) {
  const double available = limit.value_or(available_memory());
  const std::string where = limit ? "the `memory_limit` of " : "the available memory of ";
  const StepPlan fixed = plan_step(request, model::Recompute{});
  if (static_cast<double>(fixed.state_bytes() + fixed.runtime_bytes) > available)
    throw InputError("the parameters, gradients and optimizer state alone need " +
                     format_bytes(static_cast<double>(fixed.state_bytes())) + ", more than " +
                     where + format_bytes(available));
  if (policy.automatic) {
    std::optional<StepPlan> p = choose_policy(request, available);
    if (!p)
      throw InputError("no recompute policy fits a step of " +
                       std::to_string(request.shape.tokens) + " tokens in " + where +
                       format_bytes(available) + "; use fewer `rows_per_batch`");
    return p->policy;
  }
  const StepPlan p = plan_step(request, policy);
  if (static_cast<double>(p.total_bytes) > available)
    throw InputError("a step of " + std::to_string(request.shape.tokens) +
                     " tokens with `recompute` " + policy.name() + " needs " +
                     format_bytes(static_cast<double>(p.total_bytes)) + ", more than " + where +
                     format_bytes(available) + " (packbert plan shows what fits; try " +
                     "`recompute` auto)");
  return policy;
}

}  // namespace packbert::train
