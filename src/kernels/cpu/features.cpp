#include "kernels/cpu/features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace packbert::kernels {

namespace {

std::string brand_string() {
  unsigned regs[12] = {};
  unsigned max_ext = __get_cpuid_max(0x80000000u, nullptr);
  if (max_ext < 0x80000004u) return "unknown CPU";
  for (unsigned i = 0; i < 3; ++i)
    __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2],
                &regs[4 * i + 3]);
  char text[49] = {};
  std::memcpy(text, regs, 48);
  const char* a = text;
  while (*a == ' ') ++a;
  const char* b = text + std::strlen(text);
  while (b > a && b[-1] == ' ') --b;
  return a == b ? std::string("unknown CPU") : std::string(a, b);
}

CpuFeatures detect() {
  CpuFeatures f;
  f.model = brand_string();
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  // AMX-BF16: CPUID leaf 7, EDX bit 22 (GCC 12's __builtin_cpu_supports does not know it).
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) f.amx_bf16 = (d >> 22) & 1u;
  return f;
}

}  // namespace

std::string CpuFeatures::isa() const {
  std::string s;
  for (auto [on, name] : {std::pair{avx2, "avx2"}, std::pair{avx512f, "avx512f"},
                          std::pair{avx512_bf16, "avx512_bf16"}, std::pair{amx_bf16, "amx_bf16"}})
    if (on) {
      if (!s.empty()) s.push_back(' ');
      s.append(name);
    }
  return s.empty() ? "sse" : s;
}

std::string kernel_isa() {
#if defined(__AVX512F__)
  std::string isa = "avx512f";
#elif defined(__AVX2__)
  std::string isa = "avx2";
#else
  std::string isa = "sse2";
#endif
  if (const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA")) isa += std::string(", oneDNN ") + cap;
  return isa;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::string bf16_unavailable_reason() {
  const CpuFeatures& f = cpu_features();
  const char* forced = std::getenv("PACKBERT_CPU_NO_BF16");
  const bool hidden = forced && std::strcmp(forced, "1") == 0;
  if (!hidden && (f.avx512_bf16 || f.amx_bf16)) return "";
  return "`precision` bf16 needs a CPU with AVX512-BF16 or AMX-BF16 instructions; this " + f.model +
         " has neither" + (hidden ? " (PACKBERT_CPU_NO_BF16=1)" : "") +
         " (bf16 emulation would be slower than fp32)";
}

}  // namespace packbert::kernels
