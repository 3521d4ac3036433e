// Google Benchmark microbenchmarks: one line per kernel at BERT-base shapes (T = 512 real
// tokens, C = 768, 12 heads, I = 3072), forward and backward. `build/kernel_bench`.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/dropout.h"
#include "kernels/layers.h"

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
  auto logits = randn(static_cast<size_t>(M) * V), probs = randn(static_cast<size_t>(M) * V),
       dl = randn(static_cast<size_t>(M) * V);
  std::vector<float> losses(M), dloss(M, 1.0f / M);
  std::vector<int32_t> targets(M, 5);
  for (auto _ : s) {
    cross_entropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), M, V);
    cross_entropy_backward(dl.data(), probs.data(), targets.data(), dloss.data(), M, V);
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

}  // namespace

BENCHMARK(BM_layernorm)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gelu)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_linear_ffn)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention)->Arg(512)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_embedding)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cross_entropy_mlm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_dropout)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
