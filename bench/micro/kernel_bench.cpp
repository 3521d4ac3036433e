// The kernel harness's own table (tests/kernel_cases.h) timed at BERT-base's shapes, as ggml's
// `test-backend-ops perf` times its cases: every row's forward and backward through the op seam,
// on each build of the cpu backend this CPU runs (its own instruction set first, then the lower
// ones: kernels::cpu_backends(), which PACKBERT_MAX_ISA caps), in f32 and, for a row with 16-bit
// forms, in bf16 and f16 (bf16 GEMMs only where the CPU has bf16 products). One benchmark per
// (row, build, dtype, direction), named `row/isa/dtype/forward|backward`; filter with
// --benchmark_filter (e.g. 'linear/.*/f32'). The 16-bit copies of a row's inputs are rounded
// before the timing starts, so a time is the op's alone. Plus the optimizer's update pass per
// master-weights setting (an op the table has no row for: it has no gradient). The context
// lines name the CPU, its instruction sets and the kernels' build.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernel_cases.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu_features.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "train/optimizer.h"

using namespace packbert::kernels;
using namespace packbert::kernels::harness;

namespace {

std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The Env of one row at a time (the embedding row's alone holds ~190 MB): made when a
// benchmark of another row starts.
class Envs {
 public:
  Env<float>& of(const KernelCase& c) {
    if (name_ != c.name) {
      env_.reset();  // (free the last row's before filling the next)
      std::mt19937 rng(3);
      env_ = std::make_unique<Env<float>>(make_env<float>(c, rng));
      name_ = c.name;
    }
    return *env_;
  }

 private:
  std::string name_;
  std::unique_ptr<Env<float>> env_;
};

Envs& envs() {
  static Envs e;
  return e;
}

// The benchmark name's part for a row: its name with anything but letters and digits as '_'.
std::string slug(const std::string& name) {
  std::string s;
  for (char ch : name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s;
}

// Times one direction of row c on backend `be` in dtype h. Forward runs once first (rounding
// the staged 16-bit inputs); backward runs after one forward, whose saved state it reads.
void time_row(benchmark::State& s, const KernelCase& c, const Backend& be, DType h, bool backward) {
  Env<float>& e = envs().of(c);
  e.restage = true;
  c.ops_forward_f(be, h, e);
  e.restage = false;
  if (backward) {
    for (auto _ : s) c.ops_backward_f(be, h, e);
  } else {
    for (auto _ : s) c.ops_forward_f(be, h, e);
  }
  const double flops = backward ? c.flops_backward : c.flops_forward;
  if (flops > 0)
    s.counters["GFLOP/s"] = benchmark::Counter(flops * static_cast<double>(s.iterations()) * 1e-9,
                                               benchmark::Counter::kIsRate);
}

void register_rows(const std::vector<KernelCase>& rows) {
  const std::string no_bf16 = bf16_unavailable_reason();
  for (const KernelCase& c : rows) {
    for (const Backend* be : cpu_backends()) {
      std::vector<DType> dtypes = {DType::f32};
      if (c.halves) dtypes.insert(dtypes.end(), {DType::bf16, DType::f16});
      for (const DType h : dtypes) {
        for (const bool backward : {false, true}) {
          const std::string name = slug(c.name) + "/" + isa_name(be->isa) + "/" + dtype_name(h) +
                                   (backward ? "/backward" : "/forward");
          const bool linear = c.name.rfind("linear", 0) == 0;
          benchmark::RegisterBenchmark(name.c_str(), [&c, be, h, backward, linear,
                                                      no_bf16](benchmark::State& s) {
            if (h == DType::bf16 && linear && !no_bf16.empty()) {
              s.SkipWithError(no_bf16.c_str());
              return;
            }
            time_row(s, c, *be, h, backward);
          })->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

// One LAMB update of an FFN's weights (768 x 3072 and its bias) per master-weights setting:
// 0 fp32 (with the bf16 copy rewritten, as under --precision bf16), 1 bf16 with stochastic
// rounding, 2 bf16 rounded to nearest.
void BM_lamb_update(benchmark::State& s) {
  namespace tr = packbert::train;
  namespace md = packbert::model;
  md::BertConfig c = md::bert_preset("tiny");
  c.hidden_size = 768, c.intermediate_size = 3072, c.num_hidden_layers = 1, c.vocab_size = 2;
  c.num_attention_heads = 12, c.max_position_embeddings = 2;
  const md::ParamLayout layout(c, md::Heads{false, false, false});
  const tr::Masters masters = static_cast<tr::Masters>(s.range(0));
  tr::OptimizerConfig oc;
  oc.masters = masters;
  tr::Optimizer opt(layout, oc);
  auto w = randn(layout.total(), 0.02f), g = randn(layout.total(), 1e-3f);
  std::vector<bf16> w16(w.size());
  to_half(w16.data(), w.data(), static_cast<int64_t>(w.size()));
  for (auto _ : s) {
    const View copy = View::vector(w16.data(), static_cast<int64_t>(w16.size()));
    if (masters == tr::Masters::fp32)
      opt.step(View::vector(w.data(), static_cast<int64_t>(w.size())), g.data(), 1e-3, copy);
    else
      opt.step(copy, g.data(), 1e-3);
  }
  s.SetLabel(tr::masters_name(masters));
  s.SetItemsProcessed(s.iterations() * static_cast<int64_t>(layout.total()));
}

// Attention over 4 sequences of 512 tokens at BERT-base's width (12 heads of 64), f32 through
// the op seam, probabilities kept: global (window 0) against ModernBERT's sliding window (128),
// forward (direction 0) and backward (1) on the same batch.
void BM_attention_window(benchmark::State& s) {
  const int window = static_cast<int>(s.range(0)), NH = 12, C = 768, n_seq = 4, T = 512 * n_seq;
  const bool backward = s.range(1) == 1;
  std::vector<int32_t> cu(n_seq + 1);
  for (int q = 0; q <= n_seq; ++q) cu[q] = 512 * q;
  const std::vector<int64_t> offsets = attention_probs_offsets(cu.data(), n_seq, NH, window);
  auto qkv = randn(size_t(T) * 3 * C), out = randn(size_t(T) * C), dqkv = randn(qkv.size());
  std::vector<float> probs(static_cast<size_t>(offsets.back()));
  std::vector<float> scratch(attention_scratch_elems(512, omp_get_max_threads(), C / NH));
  const View vq(qkv.data(), T, 3 * C), vo(out.data(), T, C), vd(dqkv.data(), T, 3 * C);
  const View vp = View::vector(probs.data(), offsets.back());
  const View vs = View::vector(scratch.data(), static_cast<int64_t>(scratch.size()));
  const Backend& be = backend(BackendKind::cpu);
  be.attention_forward(vo, vp, vq, cu.data(), n_seq, NH, window, {}, offsets.data(), vs);
  for (auto _ : s) {
    if (backward)
      be.attention_backward(vd, vo, vq, vp, cu.data(), n_seq, NH, window, {}, offsets.data(), vs,
                            GradWrite::overwrite);
    else
      be.attention_forward(vo, vp, vq, cu.data(), n_seq, NH, window, {}, offsets.data(), vs);
  }
  s.SetLabel(std::string(window == 0 ? "global" : "window " + std::to_string(window)) +
             (backward ? ", backward" : ", forward"));
}

}  // namespace

BENCHMARK(BM_lamb_update)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_window)
    ->ArgsProduct({{0, 128}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

int main(int argc, char** argv) {
  const CpuFeatures& cpu = cpu_features();
  const Shapes shapes = bert_base_shapes();
  static const std::vector<KernelCase> rows = kernel_cases(shapes);
  register_rows(rows);
  benchmark::AddCustomContext("cpu_model", cpu.model);
  benchmark::AddCustomContext("isa", cpu.isa());
  benchmark::AddCustomContext("kernel_isa", kernel_isa());
  benchmark::AddCustomContext("shapes", shapes.name);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
