// The reference backend: every op of kernels/backend_ops.inc as plain loops over Views, one
// element at a time, accumulating in double; no OpenMP, no oneDNN, no intrinsics. It is the
// executable specification (read it first) and the oracle the tests hold the cpu backend to.
// Values are stored where and as the engine stores them: a 16-bit output is the double result
// rounded through fp32 to the View's dtype (View::set), so the 16-bit paths are specified and
// tested on any CPU, with or without bf16 instructions.
#pragma once

#include <cstdint>

#include "kernels/attention_layout.h"
#include "kernels/block_pattern.h"
#include "kernels/grad_write.h"
#include "kernels/optim.h"
#include "kernels/tensor.h"

namespace packbert::kernels::ref {
#include "kernels/backend_ops.inc"
}  // namespace packbert::kernels::ref
