#include "kernels/cpu_features.h"

#include <cpuid.h>
#include <dnnl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <stdexcept>

namespace packbert::kernels {

namespace {

constexpr const char* kIsaNames[] = {"sse2", "avx2", "avx512", "avx512_bf16", "amx"};

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

std::string names_of(const CpuFeatures& f) {
  std::string s;
  for (auto [on, name] :
       {std::pair{f.avx2, "avx2"}, std::pair{f.avx512f, "avx512f"},
        std::pair{f.avx512_bf16, "avx512_bf16"}, std::pair{f.amx_bf16, "amx_bf16"}})
    if (on) {
      if (!s.empty()) s.push_back(' ');
      s.append(name);
    }
  return s.empty() ? "sse2" : s;
}

// The cap set by set_max_isa (-1: none), and whether cpu_features() has been built.
std::atomic<int> g_set_cap{-1};
std::atomic<bool> g_features_built{false};

Isa read_cap() {
  if (const int set = g_set_cap.load(); set >= 0) return static_cast<Isa>(set);
  const char* env = std::getenv("PACKBERT_MAX_ISA");
  if (!env || !*env) return Isa::amx;
  try {
    return parse_isa(env);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("PACKBERT_MAX_ISA: ") + e.what());
  }
}

// oneDNN's level for a cap: its kernels then run on what packbert's do.
dnnl_cpu_isa_t onednn_isa(Isa cap) {
  switch (cap) {
    case Isa::sse2:
      return dnnl_cpu_isa_sse41;
    case Isa::avx2:
      return dnnl_cpu_isa_avx2;
    case Isa::avx512:
      return dnnl_cpu_isa_avx512_core;
    case Isa::avx512_bf16:
      return dnnl_cpu_isa_avx512_core_bf16;
    case Isa::amx:
      break;
  }
  return dnnl_cpu_isa_all;
}

CpuFeatures detect() {
  CpuFeatures f;
  f.model = brand_string();
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  // AMX-BF16: CPUID leaf 7, EDX bit 22 (GCC 12's __builtin_cpu_supports does not know it).
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) f.amx_bf16 = (d >> 22) & 1u;
  f.detected = names_of(f);
  const Isa cap = f.cap = read_cap();
  f.avx2 = f.avx2 && cap >= Isa::avx2;
  f.avx512f = f.avx512f && cap >= Isa::avx512;
  f.avx512_bf16 = f.avx512_bf16 && cap >= Isa::avx512_bf16;
  f.amx_bf16 = f.amx_bf16 && cap >= Isa::amx;
  f.capped = names_of(f) != f.detected;
  // oneDNN reads its cap once, before its first kernel: this runs before packbert calls it.
  if (cap != Isa::amx && dnnl_set_max_cpu_isa(onednn_isa(cap)) != dnnl_success)
    throw std::logic_error("PACKBERT_MAX_ISA: oneDNN ran before its cap could be set");
  return f;
}

}  // namespace

const char* isa_name(Isa isa) {
  return kIsaNames[static_cast<int>(isa)];
}

Isa parse_isa(const std::string& name) {
  for (int i = 1; i < static_cast<int>(std::size(kIsaNames)); ++i)
    if (name == kIsaNames[i]) return static_cast<Isa>(i);
  throw std::invalid_argument("unknown instruction set '" + name +
                              "' (expected avx2, avx512, avx512_bf16 or amx)");
}

Isa max_isa() {
  return read_cap();
}

void set_max_isa(Isa isa) {
  if (g_features_built.load())
    throw std::logic_error("set_max_isa after the CPU's features were read");
  g_set_cap.store(static_cast<int>(isa));
}

std::string CpuFeatures::isa() const {
  const std::string used = names_of(*this);
  if (!capped) return used;
  return used + " (PACKBERT_MAX_ISA=" + isa_name(cap) + " on a CPU with " + detected + ")";
}

Isa CpuFeatures::level() const {
  if (amx_bf16) return Isa::amx;
  if (avx512_bf16) return Isa::avx512_bf16;
  if (avx512f) return Isa::avx512;
  if (avx2) return Isa::avx2;
  return Isa::sse2;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures d = detect();
    g_features_built.store(true);
    return d;
  }();
  return f;
}

std::string onednn_bf16_matmul_refusal() {
  static const std::string refusal = [] {
    (void)cpu_features();  // its cap on oneDNN first
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const dnnl::memory::desc a({64, 64}, dt::bf16, tag::ab), b({64, 64}, dt::bf16, tag::ab),
          c({64, 64}, dt::f32, tag::ab);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine);
      (void)pd;
      return std::string();
    } catch (const dnnl::error& e) {
      return std::string(e.what());
    }
  }();
  return refusal;
}

std::string bf16_unavailable_reason() {
  const CpuFeatures& f = cpu_features();
  const char* forced = std::getenv("PACKBERT_CPU_NO_BF16");
  const bool hidden = forced && std::strcmp(forced, "1") == 0;
  // Both must say yes: the CPU (under the cap) has the instructions that make bf16 fast, and
  // oneDNN, which runs the products, builds a bf16 matmul here (ONEDNN_MAX_CPU_ISA may hold it
  // below what the CPU has).
  if (!hidden && (f.avx512_bf16 || f.amx_bf16)) {
    const std::string onednn = onednn_bf16_matmul_refusal();
    if (onednn.empty()) return "";
    std::string why = "`precision` bf16: oneDNN cannot build a bf16 matmul on this " + f.model +
                      " (" + onednn + ")";
    if (const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA"); cap && *cap)
      why += std::string(", ONEDNN_MAX_CPU_ISA=") + cap;
    return why;
  }
  std::string why =
      "`precision` bf16 needs a CPU with AVX512-BF16 or AMX-BF16 instructions; this " + f.model +
      " has neither";
  if (hidden) why += " (PACKBERT_CPU_NO_BF16=1)";
  if (f.capped) why += " that PACKBERT_MAX_ISA=" + std::string(isa_name(f.cap)) + " leaves in use";
  return why + " (bf16 emulation would be slower than fp32)";
}

}  // namespace packbert::kernels
