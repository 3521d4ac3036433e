#include "kernels/ops.h"

#include <stdexcept>

namespace packbert::kernels {

namespace {

#define PACKBERT_CPU_OP(op) cpu::op,
#define PACKBERT_REF_OP(op) ref::op,
// Indexed by BackendKind: the one place a backend is chosen.
const Backend kBackends[] = {
    {BackendKind::cpu, "cpu", PACKBERT_OPS(PACKBERT_CPU_OP)},
    {BackendKind::ref, "ref", PACKBERT_OPS(PACKBERT_REF_OP)},
};
#undef PACKBERT_CPU_OP
#undef PACKBERT_REF_OP

}  // namespace

const Backend& backend(BackendKind kind) {
  return kBackends[static_cast<size_t>(kind)];
}

BackendKind parse_backend(const std::string& name) {
  for (const Backend& b : kBackends)
    if (name == b.name) return b.kind;
  throw std::invalid_argument("unknown backend '" + name + "' (expected cpu or ref)");
}

}  // namespace packbert::kernels
