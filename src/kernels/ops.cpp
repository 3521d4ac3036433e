#include "kernels/ops.h"

#include <dnnl.h>

#include <stdexcept>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

#ifdef PACKBERT_CPU_AVX2_BUILD
// The AVX2 build of the cpu backend (CMakeLists.txt compiles it beside a build for AVX-512 or
// for generic x86-64).
namespace packbert::kernels::inline avx2::cpu {
#include "kernels/backend_ops.inc"
}  // namespace packbert::kernels::inline avx2::cpu
#endif

namespace packbert::kernels {

namespace {

// What this file, and so the cpu kernels built with the same flags, were compiled for.
constexpr Isa kBuildIsa =
#if defined(__AVX512F__)
    Isa::avx512;
#elif defined(__AVX2__) && defined(__FMA__)
    Isa::avx2;
#else
    Isa::sse2;
#endif

#define PACKBERT_BUILD_OP(op) PACKBERT_CPU_ISA::cpu::op,
#define PACKBERT_AVX2_OP(op) avx2::cpu::op,
#define PACKBERT_REF_OP(op) ref::op,
// The table: every backend and every build of one, and nowhere else is a backend chosen.
const Backend kCpuOfBuild = {BackendKind::cpu, "cpu", kBuildIsa, &host_device,
                             PACKBERT_OPS(PACKBERT_BUILD_OP)};
#ifdef PACKBERT_CPU_AVX2_BUILD
const Backend kCpuAvx2 = {BackendKind::cpu, "cpu", Isa::avx2, &host_device,
                          PACKBERT_OPS(PACKBERT_AVX2_OP)};
#endif
const Backend kRef = {BackendKind::ref, "ref", Isa::sse2, &host_device,
                      PACKBERT_OPS(PACKBERT_REF_OP)};
#undef PACKBERT_BUILD_OP
#undef PACKBERT_AVX2_OP
#undef PACKBERT_REF_OP

// The cpu rows, most capable first.
std::vector<const Backend*> cpu_builds() {
  std::vector<const Backend*> rows = {&kCpuOfBuild};
#ifdef PACKBERT_CPU_AVX2_BUILD
  rows.insert(kBuildIsa > Isa::avx2 ? rows.end() : rows.begin(), &kCpuAvx2);
#endif
  return rows;
}

const char* onednn_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "another ISA";
  }
}

}  // namespace

std::vector<const Backend*> cpu_backends() {
  const CpuFeatures& cpu = cpu_features();
  std::vector<const Backend*> runnable;
  for (const Backend* b : cpu_builds())
    if (b->isa <= cpu.level()) runnable.push_back(b);
  if (runnable.empty())
    throw std::runtime_error(std::string("this build's cpu kernels need ") +
                             isa_name(cpu_builds().back()->isa) + "; this " + cpu.model + " has " +
                             cpu.isa());
  return runnable;
}

const Backend& backend(BackendKind kind) {
  if (kind == BackendKind::ref) return kRef;
  static const Backend* const chosen = cpu_backends().front();
  return *chosen;
}

BackendKind parse_backend(const std::string& name) {
  for (const BackendKind k : kBackendKinds)
    if (name == (k == BackendKind::ref ? kRef : kCpuOfBuild).name) return k;
  throw std::invalid_argument("unknown backend '" + name + "' (expected cpu or ref)");
}

std::string kernel_isa() {
  const Backend& cpu = backend(BackendKind::cpu);
  return std::string(isa_name(cpu.isa)) + ", oneDNN " +
         onednn_isa_name(dnnl_get_effective_cpu_isa());
}

}  // namespace packbert::kernels
