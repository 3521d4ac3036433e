// The number formats a run chooses: the step's precision (`--precision`) and where the master
// weights live (`--master-weights`), each with the DType it stores. This is the one place in
// model/ and train/ that names the 16-bit types: everything else asks these functions and
// kernels::traits, so a new storage type is a row here and in kernels/tensor.h.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/tensor.h"

namespace packbert::model {

// The number format of a step's GEMMs and of the activations it keeps. fp32: everything fp32.
// bf16: GEMM operands (weights, and the activations they multiply) and the kept activations in
// bf16, with fp32 accumulation; LayerNorm statistics, softmax, losses, gradients, master weights
// and optimizer moments stay fp32 (docs/DESIGN.md §7). fp16: the same tensors in IEEE binary16,
// the GEMMs widening them to fp32 (CPUs without AVX512-FP16 have no fp16 product): GPU fp16
// training's numbers (and its need for loss scaling), not its speed.
enum class Precision : uint8_t { fp32, bf16, fp16 };
std::string precision_name(Precision p);
// "fp32", "bf16" or "fp16"; throws InputError naming the text.
Precision parse_precision(const std::string& text);
// The DType the precision stores its 16-bit tensors in (f32 for fp32).
kernels::DType storage_dtype(Precision p);
// Whether the precision stores tensors in 16 bits.
inline bool is_16bit(Precision p) {
  return p != Precision::fp32;
}

// Where the weights and the moments live and how updates are written to them: fp32; bf16
// written with stochastic rounding; bf16 rounded to nearest (the comparison that shows what
// stochastic rounding is for).
enum class Masters { fp32, bf16, bf16_rn };
// "fp32", "bf16" or "bf16-rn": the names flags and checkpoints use.
const char* masters_name(Masters masters);
// The setting a name stands for; InputError naming `flag` for any other name.
Masters parse_masters(const std::string& name, const std::string& flag);
// The DType of the master weights and moments: f32, or the optimizers' one 16-bit type.
kernels::DType masters_dtype(Masters masters);
inline bool is_16bit(Masters masters) {
  return masters != Masters::fp32;
}
// Whether updates to 16-bit masters round stochastically (else to nearest).
inline bool rounds_stochastically(Masters masters) {
  return masters == Masters::bf16;
}
// 16-bit masters are the 16-bit weights the GEMMs read, so they run steps of their own type
// only: that precision (fp32 masters run any).
Precision precision_of(Masters masters);
// Whether an optimizer pass over fp32 weights also rewrites the 16-bit copy that steps of
// precision p multiply with (the optimizers write one 16-bit type); otherwise p's next forward
// rounds the copy afresh from the weights.
bool optimizer_writes_copy(Precision p);

}  // namespace packbert::model
