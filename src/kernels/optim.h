// The constants of one optimizer update, as the optimizer ops of kernels/backend_ops.inc take
// them (train/optimizer.h runs AdamW and LAMB over a model's tensors with them).
#pragma once

#include <cstdint>

namespace packbert::kernels {

// One Adam-family step for one tensor: lr, the betas and eps, the bias corrections
// c1 = 1 - beta1^t and c2 = 1 - beta2^t, the tensor's decoupled weight decay (0 for biases and
// LayerNorm), and the factor each gradient is read with (clipping, the average over
// micro-batches), so no pass over the gradients scales them first.
struct AdamStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-6, c1 = 1, c2 = 1, weight_decay = 0;
  float grad_scale = 1;
};

// How weights and moments held in bf16 (`--master-weights bf16`) are written back: rounded to
// nearest, or stochastically with the counter-based bits (seed, key) of element first + i
// (rng.h): bits 0-15 for the weight, 16-31 for the first moment, 32-47 for the second.
struct MasterRounding {
  bool stochastic = false;
  uint64_t seed = 0, key = 0, first = 0;
};

// The squared norms of a tensor's weights and of its update direction (LAMB's trust ratio).
struct SquaredNorms {
  double weights = 0, direction = 0;
};

}  // namespace packbert::kernels
