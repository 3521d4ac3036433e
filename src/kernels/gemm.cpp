#include "kernels/gemm.h"

#include <dnnl.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace packbert::kernels {

namespace {

// Profiling only (see gemm.h); off unless a benchmark turns it on.
std::atomic<bool> counting{false};
std::atomic<uint64_t> flop_count{0}, nanos{0};

struct Timer {
  bool on;
  double flops;
  std::chrono::steady_clock::time_point start;
  Timer(int M, int N, int K)
      : on(counting.load(std::memory_order_relaxed) && !omp_in_parallel()), flops(2.0 * M * N * K) {
    if (on) start = std::chrono::steady_clock::now();
  }
  ~Timer() {
    if (!on) return;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    flop_count += static_cast<uint64_t>(flops);
    nanos += static_cast<uint64_t>(ns);
  }
};

}  // namespace

// fp32 backend: oneDNN's JIT sgemm, which generates code for the CPU it runs on (Debian 12's
// OpenBLAS 0.3.21 falls back to SSE3 kernels on recent Xeons, 5-6x slower, and spins in its
// start-up under a small address-space limit; packbert does not load it).
bool use_onednn() {
  return true;
}

GemmCounters gemm_counters() {
  return {static_cast<double>(flop_count), nanos * 1e-9};
}
void reset_gemm_counters() {
  flop_count = 0, nanos = 0;
}
void enable_gemm_counters(bool on) {
  counting = on;
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  Timer timer(M, N, K);
  dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
             ldc);
}

// fp64 serves only the finite-difference tests on small models: a plain loop nest in the
// reference order (each C element summed over k in order), parallel over rows of C.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
#pragma omp parallel for schedule(static) if (static_cast <long>(M) * N * K > 32768)
  for (int i = 0; i < M; ++i) {
    double* c = C + static_cast<long>(i) * ldc;
    for (int j = 0; j < N; ++j) c[j] = beta == 0.0 ? 0.0 : beta * c[j];
    for (int k = 0; k < K; ++k) {
      const double a =
          alpha * (trans_a ? A[static_cast<long>(k) * lda + i] : A[static_cast<long>(i) * lda + k]);
      if (!trans_b) {
        const double* b = B + static_cast<long>(k) * ldb;
        for (int j = 0; j < N; ++j) c[j] += a * b[j];
      } else {
        for (int j = 0; j < N; ++j) c[j] += a * B[static_cast<long>(j) * ldb + k];
      }
    }
  }
}

}  // namespace packbert::kernels
