// The training step of packbert's one loop (train/loop.h: forward, backward, gradient
// all-reduce or ZeRO-1 reduce-scatter, clipping, LAMB) on a whole batch of given sequence lengths,
// packed into rows of --max-seq-len, run as one process or under mpirun (each rank computes its
// share of the rows). Rank 0 prints one JSON line: real tokens/s of the whole step, the step's
// median seconds, the exposed communication (waiting on collectives after backward) and the
// optimizer state each rank holds. bench/ab/dist_bench.py runs the configurations side by side.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_batch.h"
#include "cli/flags.h"
#include "dist/comm.h"
#include "error.h"
#include "kernels/cpu_features.h"
#include "kernels/ops.h"
#include "model/bert.h"
#include "stopwatch.h"
#include "train/loop.h"

using namespace packbert;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dist_step_bench: packbert's training step, one process or under mpirun"};
  std::string lengths_text, precision_text = "fp32";
  int max_len = 512, steps = 3, warmup = 1, zero = 0;
  app.add_option("--lengths", lengths_text, "Comma-separated sequence lengths of the whole step");
  std::string allreduce;
  app.add_option("--allreduce", allreduce,
                 "Instead of a step: time the gradient all-reduce (start + wait, in place, sum) of "
                 "these numbers of floats, one JSON line each (median of 7)");
  model::ShapeRequest shape;
  shape.preset = "base";
  cli::shape_flags(&app, shape, "Model preset: tiny|mini|small|medium|base|large");
  app.add_option("--max-seq-len", max_len)->capture_default_str();
  app.add_option("--steps", steps, "Timed steps")->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  app.add_option("--zero", zero, "1: optimizer state sharded across the processes")
      ->capture_default_str();
  app.add_option("--precision", precision_text, "fp32 or bf16")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  dist::Comm& comm = dist::Comm::world();
  if (!allreduce.empty()) {
    std::stringstream ss(allreduce);
    for (std::string tok; std::getline(ss, tok, ',');) {
      const size_t n = std::stoull(tok);
      std::vector<float> x(n, 1.0f);
      std::vector<double> t;
      for (int r = 0; r < 10; ++r) {
        double t0 = now_seconds();
        comm.start_allreduce(x.data(), n);
        comm.wait_all();
        double dt = now_seconds() - t0;
        comm.allreduce_max(&dt, 1);
        if (r >= 3) t.push_back(dt);
      }
      if (comm.root())
        std::cout << nlohmann::json{{"processes", comm.size()},
                                    {"bytes", n * sizeof(float)},
                                    {"seconds", median(t)}}
                         .dump()
                  << std::endl;
    }
    dist::Comm::finalize();
    return 0;
  }
  if (lengths_text.empty()) {
    std::cerr << "dist_step_bench: error: --lengths (or --allreduce) is required\n";
    return 2;
  }
  int code = 0;
  try {
    std::vector<int> lengths;
    std::stringstream ss(lengths_text);
    for (std::string tok; std::getline(ss, tok, ',');) lengths.push_back(std::stoi(tok));
    model::BertConfig c = model::resolve_shape(shape);
    c.max_position_embeddings = std::max(512, max_len);
    const model::PackedBatch whole = bench::bench_batch(lengths, max_len, c.vocab_size);
    model::BertModel m(c, model::Heads{});
    model::init_params(m.layout(), m.params().data(), 1);
    train::LoopOptions lo;
    lo.zero = zero;
    lo.precision = model::parse_precision(precision_text);
    lo.lr = 1e-4;
    train::Stepper stepper(m, lo, lo.optimizer, 1, {}, comm);
    std::vector<double> times, comm_s, imbalance;
    int64_t tokens = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      const double t0 = now_seconds();
      const train::StepResult r = stepper.step(
          s, 1000, [&] { return whole; }, "");
      double dt = now_seconds() - t0;
      comm.allreduce_max(&dt, 1);  // the step ends when its slowest rank does
      if (s < warmup) continue;
      times.push_back(dt);
      comm_s.push_back(r.comm_seconds);
      imbalance.push_back(r.imbalance);
      tokens = r.real_tokens;
    }
    double state = 2.0 * sizeof(float) * static_cast<double>(stepper.optimizer().m().size());
    comm.allreduce_max(&state, 1);  // the most any rank holds
    const double t = median(times);
    if (comm.root())
      std::cout << nlohmann::json{{"processes", comm.size()},
                                  {"threads", omp_get_max_threads()},
                                  {"zero", zero},
                                  {"precision", precision_text},
                                  {"rows", whole.B},
                                  {"real_tokens", tokens},
                                  {"step_seconds", t},
                                  {"real_tokens_per_s", static_cast<double>(tokens) / t},
                                  {"comm_seconds", median(comm_s)},
                                  {"comm_share", median(comm_s) / t},
                                  {"imbalance", median(imbalance)},
                                  {"optimizer_state_mib", state / 1048576.0},
                                  {"optimizer_state_unsharded_mib",
                                   2.0 * sizeof(float) * static_cast<double>(m.layout().total()) /
                                       1048576.0},
                                  {"cpu", kernels::cpu_features().model},
                                  {"isa", kernels::cpu_features().isa()},
                                  {"kernel_isa", kernels::kernel_isa()}}
                       .dump()
                << std::endl;
  } catch (const InputError& e) {
    std::cerr << "dist_step_bench: error: " << e.what() << '\n';
    code = 2;
  }
  dist::Comm::finalize();
  return code;
}
