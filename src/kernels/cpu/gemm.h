// The GEMM seam: every matrix product in the engine goes through here, so the backend is chosen
// in one place: fp32 through oneDNN's sgemm, bf16 operands through oneDNN's matmul primitive,
// f16 operands widened to fp32 for sgemm, fp64 (finite-difference tests only) through a plain loop
// nest. No BLAS library is loaded.
#pragma once

#include "kernels/cpu/isa.h"
#include "kernels/tensor.h"

namespace packbert::kernels {

// Profiling counters of the seam (benchmarks only), shared by the builds of the cpu kernels:
// floating-point operations (2*M*N*K) and wall-clock nanoseconds spent inside gemm() since the last
// reset. Updated atomically; calls made inside parallel regions add their own durations, so time
// can exceed wall time there.
struct GemmCounters {
  double flops = 0;
  double seconds = 0;
};
GemmCounters gemm_counters();
void reset_gemm_counters();
void enable_gemm_counters(bool on);
// What gemm() adds to them (every build of the cpu kernels counts into the one set).
bool gemm_counters_enabled();
void count_gemm(double flops, uint64_t nanos);

}  // namespace packbert::kernels

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

// C[M,N] = alpha * op(A)[M,K] . op(B)[K,N] + beta * C; row-major; op = transpose if trans_*.
// lda/ldb/ldc are the row strides of A, B, C as stored.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc);

// bf16 operands, fp32 accumulation and fp32 C (same contract as above; beta 0 or 1). oneDNN has
// no public bf16 gemm call, so this runs a matmul primitive: one per (transposes, N, strides,
// alpha, beta), with M and K given at run time, built once and cached (weights change every
// step, so they stay in their plain layout: nothing is pre-packed). Must not be called inside an
// OpenMP parallel region (the primitive runs on the whole team). Needs a CPU oneDNN runs bf16
// on; callers check kernels::bf16_unavailable_reason() first.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc);

// C[M, N] (bf16) = op(A) . op(B) + bias, bf16 operands, fp32 accumulation and bias (per column,
// [N], may be null), one rounding to bf16 inside the same primitive: a linear layer whose output
// only bf16 readers take. K > 0.
void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
               const bf16* B, int ldb, const float* bias, bf16* C, int ldc);
// The same with an fp32 C: the bias added to the accumulator in the same primitive, with no
// second pass over C.
void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
               const bf16* B, int ldb, const float* bias, float* C, int ldc);

// The same with binary16 (f16) operands, `--precision fp16`: oneDNN has no f16 matmul on CPUs
// without AVX512-FP16, so the operands are widened to fp32 (exactly) into a per-thread scratch
// that grows to the largest product seen, and multiplied by sgemm: fp16 buys memory, not speed.
// With an f16 C, the fp32 sum plus bias is rounded once.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const f16* A, int lda,
          const f16* B, int ldb, float beta, float* C, int ldc);
void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const f16* A, int lda, const f16* B,
               int ldb, const float* bias, f16* C, int ldc);
void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const f16* A, int lda, const f16* B,
               int ldb, const float* bias, float* C, int ldc);

// True when fp32 GEMMs go to oneDNN (always, today; benchmarks print it).
bool use_onednn();

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
