// gemm.h's profiling counters: compiled once, outside the per-instruction-set builds of the cpu
// kernels (cpu/isa.h), so a bench reads one set whichever build ran its products.
#include <atomic>

#include "kernels/cpu/gemm.h"

namespace packbert::kernels {

namespace {

std::atomic<bool> counting{false};
std::atomic<uint64_t> flop_count{0}, nanos{0};

}  // namespace

GemmCounters gemm_counters() {
  return {static_cast<double>(flop_count), nanos * 1e-9};
}
void reset_gemm_counters() {
  flop_count = 0, nanos = 0;
}
void enable_gemm_counters(bool on) {
  counting = on;
}
bool gemm_counters_enabled() {
  return counting.load(std::memory_order_relaxed);
}
void count_gemm(double flops, uint64_t ns) {
  flop_count += static_cast<uint64_t>(flops);
  nanos += ns;
}

}  // namespace packbert::kernels
