// One pipeline stage's training step in a process of its own, for its memory: the stage's model
// (model::Stage), the forwards its 1F1B schedule keeps in flight (one pass each), their
// backwards and the optimizer's update, with the neighbours' tensors made up (the stage below's
// output and the stage above's gradient: random, of the shapes a pipeline hands over). Prints
// one JSON line with the plan's bytes for that stage (`plan --pipeline-stages`) beside the
// process's peak resident set, which is what the plan predicts; `--whole` runs the whole model
// the same way (M micro-batches accumulated) for the comparison. Each stage is run by its own
// process: a peak RSS is per process.
//
//   build/stage_memory_bench --preset large --lengths 512,512 --stage-layers 12,12 --stage 0
//       --accumulation 8
#include <omp.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench_batch.h"
#include "cli/flags.h"
#include "error.h"
#include "kernels/cpu_features.h"
#include "model/bert.h"
#include "stopwatch.h"
#include "train/memory_plan.h"
#include "train/optimizer.h"
#include "train/pipeline.h"

using namespace packbert;

namespace {

double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

// n values ~ N(0, scale) in dtype t, as the bytes of a buffer that stays alive.
kernels::Buffer random_buffer(kernels::DType t, int64_t rows, int64_t cols, float scale) {
  kernels::Buffer b(kernels::backend(kernels::BackendKind::cpu).device(), t, rows * cols);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, scale);
  const kernels::View v = b.view();
  for (int64_t i = 0; i < rows * cols; ++i) v.put(i, d(rng));
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One pipeline stage's step in its own process: peak memory against the plan"};
  model::ShapeRequest shape;
  std::string lengths_text = "512,512", recompute = "none", precision_text = "fp32";
  std::vector<int> stage_layers;
  int stage = 0, accumulation = 8, max_len = 512;
  bool whole = false;
  cli::shape_flags(&app, shape, "Model shape: tiny|mini|small|medium|base|large");
  app.add_option("--lengths", lengths_text, "Comma-separated sequence lengths of a micro-batch")
      ->capture_default_str();
  app.add_option("--stage-layers", stage_layers, "Encoder layers of each stage (e.g. 12,12)")
      ->delimiter(',');
  app.add_option("--stage", stage, "Which stage this process runs (from 0)")->capture_default_str();
  app.add_option("--accumulation", accumulation, "Micro-batches a step (M)")->capture_default_str();
  app.add_option("--recompute", recompute)->capture_default_str();
  app.add_option("--precision", precision_text)->capture_default_str();
  app.add_flag("--whole", whole, "The whole model in one process instead of a stage");
  CLI11_PARSE(app, argc, argv);

  model::BertConfig c;
  model::Recompute policy;
  model::Precision precision = model::Precision::fp32;
  std::vector<model::Stage> stages;
  std::vector<int> lengths;
  train::PlanRequest req;
  try {
    if (shape.preset.empty()) shape.preset = "large";
    c = model::resolve_shape(shape);
    precision = model::parse_precision(precision_text);
    policy = model::parse_recompute(recompute);
    std::stringstream ss(lengths_text);
    for (std::string tok; std::getline(ss, tok, ',');) lengths.push_back(std::stoi(tok));
    stages = whole ? std::vector<model::Stage>{{0, c.num_hidden_layers}}
                   : train::stages_of_layers(stage_layers, c.num_hidden_layers, "--stage-layers");
    if (stage < 0 || stage >= static_cast<int>(stages.size()))
      throw InputError("--stage " + std::to_string(stage) + ": the pipeline has " +
                       std::to_string(stages.size()) + " stages");
    req.config = c;
    req.precision = precision;
    req.shape = bench::shape_of_lengths(lengths, omp_get_max_threads());
  } catch (const std::exception& e) {
    std::cerr << "stage_memory_bench: error: " << e.what() << '\n';
    return 2;
  }
  const int P = static_cast<int>(stages.size());
  const train::PipelinePlan plan = train::plan_pipeline(req, policy, stages, accumulation);
  const train::StepPlan& mine = plan.plans[static_cast<size_t>(stage)];

  const model::PackedBatch b = bench::bench_batch(lengths, max_len, c.vocab_size, false);
  model::BertModel m(c, model::Heads{}, {}, kernels::DType::f32,
                     stages[static_cast<size_t>(stage)]);
  model::init_params(m.layout(), m.params().data(), 1);
  train::Optimizer optimizer(m.layout(), train::OptimizerConfig{});
  const bool first = stage == 0, last = stage == P - 1;
  // The neighbours' tensors: [T, C] as the layers hold them (input) and in fp32 (gradient).
  int64_t T = 0;
  for (int L : lengths) T += L;
  const kernels::DType held = model::storage_dtype(precision);
  const kernels::Buffer input = random_buffer(held, T, c.hidden_size, 1.0f);
  const kernels::Buffer output_grad = random_buffer(kernels::DType::f32, T, c.hidden_size, 1e-3f);
  // The tied decoder across stages, as training runs it: the last stage hands its decoder to the
  // first, which forms the decoder's weight gradient from made-up decoder input and bias.
  const int64_t masked = static_cast<int64_t>(model::token_layout(b, c).mlm_token.size());
  const kernels::Buffer decoder_in = random_buffer(held, masked, c.hidden_size, 1.0f);
  const kernels::Buffer decoder_bias = random_buffer(kernels::DType::f32, 1, c.vocab_size, 1e-2f);
  if (P > 1 && last) m.hand_decoder_to_first_stage();

  const double t0 = now_seconds();
  m.zero_grads();
  for (const train::PipelineAction& a : train::one_f_one_b(P, stage, accumulation)) {
    m.use_pass(a.micro % train::forwards_in_flight(P, stage, accumulation));
    if (!a.backward)
      m.forward(b, {true, 1, static_cast<uint64_t>(a.micro), policy, precision},
                first ? kernels::View() : input.view().shaped(T, c.hidden_size));
    else {
      if (P > 1 && first)
        m.add_decoder_grad({decoder_in.view().shaped(masked, c.hidden_size),
                            decoder_bias.view().shaped(1, c.vocab_size)});
      m.backward({}, {}, last ? kernels::View() : output_grad.view().shaped(T, c.hidden_size));
    }
  }
  train::clip_grad_norm(m.grads().data(), m.grads().size(), 1.0);
  train::apply_update(optimizer, m, 1e-4, precision);
  const double seconds = now_seconds() - t0;

  const model::Stage& st = stages[static_cast<size_t>(stage)];
  const nlohmann::json out = {
      {"cpu", kernels::cpu_features().model},
      {"model", shape.name()},
      {"stage", whole ? -1 : stage},
      {"stages", P},
      {"layers", std::to_string(st.first) + "-" + std::to_string(st.end - 1)},
      {"micro_batches", accumulation},
      {"tokens_per_micro_batch", T},
      {"forwards_in_flight", train::forwards_in_flight(P, stage, accumulation)},
      {"recompute", policy.name()},
      {"precision", model::precision_name(precision)},
      {"plan_state_bytes", mine.params_bytes + mine.grads_bytes + mine.optimizer_bytes},
      {"plan_weights_and_optimizer_bytes", mine.params_bytes + mine.optimizer_bytes},
      {"plan_total_bytes", mine.total_bytes},
      {"engine_state_bytes",
       (m.params().size() + m.grads().size()) * sizeof(float) + optimizer.state_bytes()},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"plan_over_rss", static_cast<double>(mine.total_bytes) / peak_rss_bytes()},
      {"step_seconds", seconds}};
  std::cout << out.dump() << std::endl;
  return 0;
}
