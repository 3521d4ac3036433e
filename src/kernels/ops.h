// The op seam: a Backend is a table of the ops of kernels/backend_ops.inc (ggml-backend's
// interface, Marian's dispatch.h), and the one place a backend is chosen is backend(kind). The
// model and training code call ops through a Backend they are handed, never a backend's
// namespace; the ops read their Views' dtypes and pick the kernel themselves.
//
// A new backend (a GPU's) is a folder kernels/NAME/ whose NAME.h includes backend_ops.inc into
// namespace kernels::NAME and whose files define those functions, one BackendKind, and one row in
// ops.cpp's table.
#pragma once

#include <string>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

namespace packbert::kernels {

enum class BackendKind { cpu, ref };

// Every op of backend_ops.inc, by name.
#define PACKBERT_OPS(X)          \
  X(linear_forward)              \
  X(linear_backward)             \
  X(linear_block_grad_norms)     \
  X(layernorm_forward)           \
  X(layernorm_apply)             \
  X(layernorm_backward)          \
  X(gelu_forward)                \
  X(gelu_backward)               \
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
  const char* name;  // "cpu", "ref": the names parse_backend takes
#define PACKBERT_OP_MEMBER(op) decltype(&cpu::op) op;
  PACKBERT_OPS(PACKBERT_OP_MEMBER)
#undef PACKBERT_OP_MEMBER
};

// The backend of a kind (a static table: its address is stable).
const Backend& backend(BackendKind kind);
// The kind a name ("cpu", "ref") stands for; std::invalid_argument listing the names otherwise.
BackendKind parse_backend(const std::string& name);
// Every kind, in table order.
inline constexpr BackendKind kBackendKinds[] = {BackendKind::cpu, BackendKind::ref};

}  // namespace packbert::kernels
