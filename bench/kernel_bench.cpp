// Google Benchmark microbenchmarks: one line per kernel at BERT-base shapes (T = 512 real
// tokens, C = 768, 12 heads, I = 3072), forward and backward (the FFN up-projection also
// block-sparse, per block size); a `_bf16` row for each kernel whose
// `--precision bf16` path differs (skipped, saying why, on a CPU without bf16 instructions), an
// `_fp16` row for each kernel whose `--precision fp16` path differs (any CPU), and
// the optimizer's update pass per master-weights setting. `build/kernel_bench`; the context
// lines name the CPU and the instruction sets it has.
#include <benchmark/benchmark.h>

#include <iostream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/features.h"
#include "kernels/cpu/layers.h"
#include "kernels/cpu/sparse.h"
#include "kernels/dropout.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "train/optimizer.h"

using namespace packbert::kernels;

namespace {

constexpr int T = 512, C = 768, NH = 12, I = 3072, V = 30522, M = 76;

std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// v rounded to the 16-bit type H (bf16 or f16).
template <typename H = bf16>
std::vector<H> narrow(const std::vector<float>& v) {
  std::vector<H> out(v.size());
  to_half(out.data(), v.data(), static_cast<int64_t>(v.size()));
  return out;
}

// False (and the row skipped, saying why) on a CPU without native bf16; fp16 runs anywhere.
template <typename H = bf16>
bool runs_16bit(benchmark::State& s) {
  if constexpr (std::is_same_v<H, f16>) return true;
  const std::string why = bf16_unavailable_reason();
  if (!why.empty()) s.SkipWithError(why.c_str());
  return why.empty();
}

void BM_layernorm(benchmark::State& s) {
  auto x = randn(T * C), w = randn(C), b = randn(C), out = randn(T * C), dx = randn(T * C);
  std::vector<float> mean(T), rstd(T), dw(C), db(C);
  for (auto _ : s) {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), T, C,
                      1e-12f);
    layernorm_backward(dx.data(), dw.data(), db.data(), out.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), T, C);
  }
  s.SetItemsProcessed(s.iterations() * T);
}

void BM_gelu(benchmark::State& s) {
  auto x = randn(T * I), out = randn(T * I), dx = randn(T * I);
  for (auto _ : s) {
    gelu_forward(out.data(), x.data(), T * I);
    gelu_backward(dx.data(), x.data(), out.data(), T * I);
  }
  s.SetItemsProcessed(s.iterations() * T);
}

void BM_linear_ffn(benchmark::State& s) {
  auto x = randn(T * C), w = randn(I * C, 0.02f), b = randn(I), out = randn(T * I),
       dx = randn(T * C), dw = randn(I * C), db = randn(I);
  for (auto _ : s) {
    linear_forward(out.data(), x.data(), w.data(), b.data(), T, C, I);
    linear_backward(dx.data(), dw.data(), db.data(), out.data(), x.data(), w.data(), T, C, I);
  }
  s.counters["GFLOP/s"] =
      benchmark::Counter(6.0 * T * C * I * s.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

// The FFN up-projection block-sparse at s = 0.9 (Arg: the block size), forward and both
// backward products: compare with BM_linear_ffn (dense, same shape); bench/sparse_bench.cpp times
// the two interleaved.
void BM_sparse_linear_ffn(benchmark::State& s) {
  const int B = static_cast<int>(s.range(0));
  const BlockPattern p = random_block_pattern(I, C, B, blocks_kept(I, C, B, 0.9), 1);
  auto x = randn(T * C), values = randn(p.values_size(), 0.02f), b = randn(I), out = randn(T * I),
       dx = randn(T * C), dv = randn(p.values_size()), db = randn(I);
  std::vector<float> scratch(sparse_linear_scratch(p, T));
  for (auto _ : s) {
    sparse_linear_forward(out.data(), x.data(), p, values.data(), b.data(), T, scratch.data());
    sparse_linear_backward(dx.data(), dv.data(), db.data(), out.data(), x.data(), p, values.data(),
                           T, scratch.data());
  }
  s.counters["GFLOP/s"] =
      benchmark::Counter(6.0 * T * static_cast<double>(p.values_size()) * s.iterations() * 1e-9,
                         benchmark::Counter::kIsRate);
}

void BM_attention(benchmark::State& s) {
  // One 512-token sequence, or the same tokens as sequences of 128: work follows sum L^2.
  const int L = static_cast<int>(s.range(0));
  std::vector<int32_t> cu;
  for (int a = 0; a <= T; a += L) cu.push_back(a);
  const int n_seq = static_cast<int>(cu.size()) - 1;
  auto qkv = randn(T * 3 * C, 0.1f), out = randn(T * C), dqkv = randn(T * 3 * C);
  std::vector<float> probs(attention_probs_offsets(cu.data(), n_seq, NH).back());
  AttentionDropout d{0.1, 1, 2};
  for (auto _ : s) {
    attention_forward(out.data(), probs.data(), qkv.data(), cu.data(), n_seq, C, NH, d);
    attention_backward(dqkv.data(), out.data(), qkv.data(), probs.data(), cu.data(), n_seq, C, NH,
                       d);
  }
  s.SetItemsProcessed(s.iterations() * T);
}

void BM_embedding(benchmark::State& s) {
  auto word = randn(static_cast<size_t>(V) * C), pos = randn(512 * C), typ = randn(2 * C),
       out = randn(T * C);
  std::vector<int32_t> ids(T), p(T), y(T, 0);
  for (int t = 0; t < T; ++t) ids[t] = (t * 7919) % V, p[t] = t;
  for (auto _ : s) {
    embedding_forward(out.data(), ids.data(), p.data(), y.data(), word.data(), pos.data(),
                      typ.data(), T, C);
    embedding_backward(word.data(), pos.data(), typ.data(), out.data(), ids.data(), p.data(),
                       y.data(), T, C);
  }
  s.SetItemsProcessed(s.iterations() * T);
}

void BM_cross_entropy_mlm(benchmark::State& s) {
  auto logits = randn(static_cast<size_t>(M) * V), dl = randn(static_cast<size_t>(M) * V);
  std::vector<float> losses(M), lse(M), dloss(M, 1.0f / M);
  std::vector<int32_t> targets(M, 5);
  for (auto _ : s) {
    cross_entropy_logits_forward(losses.data(), lse.data(), logits.data(), targets.data(), M, V);
    cross_entropy_logits_backward(dl.data(), logits.data(), lse.data(), targets.data(),
                                  dloss.data(), M, V, GradWrite::overwrite);
  }
  s.SetItemsProcessed(s.iterations() * M);
}

void BM_dropout(benchmark::State& s) {
  auto x = randn(T * C), out = randn(T * C), dx = randn(T * C);
  for (auto _ : s) {
    dropout_forward(out.data(), x.data(), T * C, 0.1, 1, 2);
    dropout_backward(dx.data(), out.data(), T * C, 0.1, 1, 2);
  }
  s.SetItemsProcessed(s.iterations() * T);
}

template <typename H>
void layernorm_16(benchmark::State& s) {
  auto x = randn(T * C), w = randn(C), b = randn(C), out = randn(T * C), dx = randn(T * C);
  const auto x16 = narrow<H>(x);
  std::vector<H> out16(T * C);
  std::vector<float> mean(T), rstd(T), dw(C), db(C);
  for (auto _ : s) {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x16.data(), w.data(), b.data(), T, C,
                      1e-12f, out16.data());
    layernorm_backward(dx.data(), dw.data(), db.data(), out.data(), x16.data(), w.data(),
                       mean.data(), rstd.data(), T, C);
  }
  s.SetItemsProcessed(s.iterations() * T);
}

template <typename H>
void gelu_16(benchmark::State& s) {
  const auto x16 = narrow<H>(randn(T * I));
  auto dout = randn(T * I), dx = randn(T * I);
  std::vector<H> out16(T * I);
  for (auto _ : s) {
    gelu_forward(out16.data(), x16.data(), T * I);
    gelu_backward(dx.data(), x16.data(), dout.data(), T * I);
  }
  s.SetItemsProcessed(s.iterations() * T);
}

template <typename H>
void linear_ffn_16(benchmark::State& s) {
  if (!runs_16bit<H>(s)) return;
  const auto x16 = narrow<H>(randn(T * C)), w16 = narrow<H>(randn(I * C, 0.02f));
  auto b = randn(I), out = randn(T * I), dx = randn(T * C), dw = randn(I * C), db = randn(I);
  std::vector<H> dout16(T * I);
  for (auto _ : s) {
    linear_forward(out.data(), x16.data(), w16.data(), b.data(), T, C, I);
    linear_backward(dx.data(), dw.data(), db.data(), out.data(), dout16.data(), x16.data(),
                    w16.data(), T, C, I);
  }
  s.counters["GFLOP/s"] =
      benchmark::Counter(6.0 * T * C * I * s.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

// The MLM head's decoder and loss under bf16 at bert-mini's demo shape (293 masked tokens x 256
// hidden -> 30,522 words, the shape of a 16-pack demo step): logits GEMM with bias, the
// logits-kept cross-entropy forward and backward (bf16 gradient and bias sums), and the two
// backward GEMMs. Its working set (~100 MB) leaves the caches cold each iteration, as a step does.
void BM_mlm_head_bf16(benchmark::State& s) {
  if (!runs_16bit<bf16>(s)) return;
  constexpr int Mm = 293, Cm = 256;
  const auto x16 = narrow<bf16>(randn(Mm * Cm)), w16 = narrow<bf16>(randn(V * Cm, 0.02f));
  auto b = randn(V), logits = randn(static_cast<size_t>(Mm) * V), dx = randn(Mm * Cm),
       dw = randn(static_cast<size_t>(V) * Cm);
  std::vector<float> losses(Mm), lse(Mm), dloss(Mm, 1.0f / Mm);
  std::vector<int32_t> targets(Mm);
  for (int i = 0; i < Mm; ++i) targets[i] = (i * 7919) % V;
  std::vector<bf16> dlogits16(static_cast<size_t>(Mm) * V);
  for (auto _ : s) {
    linear_forward(logits.data(), x16.data(), w16.data(), b.data(), Mm, Cm, V);
    cross_entropy_logits_forward(losses.data(), lse.data(), logits.data(), targets.data(), Mm, V);
    cross_entropy_logits_backward(dlogits16.data(), b.data(), logits.data(), lse.data(),
                                  targets.data(), dloss.data(), Mm, V);
    linear_backward(dx.data(), dw.data(), dlogits16.data(), x16.data(), w16.data(), Mm, Cm, V,
                    GradWrite::overwrite);
  }
  s.counters["GFLOP/s"] =
      benchmark::Counter(6.0 * Mm * Cm * V * s.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

template <typename H>
void attention_16(benchmark::State& s) {
  const int L = static_cast<int>(s.range(0));
  std::vector<int32_t> cu;
  for (int a = 0; a <= T; a += L) cu.push_back(a);
  const int n_seq = static_cast<int>(cu.size()) - 1;
  const auto qkv16 = narrow<H>(randn(T * 3 * C, 0.1f));
  auto dout = randn(T * C), dqkv = randn(T * 3 * C);
  std::vector<H> out16(T * C), probs16(attention_probs_offsets(cu.data(), n_seq, NH).back());
  AttentionDropout d{0.1, 1, 2};
  for (auto _ : s) {
    attention_forward(out16.data(), probs16.data(), qkv16.data(), cu.data(), n_seq, C, NH, d);
    attention_backward(dqkv.data(), dout.data(), qkv16.data(), probs16.data(), cu.data(), n_seq, C,
                       NH, d);
  }
  s.SetItemsProcessed(s.iterations() * T);
}

#define PACKBERT_16BIT_ROWS(name)              \
  void BM_##name##_bf16(benchmark::State& s) { \
    name##_16<bf16>(s);                        \
  }                                            \
  void BM_##name##_fp16(benchmark::State& s) { \
    name##_16<f16>(s);                         \
  }
PACKBERT_16BIT_ROWS(layernorm)
PACKBERT_16BIT_ROWS(gelu)
PACKBERT_16BIT_ROWS(linear_ffn)
PACKBERT_16BIT_ROWS(attention)
#undef PACKBERT_16BIT_ROWS

// The word embeddings in bf16 (`--master-weights bf16`): the gather widens them.
void BM_embedding_bf16(benchmark::State& s) {
  const auto word16 = narrow(randn(static_cast<size_t>(V) * C));
  auto word = randn(static_cast<size_t>(V) * C), pos = randn(512 * C), typ = randn(2 * C),
       out = randn(T * C);
  std::vector<int32_t> ids(T), p(T), y(T, 0);
  for (int t = 0; t < T; ++t) ids[t] = (t * 7919) % V, p[t] = t;
  for (auto _ : s) {
    embedding_forward(out.data(), ids.data(), p.data(), y.data(), word16.data(), pos.data(),
                      typ.data(), T, C);
    embedding_backward(word.data(), pos.data(), typ.data(), out.data(), ids.data(), p.data(),
                       y.data(), T, C);
  }
  s.SetItemsProcessed(s.iterations() * T);
}

// One LAMB update of an FFN's weights (768 x 3072 and its bias) per master-weights setting:
// 0 fp32 (with the bf16 copy rewritten, as under --precision bf16), 1 bf16 with stochastic
// rounding, 2 bf16 rounded to nearest.
void BM_lamb_update(benchmark::State& s) {
  namespace tr = packbert::train;
  namespace md = packbert::model;
  md::BertConfig c = md::bert_preset("tiny");
  c.hidden_size = C, c.intermediate_size = I, c.num_hidden_layers = 1, c.vocab_size = 2;
  c.num_attention_heads = NH, c.max_position_embeddings = 2;
  const md::ParamLayout layout(c, md::Heads{false, false, false});
  const tr::Masters masters = static_cast<tr::Masters>(s.range(0));
  tr::OptimizerConfig oc;
  oc.masters = masters;
  tr::Optimizer opt(layout, oc);
  auto w = randn(layout.total(), 0.02f), g = randn(layout.total(), 1e-3f);
  auto w16 = narrow(w);
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

}  // namespace

BENCHMARK(BM_layernorm)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gelu)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_linear_ffn)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sparse_linear_ffn)->Arg(16)->Arg(8)->Arg(4)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention)->Arg(512)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_embedding)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cross_entropy_mlm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_dropout)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_layernorm_bf16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gelu_bf16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_linear_ffn_bf16)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_mlm_head_bf16)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_bf16)->Arg(512)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_embedding_bf16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_layernorm_fp16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gelu_fp16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_linear_ffn_fp16)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_fp16)->Arg(512)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_lamb_update)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  // These benchmarks call the kernels of the build's own flags directly, not through the
  // backend that PACKBERT_MAX_ISA chooses: under a cap they would time code the cap hides.
  const CpuFeatures& cpu = cpu_features();
  if (cpu.capped) {
    std::cerr << "kernel_bench: runs the kernels built for this build's flags only, not the "
                 "capped ones ("
              << cpu.isa()
              << "); use sparse_bench or train_step_bench with "
                 "--max-isa\n";
    return 2;
  }
  benchmark::AddCustomContext("cpu_model", cpu.model);
  benchmark::AddCustomContext("isa", cpu.isa());
  benchmark::AddCustomContext("kernel_isa", kernel_isa());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
