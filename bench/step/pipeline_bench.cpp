// Pipeline stages across processes, one stage a rank: each rank builds its stage of the model
// (model::Stage), runs the step's M micro-batches on the 1F1B schedule (train/pipeline.h) and
// hands its neighbours the activations and gradients over MPI (non-blocking sends, blocking
// receives). Prints one JSON line: the step's time, each stage's time waiting on its neighbours
// (the measured bubble) and the predicted (P - 1) / (M + P - 1). With --check every rank also
// runs the whole model in one process on the same micro-batches and compares its stage's
// gradients (and, on the last stage, every micro-batch's loss) bit for bit, the tied word table
// too: the first stage forms its whole gradient in one process's order and sends it to the
// last at the step's end. No optimizer update (the training step's loop, with its update, is
// train::Stepper::run_stage; this one times the schedule alone).
//
//   mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 build/pipeline_bench
//       --preset base --lengths 173,251,512,181 --accumulation 8
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_batch.h"
#include "cli/flags.h"
#include "dist/comm.h"
#include "error.h"
#include "kernels/cpu_features.h"
#include "model/bert.h"
#include "stopwatch.h"
#include "train/memory_plan.h"
#include "train/pipeline.h"

using namespace packbert;

int main(int argc, char** argv) {
  CLI::App app{"Pipeline stages across MPI processes: the 1F1B step and its measured bubble"};
  model::ShapeRequest shape;
  std::string lengths_text = "173,251,512,181", precision_text = "fp32";
  std::vector<int> stage_layers;
  int accumulation = 8, steps = 2, max_len = 512;
  bool check = false;
  cli::shape_flags(&app, shape, "Model shape: tiny|mini|small|medium|base|large");
  app.add_option("--lengths", lengths_text, "Comma-separated sequence lengths of a micro-batch")
      ->capture_default_str();
  app.add_option("--stage-layers", stage_layers, "Layers of each stage (default: balanced)")
      ->delimiter(',');
  app.add_option("--accumulation", accumulation, "Micro-batches a step (M)")->capture_default_str();
  app.add_option("--steps", steps, "Timed steps (after one warm-up)")->capture_default_str();
  app.add_option("--precision", precision_text)->capture_default_str();
  app.add_flag("--check", check, "Compare with the whole model in one process, bit for bit");
  CLI11_PARSE(app, argc, argv);

  dist::Comm& comm = dist::Comm::world();
  const int P = comm.size(), s = comm.rank();
  model::BertConfig c;
  model::Precision precision = model::Precision::fp32;
  std::vector<model::Stage> stages;
  std::vector<int> lengths;
  try {
    dist::fail_together(comm, [&] {
      if (shape.preset.empty() && shape.config.empty()) shape.preset = "base";
      c = model::resolve_shape(shape);
      precision = model::parse_precision(precision_text);
      std::stringstream ss(lengths_text);
      for (std::string tok; std::getline(ss, tok, ',');) lengths.push_back(std::stoi(tok));
      train::PlanRequest req;
      req.config = c;
      int64_t tokens = 0;
      for (int L : lengths) tokens += L;
      req.shape = train::uniform_shape(tokens, static_cast<int64_t>(lengths.size()), 1);
      stages = stage_layers.empty()
                   ? train::balance_stages(req, P)
                   : train::stages_of_layers(stage_layers, c.num_hidden_layers, "--stage-layers");
      if (static_cast<int>(stages.size()) != P)
        throw InputError("--stage-layers names " + std::to_string(stages.size()) + " stages for " +
                         std::to_string(P) + " processes");
    });
  } catch (const std::exception& e) {
    if (comm.root()) std::cerr << "pipeline_bench: error: " << e.what() << '\n';
    dist::Comm::finalize();
    return 2;
  }
  const bool first = s == 0, last = s == P - 1;
  const int M = accumulation, in_flight = train::forwards_in_flight(P, s, M);
  const model::PackedBatch b = bench::bench_batch(lengths, max_len, c.vocab_size, false);
  model::BertModel m(c, model::Heads{}, {}, kernels::DType::f32, stages[static_cast<size_t>(s)]);
  model::init_params(m.layout(), m.params().data(), 1);
  if (P > 1 && last) m.hand_decoder_to_first_stage();

  // The stage's messages to its neighbours: the training step's own (train::StageLinks).
  train::StageLinks links(comm, c.hidden_size, model::storage_dtype(precision));
  const model::TokenLayout tl = model::token_layout(b, c);
  const int64_t T = tl.tokens(), masked = static_cast<int64_t>(tl.mlm_token.size());
  const model::TensorSpec* tied = P > 1 && (first || last) ? m.layout().word_table() : nullptr;
  std::vector<double> losses(static_cast<size_t>(M));

  double step_seconds = 1e300, waited = 0;
  for (int step = 0; step <= steps; ++step) {
    double barrier = 0;
    comm.allreduce_sum(&barrier, 1);  // (the stages start together)
    links.reset_waited();
    const double t0 = now_seconds();
    m.zero_grads();
    const model::StepOptions o{true, 1, 0, model::Recompute{}, precision};
    for (const train::PipelineAction& a : train::one_f_one_b(P, s, M)) {
      const int pass = a.micro % in_flight;
      m.use_pass(pass);
      if (!a.backward) {
        const kernels::View input = first ? kernels::View() : links.receive_input(a.micro, pass, T);
        const model::Outputs out = m.forward(b, o, input, [&] { comm.progress(); });
        if (last && tied) links.send_decoder_input(a.micro, m.decoder_input());
        if (last)
          losses[static_cast<size_t>(a.micro)] = out.loss();
        else
          links.send_output(a.micro, m.stage_output());
      } else {
        // The tied word table: the first stage forms the decoder's share from the last stage's
        // decoder input, before its backward.
        if (tied && first)
          m.add_decoder_grad(links.receive_decoder_input(a.micro, masked, c.vocab_size),
                             [&] { comm.progress(); });
        m.backward(
            {}, [&] { comm.progress(); },
            last ? kernels::View() : links.receive_output_grad(a.micro, T));
        if (!first) links.send_input_grad(a.micro, m.input_grad());
      }
    }
    links.finish();
    // The first stage's whole word-table gradient goes to the last.
    if (tied) links.share_tied(m.grads().data() + tied->offset, tied->numel);
    const double t = now_seconds() - t0;
    if (step > 0 && t < step_seconds) step_seconds = t, waited = links.waited();
  }

  std::string checked = "not asked";
  if (check) {
    model::BertModel whole(c, model::Heads{});
    model::init_params(whole.layout(), whole.params().data(), 1);
    whole.zero_grads();
    bool same = true;
    for (int j = 0; j < M; ++j) {
      const double loss = whole.forward(b, {true, 1, 0, model::Recompute{}, precision}).loss();
      whole.backward();
      if (last && loss != losses[static_cast<size_t>(j)]) same = false;
    }
    for (const model::TensorSpec& t : m.layout().tensors()) {
      const model::TensorSpec& w = *whole.layout().find(t.name);
      if (std::memcmp(m.grads().data() + t.offset, whole.grads().data() + w.offset,
                      t.numel * sizeof(float)) != 0)
        same = false;
    }
    double bad = same ? 0 : 1;
    comm.allreduce_sum(&bad, 1);
    checked = bad == 0 ? "bitwise on every stage (the tied word table on both)"
                       : "DIFFERS on " + std::to_string(static_cast<int>(bad)) + " stages";
  }
  std::vector<double> idle(static_cast<size_t>(P), 0.0), times(static_cast<size_t>(P), 0.0);
  idle[static_cast<size_t>(s)] = waited, times[static_cast<size_t>(s)] = step_seconds;
  comm.allreduce_sum(idle.data(), idle.size());
  comm.allreduce_sum(times.data(), times.size());
  if (comm.root()) {
    nlohmann::json out = {{"cpu", kernels::cpu_features().model},
                          {"model", shape.name()},
                          {"stages", P},
                          {"micro_batches", M},
                          {"tokens_per_micro_batch", T},
                          {"threads", omp_get_max_threads()},
                          {"precision", model::precision_name(precision)},
                          {"predicted_bubble", train::bubble_fraction(P, M)},
                          {"check", checked}};
    double mean = 0;
    for (int k = 0; k < P; ++k) {
      const model::Stage& st = stages[static_cast<size_t>(k)];
      out["stage_layers"].push_back(st.end - st.first);
      out["step_seconds"].push_back(times[static_cast<size_t>(k)]);
      out["waiting_seconds"].push_back(idle[static_cast<size_t>(k)]);
      mean += idle[static_cast<size_t>(k)] / times[static_cast<size_t>(k)] / P;
    }
    out["measured_bubble"] = mean;
    std::cout << out.dump() << std::endl;
  }
  dist::Comm::finalize();
  return 0;
}
