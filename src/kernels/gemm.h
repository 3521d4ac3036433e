// The GEMM seam: every matrix product in the engine goes through here, so the backend is chosen
// in one place: fp32 through oneDNN's sgemm, fp64 (finite-difference tests only) through a plain
// loop nest; bf16 through oneDNN later. No BLAS library is loaded.
#pragma once

namespace packbert::kernels {

// C[M,N] = alpha * op(A)[M,K] . op(B)[K,N] + beta * C; row-major; op = transpose if trans_*.
// lda/ldb/ldc are the row strides of A, B, C as stored.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc);

// Profiling counters of the seam (benchmarks only): floating-point operations (2*M*N*K) and
// wall-clock nanoseconds spent inside gemm() since the last reset. Updated atomically; calls
// made inside parallel regions add their own durations, so time can exceed wall time there.
struct GemmCounters {
  double flops = 0;
  double seconds = 0;
};
GemmCounters gemm_counters();
void reset_gemm_counters();
void enable_gemm_counters(bool on);

// True when fp32 GEMMs go to oneDNN (always, today; benchmarks print it).
bool use_onednn();

}  // namespace packbert::kernels
