// Block-sparse against dense linear layers at one shape (default BERT-base's FFN up-projection,
// 768 -> 3072 over 2,048 tokens, sparsity 0.9): forward plus both backward products (input and
// weight gradient) and the bias gradient, fp32, on all of this process's threads. For each
// block size, the dense layer and the sparse one run alternately, --runs times each; one JSON
// line per block size gives the medians:
//   {"block":16,"sparsity":0.9,"dense_ms":...,"sparse_ms":...,"speedup":...,...}
// Both layers run through the cpu backend (kernels/ops.h), so --max-isa avx2 (or
// PACKBERT_MAX_ISA=avx2) measures its AVX2 build and oneDNN's AVX2 kernels on any newer CPU.
// `build/sparse_bench [--tokens N] [--in C] [--out OC] [--sparsity s] [--runs R] [--blocks 1,4]
//   [--max-isa avx2]`
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "kernels/cpu/sparse.h"
#include "kernels/ops.h"
#include "stopwatch.h"

using namespace packbert;
using namespace packbert::kernels;

namespace {

// 64-byte-aligned buffers, as the model's workspace gives its layers (whole cache lines per
// row, which the sparse forward's streamed stores need).
template <typename T>
struct Aligned {
  using value_type = T;
  Aligned() = default;
  template <typename U>
  Aligned(const Aligned<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  bool operator==(const Aligned&) const { return true; }
};
using Floats = std::vector<float, Aligned<float>>;

Floats randn(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Floats v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Block-sparse vs dense linear layer: forward + input and weight gradients"};
  int N = 2048, C = 768, OC = 3072, runs = 5;
  double sparsity = 0.9;
  std::vector<int> blocks{16, 8, 4, 1};
  app.add_option("--tokens", N, "tokens (rows of the input)")->check(CLI::PositiveNumber);
  app.add_option("--in", C, "input features")->check(CLI::PositiveNumber);
  app.add_option("--out", OC, "output features")->check(CLI::PositiveNumber);
  app.add_option("--sparsity", sparsity, "fraction of blocks that are zero")
      ->check(CLI::Range(0.0, 0.999));
  app.add_option("--runs", runs, "timed runs of each layer (the median is reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--blocks", blocks, "block sizes (1, 4, 8, 16)")->delimiter(',');
  std::string isa_cap;
  app.add_option("--max-isa", isa_cap,
                 "cap the kernels' instruction set (avx2, avx512, avx512_bf16)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!isa_cap.empty()) set_max_isa(parse_isa(isa_cap));
    (void)max_isa();
  } catch (const std::exception& e) {
    std::cerr << "sparse_bench: " << e.what() << "\n";
    return 2;
  }
  for (int b : blocks)
    if (!supported_block(b) || C % b || OC % b) {
      std::cerr << "sparse_bench: --blocks " << b << " does not divide " << C << " x " << OC
                << " (block sizes 1, 4, 8, 16)\n";
      return 2;
    }

  const CpuFeatures& cpu = cpu_features();
  const auto x = randn(static_cast<size_t>(N) * C, 1.0f, 1);
  const auto dy = randn(static_cast<size_t>(N) * OC, 1.0f, 2);
  const auto w = randn(static_cast<size_t>(OC) * C, 0.02f, 3);
  const auto bias = randn(OC, 0.02f, 4);
  Floats y(static_cast<size_t>(N) * OC), dx(static_cast<size_t>(N) * C),
      dw(static_cast<size_t>(OC) * C), db(OC);

  const Backend& cpu_backend = backend(BackendKind::cpu);
  auto dense_step = [&] {
    cpu_backend.linear_forward(View(y.data(), N, OC), View(x.data(), N, C), View(w.data(), OC, C),
                               View::vector(bias.data(), OC), nullptr, View());
    cpu_backend.linear_backward(View(dx.data(), N, C), View(dw.data(), OC, C),
                                View::vector(db.data(), OC), View(dy.data(), N, OC),
                                View(x.data(), N, C), View(w.data(), OC, C), nullptr,
                                GradWrite::accumulate, View());
  };
  for (int B : blocks) {
    const BlockPattern p =
        random_block_pattern(OC, C, B, blocks_kept(OC, C, B, sparsity), 1234 + B);
    Floats values(p.values_size()), dvalues(p.values_size());
    gather_blocks(values.data(), p, w.data());
    Floats scratch(sparse_linear_scratch(p, N));
    const auto nv = static_cast<int64_t>(values.size());
    auto sparse_step = [&] {
      cpu_backend.linear_forward(
          View(y.data(), N, OC), View(x.data(), N, C), View::vector(values.data(), nv),
          View::vector(bias.data(), OC), &p,
          View::vector(scratch.data(), static_cast<int64_t>(scratch.size())));
      cpu_backend.linear_backward(
          View(dx.data(), N, C), View::vector(dvalues.data(), nv), View::vector(db.data(), OC),
          View(dy.data(), N, OC), View(x.data(), N, C), View::vector(values.data(), nv), &p,
          GradWrite::accumulate,
          View::vector(scratch.data(), static_cast<int64_t>(scratch.size())));
    };
    dense_step();  // warm-up: first-touch pages, oneDNN's kernels generated
    sparse_step();
    std::vector<double> dense_s, sparse_s;
    for (int r = 0; r < runs; ++r) {
      Stopwatch d;
      dense_step();
      dense_s.push_back(d.seconds());
      Stopwatch s;
      sparse_step();
      sparse_s.push_back(s.seconds());
    }
    const double dense_ms = 1e3 * median(dense_s), sparse_ms = 1e3 * median(sparse_s);
    const double gemm_flops = 6.0 * N * C * OC;
    nlohmann::json line = {{"block", B},
                           {"sparsity", sparsity},
                           {"dense_ms", dense_ms},
                           {"sparse_ms", sparse_ms},
                           {"speedup", dense_ms / sparse_ms},
                           {"density", static_cast<double>(p.nnz()) * B * B / (double(OC) * C)},
                           {"dense_gflops", gemm_flops / dense_ms * 1e-6},
                           {"tokens", N},
                           {"in", C},
                           {"out", OC},
                           {"runs", runs},
                           {"threads", omp_get_max_threads()},
                           {"cpu", cpu.model},
                           {"isa", cpu.isa()},
                           {"kernel_isa", kernel_isa()}};
    std::cout << line.dump() << std::endl;
  }
  return 0;
}
