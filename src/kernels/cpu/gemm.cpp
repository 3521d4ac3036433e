#include "kernels/cpu/gemm.h"

#include <dnnl.h>
#include <omp.h>

#include <atomic>
#include <cassert>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "kernels/cpu_features.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

namespace {

// PACKBERT_MAX_ISA caps oneDNN when the CPU's features are first read, which must come before
// oneDNN's first kernel: every call into oneDNN below comes after this.
void apply_isa_cap() {
  static const bool read = (cpu_features(), true);
  (void)read;
}

struct Timer {
  bool on;
  double flops;
  std::chrono::steady_clock::time_point start;
  Timer(int M, int N, int K)
      : on(gemm_counters_enabled() && !omp_in_parallel()), flops(2.0 * M * N * K) {
    if (on) start = std::chrono::steady_clock::now();
  }
  ~Timer() {
    if (!on) return;
    count_gemm(flops, static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now() - start)
                                                .count()));
  }
};

}  // namespace

// fp32 backend: oneDNN's JIT sgemm, which generates code for the CPU it runs on (Debian 12's
// OpenBLAS 0.3.21 falls back to SSE3 kernels on recent Xeons, 5-6x slower, and spins in its
// start-up under a small address-space limit; packbert does not load it).
bool use_onednn() {
  return true;
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  Timer timer(M, N, K);
  apply_isa_cap();
  dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
             ldc);
}

namespace {

// The bf16 matmul primitives, keyed by everything fixed at creation; M and K are run-time
// dimensions (tokens vary from step to step), which oneDNN 2.6 serves with its JIT bf16 gemm at
// the same rate as a shape-specialised brgemm (measured: 2048 x 3072 x 768, both ~400 GFLOP/s on
// 2 Zen 5 cores, against 210 for sgemm).
struct Bf16Key {
  bool trans_a, trans_b;
  int N, lda, ldb, ldc;
  float alpha, beta;
  bool bf16_out, bias;
  auto tie() const {
    return std::tie(trans_a, trans_b, N, lda, ldb, ldc, alpha, beta, bf16_out, bias);
  }
  bool operator<(const Bf16Key& o) const { return tie() < o.tie(); }
};

struct Bf16Backend {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mutex;
  std::map<Bf16Key, dnnl::matmul> primitives;
};

Bf16Backend& bf16_backend() {
  apply_isa_cap();
  static Bf16Backend b;
  return b;
}

using dnnl::memory;

// Row-major op(X)[rows, cols] stored with leading dimension ld, as a oneDNN descriptor.
memory::desc operand(memory::dim rows, memory::dim cols, bool trans, int ld, memory::data_type t) {
  return trans ? memory::desc({rows, cols}, t, memory::dims{1, ld})
               : memory::desc({rows, cols}, t, memory::dims{ld, 1});
}

// The cached primitive for a key, built on first use.
dnnl::matmul& bf16_primitive(const Bf16Key& key) {
  using dt = memory::data_type;
  Bf16Backend& be = bf16_backend();
  std::lock_guard lock(be.mutex);
  auto it = be.primitives.find(key);
  if (it == be.primitives.end()) {
    const memory::dim R = DNNL_RUNTIME_DIM_VAL;
    dnnl::primitive_attr attr;
    if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
    if (key.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(key.beta);
      attr.set_post_ops(ops);
    }
    const memory::desc a = operand(R, R, key.trans_a, key.lda, dt::bf16),
                       b = operand(R, key.N, key.trans_b, key.ldb, dt::bf16),
                       c = operand(R, key.N, false, key.ldc, key.bf16_out ? dt::bf16 : dt::f32);
    const dnnl::matmul::desc d =
        key.bias
            ? dnnl::matmul::desc(a, b, memory::desc({1, key.N}, dt::f32, memory::dims{key.N, 1}), c)
            : dnnl::matmul::desc(a, b, c);
    it = be.primitives.emplace(key, dnnl::matmul(dnnl::matmul::primitive_desc(d, attr, be.engine)))
             .first;
  }
  return it->second;
}

// oneDNN 2.6's bf16 matmul runs a product with very many columns (the MLM decoder's 30,522) at
// half the rate of the same product cut into blocks of columns (measured: 293 x 30522 x 256 with
// the caches cold, as in a training step: 15 ms whole, 7.4 ms in blocks of 4,096, on 2 Zen 5
// cores), so wider products run block by block. Each block is a product of its own (same sums,
// same order: the split is over output columns, not over K).
constexpr int kMaxColumns = 4096;

// Runs the key's primitive on M x K and K x N operands.
void run_bf16(const Bf16Key& key, int M, int K, const bf16* A, const bf16* B, const float* bias,
              void* C) {
  if (key.N > kMaxColumns) {
    const size_t out_bytes = key.bf16_out ? sizeof(bf16) : sizeof(float);
    for (int j = 0; j < key.N; j += kMaxColumns) {
      Bf16Key block = key;
      block.N = std::min(kMaxColumns, key.N - j);
      const size_t col = static_cast<size_t>(j);
      run_bf16(block, M, K, A, B + (key.trans_b ? col * static_cast<size_t>(key.ldb) : col),
               bias ? bias + col : nullptr, static_cast<char*>(C) + col * out_bytes);
    }
    return;
  }
  using dt = memory::data_type;
  Bf16Backend& be = bf16_backend();
  dnnl::matmul& prim = bf16_primitive(key);
  // oneDNN takes non-const handles; it only reads A, B and the bias.
  memory a(operand(M, K, key.trans_a, key.lda, dt::bf16), be.engine, const_cast<bf16*>(A));
  memory b(operand(K, key.N, key.trans_b, key.ldb, dt::bf16), be.engine, const_cast<bf16*>(B));
  memory c(operand(M, key.N, false, key.ldc, key.bf16_out ? dt::bf16 : dt::f32), be.engine, C);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (bias)
    args.emplace(DNNL_ARG_BIAS, memory(memory::desc({1, key.N}, dt::f32, memory::dims{key.N, 1}),
                                       be.engine, const_cast<float*>(bias)));
  prim.execute(be.stream, args);
  be.stream.wait();
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc) {
  assert(!omp_in_parallel() && (beta == 0.0f || beta == 1.0f));
  if (M == 0 || N == 0) return;
  if (K == 0) {  // nothing to multiply: C = beta * C
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float& c = C[static_cast<long>(i) * ldc + j];
        c = beta == 0.0f ? 0.0f : c;
      }
    return;
  }
  Timer timer(M, N, K);
  run_bf16({trans_a, trans_b, N, lda, ldb, ldc, alpha, beta, false, false}, M, K, A, B, nullptr, C);
}

namespace {

// op(A) . op(B) + bias into C (bf16 or fp32, as Out), one primitive.
template <typename Out>
void gemm_bias_to(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                  const bf16* B, int ldb, const float* bias, Out* C, int ldc) {
  assert(!omp_in_parallel() && K > 0);
  if (M == 0 || N == 0) return;
  Timer timer(M, N, K);
  run_bf16(
      {trans_a, trans_b, N, lda, ldb, ldc, 1.0f, 0.0f, std::is_same_v<Out, bf16>, bias != nullptr},
      M, K, A, B, bias, C);
}

}  // namespace

void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
               const bf16* B, int ldb, const float* bias, bf16* C, int ldc) {
  gemm_bias_to(trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, C, ldc);
}

void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
               const bf16* B, int ldb, const float* bias, float* C, int ldc) {
  gemm_bias_to(trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, C, ldc);
}

namespace {

// op(X) as stored (rows x cols of the stored matrix, row stride ld) widened into a dense fp32
// matrix of the same orientation (row stride cols), in `out`, grown as needed.
const float* widen_operand(std::vector<float>& out, const f16* X, int rows, int cols, int ld) {
  out.resize(static_cast<size_t>(rows) * cols);
  float* o = out.data();
#pragma omp parallel for schedule(static) if (static_cast <long>(rows) * cols > (1 << 15))
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      o[static_cast<long>(r) * cols + c] = to_float(X[static_cast<long>(r) * ld + c]);
  return o;
}

// The per-thread fp32 copies of an f16 product's operands and, for an f16 C, its result.
struct F16Scratch {
  std::vector<float> a, b, c;
};
F16Scratch& f16_scratch() {
  thread_local F16Scratch s;
  return s;
}

// C = alpha * op(A) . op(B) + beta * C over the operands widened to fp32.
void gemm_widened(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const f16* A,
                  int lda, const f16* B, int ldb, float beta, float* C, int ldc) {
  F16Scratch& s = f16_scratch();
  const float* a = trans_a ? widen_operand(s.a, A, K, M, lda) : widen_operand(s.a, A, M, K, lda);
  const float* b = trans_b ? widen_operand(s.b, B, N, K, ldb) : widen_operand(s.b, B, K, N, ldb);
  gemm(trans_a, trans_b, M, N, K, alpha, a, trans_a ? M : K, b, trans_b ? K : N, beta, C, ldc);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const f16* A, int lda,
          const f16* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  gemm_widened(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const f16* A, int lda, const f16* B,
               int ldb, const float* bias, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  gemm_widened(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
  if (!bias) return;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) C[static_cast<long>(i) * ldc + j] += bias[j];
}

void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const f16* A, int lda, const f16* B,
               int ldb, const float* bias, f16* C, int ldc) {
  if (M == 0 || N == 0) return;
  std::vector<float>& c = f16_scratch().c;
  c.resize(static_cast<size_t>(M) * N);
  gemm_widened(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, c.data(), N);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      C[static_cast<long>(i) * ldc + j] =
          to_f16(c[static_cast<long>(i) * N + j] + (bias ? bias[j] : 0.0f));
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

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
