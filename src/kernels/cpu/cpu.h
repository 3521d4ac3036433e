// The cpu backend: the ops of kernels/backend_ops.inc on the engine's CPU kernels (oneDNN's
// GEMMs, AVX-512 / AVX2 paths chosen at run time, OpenMP over rows). Each op reads the Views'
// dtypes once and calls the typed kernel that runs them.
#pragma once

#include <cstdint>

#include "kernels/attention_layout.h"
#include "kernels/block_pattern.h"
#include "kernels/cpu/isa.h"
#include "kernels/grad_write.h"
#include "kernels/optim.h"
#include "kernels/tensor.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA::cpu {
#include "kernels/backend_ops.inc"
}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA::cpu
