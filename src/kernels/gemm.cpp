#include "kernels/gemm.h"

#include <cblas.h>
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

// fp32 backend: oneDNN's JIT sgemm by default. OpenBLAS 0.3.21 (Debian 12) does not know
// recent Xeons and falls back to its SSE3 "Prescott" kernels there (5-6x slower); oneDNN
// generates code for the CPU it runs on. PACKBERT_GEMM=openblas selects OpenBLAS instead.
bool use_onednn() {
  static const bool onednn = [] {
    const char* e = std::getenv("PACKBERT_GEMM");
    return !(e && std::strcmp(e, "openblas") == 0);
  }();
  return onednn;
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
  if (use_onednn()) {
    dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
               ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace packbert::kernels
