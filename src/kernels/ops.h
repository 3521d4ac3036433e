// The op seam: a Backend is a table of the ops of kernels/backend_ops.inc (ggml-backend's
// interface, Marian's dispatch.h), and the one place a backend is chosen is backend(kind). The
// model and training code call ops through a Backend they are handed, never a backend's
// namespace; the ops read their Views' dtypes and pick the kernel themselves.
//
// The cpu backend has one row per instruction set the build compiled it for (cpu/isa.h):
// backend(BackendKind::cpu) is the most capable one this CPU runs under PACKBERT_MAX_ISA
// (kernels/cpu_features.h), chosen once.
//
// A new backend (a GPU's) is a folder kernels/NAME/ whose NAME.h includes backend_ops.inc into
// namespace kernels::NAME and whose files define those functions, a Device for its memory
// (kernels/device.h), one BackendKind, and one row in ops.cpp's table.
#pragma once

#include <string>
#include <vector>

#include "kernels/attention_layout.h"
#include "kernels/block_pattern.h"
#include "kernels/cpu_features.h"
#include "kernels/device.h"
#include "kernels/grad_write.h"
#include "kernels/optim.h"
#include "kernels/tensor.h"

namespace packbert::kernels {

enum class BackendKind { cpu, ref };

// The ops' signatures, declared once from the list every backend defines; a Backend's members
// point to functions of these types. (Declared only: nothing defines op_signature::*.)
namespace op_signature {
#include "kernels/backend_ops.inc"
}  // namespace op_signature

// Every op of backend_ops.inc, by name.
#define PACKBERT_OPS(X)          \
  X(sparse_linear_scratch_elems) \
  X(linear_forward)              \
  X(linear_backward)             \
  X(linear_block_grad_norms)     \
  X(layernorm_forward)           \
  X(layernorm_apply)             \
  X(layernorm_backward)          \
  X(gelu_forward)                \
  X(gelu_backward)               \
  X(geglu_forward)               \
  X(geglu_backward)              \
  X(rotary_forward)              \
  X(rotary_backward)             \
  X(tanh_forward)                \
  X(tanh_backward)               \
  X(residual_forward)            \
  X(dropout_forward)             \
  X(dropout_backward)            \
  X(embedding_forward)           \
  X(embedding_backward)          \
  X(cross_entropy_forward)       \
  X(cross_entropy_backward)      \
  X(count_argmax_hits)           \
  X(attention_scratch_elems)     \
  X(attention_forward)           \
  X(attention_backward)          \
  X(gather_rows_forward)         \
  X(gather_rows_backward)        \
  X(span_cross_entropy_forward)  \
  X(span_cross_entropy_backward) \
  X(squared_error_forward)       \
  X(squared_error_backward)      \
  X(convert)                     \
  X(zero)                        \
  X(adamw_update)                \
  X(lamb_direction)              \
  X(lamb_apply)                  \
  X(sum_squares)                 \
  X(scale)

struct Backend {
  BackendKind kind;
  const char* name;     // "cpu", "ref": the names parse_backend takes
  Isa isa;              // what this build of the kernels needs (ref: sse2, plain loops)
  Device& (*device)();  // where its tensors live (cpu and ref: the host's memory)
#define PACKBERT_OP_MEMBER(op) decltype(&op_signature::op) op;
  PACKBERT_OPS(PACKBERT_OP_MEMBER)
#undef PACKBERT_OP_MEMBER
};

// The backend of a kind (a static table: its address is stable). The first call for cpu reads
// the CPU's features, which caps oneDNN where PACKBERT_MAX_ISA asks.
const Backend& backend(BackendKind kind);
// Every build of the cpu backend this CPU can run (under the cap), most capable first: the first
// is backend(BackendKind::cpu). The kernel harness runs each against the reference.
std::vector<const Backend*> cpu_backends();
// What the cpu kernels in use were compiled for and what oneDNN's run on, e.g. "avx2, oneDNN
// avx2": what a bench ran, as against what the CPU has (CpuFeatures::isa).
std::string kernel_isa();
// The kind a name ("cpu", "ref") stands for; std::invalid_argument listing the names otherwise.
BackendKind parse_backend(const std::string& name);
// Every kind, in table order.
inline constexpr BackendKind kBackendKinds[] = {BackendKind::cpu, BackendKind::ref};

}  // namespace packbert::kernels
