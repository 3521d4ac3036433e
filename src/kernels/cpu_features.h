// What the CPU this process runs on can do, read at run time (packbert never assumes a feature
// from the build machine), and the cap PACKBERT_MAX_ISA puts on it: benchmarks print both,
// `--precision bf16` is refused without the instructions that make it fast, and kernels/ops.cpp
// picks the cpu backend's build for the capped instruction set.
#pragma once

#include <string>

namespace packbert::kernels {

// Instruction-set levels, each including the ones before: what PACKBERT_MAX_ISA names and what
// a build of the cpu kernels was compiled for. `amx` is the top (no cap).
enum class Isa { sse2, avx2, avx512, avx512_bf16, amx };
// "sse2", "avx2", "avx512", "avx512_bf16", "amx".
const char* isa_name(Isa isa);
// The level a name stands for (avx2, avx512, avx512_bf16 or amx); std::invalid_argument naming
// the value and the names otherwise.
Isa parse_isa(const std::string& name);

// The cap: PACKBERT_MAX_ISA, or set_max_isa (a bench's --max-isa) called before the first use
// of cpu_features(); Isa::amx when neither. A bad PACKBERT_MAX_ISA throws std::invalid_argument
// from the first call that reads it (the CLI checks it at start-up).
Isa max_isa();
// Sets the cap for this process. Only before cpu_features() is first called (std::logic_error
// after: the backend and oneDNN have already been chosen by then).
void set_max_isa(Isa isa);

struct CpuFeatures {
  std::string model;  // the brand string, e.g. "AMD EPYC 9R45"
  // What the CPU has, less what the cap hides.
  bool avx2 = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false;
  std::string detected;  // the instruction sets the CPU has, uncapped ("avx2 avx512f ...")
  Isa cap = Isa::amx;    // the cap applied (max_isa() when these were read)
  bool capped = false;   // the cap hides something this CPU has
  // The instruction sets in use, most capable last, e.g. "avx2 avx512f avx512_bf16"; capped,
  // "avx2 (PACKBERT_MAX_ISA=avx2 on a CPU with avx2 avx512f avx512_bf16)".
  std::string isa() const;
  // The highest level present.
  Isa level() const;
};
// The first call also caps oneDNN at the same level when a cap is set.
const CpuFeatures& cpu_features();

// Empty when oneDNN, asked on this machine (under its cap and ONEDNN_MAX_CPU_ISA), creates a bf16
// matmul primitive; otherwise oneDNN's refusal. Asked once.
std::string onednn_bf16_matmul_refusal();

// Empty when bf16 GEMMs run natively and oneDNN builds them here (AVX512-BF16 or AMX-BF16, not
// capped away); otherwise a one-line reason naming the missing feature. PACKBERT_CPU_NO_BF16=1
// makes this CPU look like one without them (tests of the refusal).
std::string bf16_unavailable_reason();

}  // namespace packbert::kernels
