// What the CPU this process runs on can do, read at run time (packbert never assumes a feature
// from the build machine): benchmarks print it, and `--precision bf16` is refused without the
// instructions that make it fast.
#pragma once

#include <string>

namespace packbert::kernels {

struct CpuFeatures {
  std::string model;  // the brand string, e.g. "AMD EPYC 9R45"
  bool avx2 = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false;
  // The instruction sets present, most capable last, e.g. "avx2 avx512f avx512_bf16".
  std::string isa() const;
};
const CpuFeatures& cpu_features();

// The instruction set the cpu backend's own kernels were compiled for (the build's -march:
// "avx512f", "avx2" or "sse2"; a build for an older CPU than this one runs its paths), with
// oneDNN's cap appended when ONEDNN_MAX_CPU_ISA is set ("avx2, oneDNN AVX2"): what a bench ran,
// as against what the CPU has (CpuFeatures::isa).
std::string kernel_isa();

// Empty when bf16 GEMMs run natively (AVX512-BF16 or AMX-BF16); otherwise a one-line reason
// naming the missing feature. PACKBERT_CPU_NO_BF16=1 makes this CPU look like one without them
// (tests of the refusal).
std::string bf16_unavailable_reason();

}  // namespace packbert::kernels
