// One packbert training step (forward + backward, no optimizer) on given sequence lengths,
// packed into rows of --max-seq-len (or one per row with --padded). Prints one JSON line:
// real tokens/s, step seconds (median), GEMM share, model FLOP/s and the sgemm rate measured in
// the same process at the same threads. bench/ab/train_step_bench.py runs it side by side with the
// PyTorch peer.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <type_traits>

#include "bench_batch.h"
#include "cli/flags.h"
#include "error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu_features.h"
#include "kernels/ops.h"
#include "model/bert.h"
#include "stopwatch.h"
#include "train/memory_plan.h"
#include "train/optimizer.h"

using namespace packbert;

namespace {

// Peak GEMM rate at BERT-like shapes (2048 x 3072 x 768), this process, these threads, through
// the engine's GEMM seam: operands S = float (oneDNN sgemm) or bf16 (oneDNN's bf16 matmul
// primitive), fp32 output. The best of 5: the peak rate (a stricter yardstick than the median on
// a noisy machine).
template <typename S>
double peak_gflops() {
  const int M = 2048, N = 3072, K = 768;
  auto value = [](float x) {
    if constexpr (std::is_same_v<S, float>)
      return x;
    else
      return kernels::to_bf16(x);
  };
  const std::vector<S> A(static_cast<size_t>(M) * K, value(0.01f)),
      B(static_cast<size_t>(K) * N, value(0.02f));
  std::vector<float> C(static_cast<size_t>(M) * N);
  kernels::gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    double t0 = now_seconds();
    kernels::gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
    t.push_back(now_seconds() - t0);
  }
  return 2.0 * M * N * K / *std::min_element(t.begin(), t.end()) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train_step_bench: packbert forward+backward step on given sequence lengths"};
  std::string lengths_text, recompute = "none", memory_limit, precision_text = "fp32";
  bool optimizer_step = false;
  int max_len = 512, steps = 3, warmup = 1;
  bool padded = false;
  double dropout = 0.1;
  app.add_option("--lengths", lengths_text, "Comma-separated sequence lengths of one step")
      ->required();
  model::ShapeRequest shape;
  shape.preset = "base";
  cli::shape_flags(&app, shape, "Model preset: tiny|mini|small|medium|base|large");
  app.add_option("--max-seq-len", max_len)->capture_default_str();
  app.add_option("--steps", steps, "Timed steps")->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  app.add_option("--dropout", dropout)->capture_default_str();
  app.add_flag("--padded", padded, "One sequence per row (the baseline layout)");
  app.add_option("--recompute", recompute,
                 "What backward rebuilds: none, gelu, gelu,ln, attention, layer, every:K")
      ->capture_default_str();
  app.add_option("--memory-limit", memory_limit,
                 "Refuse (exit 2) a step predicted to need more (default: available memory); "
                 "`--recompute auto` picks the cheapest policy that fits it");
  app.add_flag("--optimizer-step", optimizer_step,
               "Also run a LAMB update after each backward (its state counts in the plan)");
  app.add_option("--precision", precision_text,
                 "fp32, bf16 (bf16 GEMM operands) or fp16 (fp16 activations, GEMMs widened)")
      ->capture_default_str();
  std::string backend_text = "cpu";
  app.add_option("--backend", backend_text,
                 "cpu, or ref: the reference backend (plain loops in double; for small shapes)")
      ->capture_default_str();
  model::Sparsity sparsity;
  app.add_option("--sparsity", sparsity.sparsity,
                 "Block-sparse encoder weights: the fraction of blocks that are zero (0 = dense)")
      ->check(CLI::Range(0.0, 0.999));
  int block = 16;
  app.add_option("--block", block, "Block size of the sparse weights")
      ->check(CLI::IsMember({1, 4, 8, 16}))
      ->capture_default_str();
  std::string max_isa;
  app.add_option(
      "--max-isa", max_isa,
      "Cap the kernels' instruction set (avx2, avx512, avx512_bf16; as PACKBERT_MAX_ISA)");
  CLI11_PARSE(app, argc, argv);
  if (sparsity.sparsity > 0) sparsity.block = block;

  std::vector<int> lengths;
  std::stringstream ss(lengths_text);
  for (std::string tok; std::getline(ss, tok, ',');) lengths.push_back(std::stoi(tok));

  // The shape, then the plan for this exact step, checked before anything large is allocated.
  model::BertConfig c;
  model::Recompute policy;
  model::Precision precision = model::Precision::fp32;
  kernels::BackendKind backend = kernels::BackendKind::cpu;
  try {
    try {
      if (!max_isa.empty()) kernels::set_max_isa(kernels::parse_isa(max_isa));
      (void)kernels::max_isa();
    } catch (const std::invalid_argument& e) {
      throw InputError(std::string(max_isa.empty() ? "" : "--max-isa: ") + e.what());
    }
    try {
      backend = kernels::parse_backend(backend_text);
    } catch (const std::invalid_argument& e) {
      throw InputError(std::string("--backend: ") + e.what());
    }
    c = model::resolve_shape(shape);
    if (c.family == model::Family::modernbert && dropout > 0)
      throw InputError("a ModernBERT step runs without dropout here: --dropout 0");
    c.hidden_dropout_prob = c.attention_probs_dropout_prob = dropout;
    c.max_position_embeddings = std::max(c.max_position_embeddings, max_len);
    precision = model::parse_precision(precision_text);
    if (precision == model::Precision::bf16) {
      const std::string why = kernels::bf16_unavailable_reason();
      if (!why.empty()) throw InputError(why);
    }
    policy = model::parse_recompute(recompute);
    std::optional<double> limit;
    if (!memory_limit.empty()) limit = train::parse_bytes(memory_limit, "--memory-limit");
    train::PlanRequest req;
    req.config = c;
    req.precision = precision;
    req.sparsity = sparsity;
    req.shape = bench::shape_of_lengths(lengths, omp_get_max_threads());
    const model::Recompute resolved = train::check_step_fits(req, policy, limit);
    if (policy.automatic) std::cerr << "--recompute auto: " << resolved.name() << '\n';
    policy = resolved;
    const train::StepPlan plan = train::plan_step(req, policy);
    std::cerr << "plan: " << train::format_bytes(static_cast<double>(plan.total_bytes))
              << " in all, activations "
              << train::format_bytes(static_cast<double>(plan.activation_bytes)) << '\n';
  } catch (const InputError& e) {
    std::cerr << "train_step_bench: error: " << e.what() << '\n';
    return 2;
  }

  // Rows: packs from the optimal packer, or one sequence per row.
  const model::PackedBatch b = bench::bench_batch(lengths, max_len, c.vocab_size, padded);
  int64_t real_tokens = 0, masked = 0;
  for (size_t s = 0; s < b.sequence_ids.size(); ++s) {
    real_tokens += b.sequence_ids[s] > 0;
    masked += b.mlm_labels[s] != -100;
  }

  model::BertModel m(c, model::Heads{}, sparsity);
  model::init_params(m.layout(), m.params().data(), 1);
  m.init_patterns(1);
  m.set_backend(backend);
  std::optional<train::Optimizer> optimizer;
  if (optimizer_step) optimizer.emplace(m.layout(), train::OptimizerConfig{});
  double rate = peak_gflops<float>();
  const double rate16 = precision == model::Precision::bf16 ? peak_gflops<kernels::bf16>() : 0.0;
  std::vector<double> times, gemm_share;
  double flops = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    kernels::reset_gemm_counters();
    kernels::enable_gemm_counters(true);
    double t0 = now_seconds();
    m.forward(b, {true, 1, static_cast<uint64_t>(s), policy, precision});
    m.zero_grads();
    m.backward();
    if (optimizer) {
      train::clip_grad_norm(m.grads().data(), m.grads().size(), 1.0);
      train::apply_update(*optimizer, m, 1e-4, precision);
    }
    double dt = now_seconds() - t0;
    kernels::enable_gemm_counters(false);
    if (s >= warmup) {
      times.push_back(dt);
      gemm_share.push_back(kernels::gemm_counters().seconds / dt);
    }
  }
  // Model FLOPs of one step (forward x 3): every matmul of the model, attention included; a
  // sparse layer's kept blocks only.
  const double C = c.hidden_size, V = c.vocab_size, T = real_tokens;
  const double layer_weights = static_cast<double>(model::layer_linear_numel(m.layout()));
  // Attention: Q K^T and P V over the keys each query sees (a ModernBERT local layer's window:
  // |i - j| <= window / 2, inside the sequence; the global layers', the whole sequence).
  auto attention_flops = [&](int window) {
    double pairs = 0;
    for (int L : lengths)
      for (int i = 0; i < L; ++i)
        pairs += window ? std::min(L - 1, i + window / 2) - std::max(0, i - window / 2) + 1 : L;
    return 2.0 * 2.0 * pairs * C;
  };
  double fwd = 2.0 * masked * C * (C + V);
  for (int l = 0; l < c.num_hidden_layers; ++l)
    fwd += 2 * T * layer_weights +
           attention_flops(c.family == model::Family::modernbert ? c.modern.window(l) : 0);
  if (c.family == model::Family::bert)  // the pooler and NSP
    fwd += 2.0 * static_cast<double>(lengths.size()) * C * (C + 2);
  flops = 3 * fwd;
  std::sort(times.begin(), times.end());
  std::sort(gemm_share.begin(), gemm_share.end());
  double t = times[times.size() / 2];
  nlohmann::json out = {{"impl", "packbert"},
                        {"layout", padded ? "padded" : "packed"},
                        {"threads", omp_get_max_threads()},
                        {"sequences", lengths.size()},
                        {"rows", b.B},
                        {"real_tokens", real_tokens},
                        {"slots", static_cast<int64_t>(b.B) * b.S},
                        {"step_seconds", t},
                        {"real_tokens_per_s", real_tokens / t},
                        {"gemm_share", gemm_share[gemm_share.size() / 2]},
                        {"model_gflops", flops / t * 1e-9},
                        {"sgemm_gflops", rate},
                        {"precision", model::precision_name(precision)},
                        {"backend", kernels::backend(backend).name},
                        {"sparsity", sparsity.sparsity},
                        {"block", sparsity.block},
                        {"bf16_matmul_gflops", rate16},
                        {"cpu", kernels::cpu_features().model},
                        {"isa", kernels::cpu_features().isa()},
                        {"kernel_isa", kernels::kernel_isa()},
                        {"recompute", policy.name()},
                        {"optimizer_step", optimizer_step},
                        {"activation_mib", m.activation_bytes() / 1048576.0},
                        {"scratch_mib", m.scratch_bytes() / 1048576.0}};
  std::cout << out.dump() << std::endl;
  return 0;
}
