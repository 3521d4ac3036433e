// The cpu backend's optimizer updates (see cpu.h and kernels/backend_ops.inc): each splits its
// tensor into blocks of kBlock elements per thread around a plain loop over restrict pointers,
// which GCC vectorises (it does not under `omp parallel for simd` here).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/cpu.h"
#include "rng.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA::cpu {

namespace {

// x in bf16: rounded stochastically with 16 random bits, or to nearest.
template <bool kStochastic>
bf16 round16(float x, uint64_t bits) {
  if constexpr (kStochastic) return to_bf16_stochastic(x, static_cast<uint16_t>(bits));
  return to_bf16(x);
}

// One AdamW update over n elements, in double like the PyTorch reference it is checked against.
// Returns how many of the weights written are not finite.
template <bool kMirror>
int64_t adamw_block(float* __restrict p, bf16* __restrict p16, float* __restrict m,
                    float* __restrict v, const float* __restrict g, float scale, int64_t n,
                    double lr, double wd, double b1, double b2, double c1, double c2, double eps) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g[i] * scale;
    const double pi = p[i] * (1.0 - lr * wd);
    const double mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    p[i] = static_cast<float>(pi - lr * (mi / c1) / (std::sqrt(vi / c2) + eps));
    bad += !is_finite(p[i]);
    if constexpr (kMirror) p16[i] = to_bf16(p[i]);
  }
  return bad;
}

// LAMB's constants for one step, in float: the element math runs in float (16 lanes), the
// per-tensor norms are summed in double.
struct LambStep {
  float b1, b2, a1, a2, rc1, rc2, eps;  // a = 1 - b (taken in double), rc = 1 / bias correction
  // The update direction m_hat / (sqrt(v_hat) + eps) + wd p.
  float direction(float m, float v, float p, float wd) const {
    return m * rc1 / (std::sqrt(v * rc2) + eps) + wd * p;
  }
};

// LAMB's first pass over n elements: the moments moved by the gradient g * scale, the update
// direction written over the gradient (which nothing reads after the step), and the squared
// norms of the weights and of the direction added to pn and un.
void lamb_moments_block(const float* __restrict p, float* __restrict g, float* __restrict m,
                        float* __restrict v, float scale, int64_t n, const LambStep& k, float wd,
                        double& pn, double& un) {
  double sp = 0, su = 0;
#pragma omp simd reduction(+ : sp, su)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float mi = k.b1 * m[i] + k.a1 * gi, vi = k.b2 * v[i] + k.a2 * gi * gi;
    m[i] = mi, v[i] = vi;
    const float u = k.direction(mi, vi, p[i], wd);
    g[i] = u;
    sp += static_cast<double>(p[i]) * p[i];
    su += static_cast<double>(u) * u;
  }
  pn += sp, un += su;
}

// LAMB's second pass: p -= step * u, the direction the first pass left in u; the bf16 copy
// rewritten alongside when kMirror. Returns how many of the weights written are not finite.
template <bool kMirror>
int64_t lamb_apply_block(float* __restrict p, bf16* __restrict p16, const float* __restrict u,
                         int64_t n, float step) {
  int64_t bad = 0;
#pragma omp simd reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) {
    p[i] -= step * u[i];
    bad += !is_finite(p[i]);
    if constexpr (kMirror) p16[i] = to_bf16(p[i]);
  }
  return bad;
}

// Under bf16 masters: the same updates, each element widened, updated in float and written
// back to bf16 with the bits of rounding_bits (weight: bits 0-15, m: 16-31, v: 32-47) for
// element first + i of the arena, or to nearest. Loops over restrict pointers that GCC
// vectorises, hash included (AVX-512's 64-bit multiplies).

// AdamW: decay = 1 - lr * wd. Returns how many of the weights written are not finite.
template <bool kStochastic>
int64_t adamw16_block(bf16* __restrict p, bf16* __restrict m, bf16* __restrict v,
                      const float* __restrict g, float scale, int64_t n, const LambStep& k,
                      float lr, float decay, CounterStream bits, uint64_t first) {
  int64_t bad = 0;
#pragma omp simd reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float mi = k.b1 * to_float(m[i]) + k.a1 * gi, vi = k.b2 * to_float(v[i]) + k.a2 * gi * gi;
    const float pi = to_float(p[i]) * decay - lr * k.direction(mi, vi, 0.0f, 0.0f);
    const uint64_t h = kStochastic ? bits(first + static_cast<uint64_t>(i)) : 0;
    p[i] = round16<kStochastic>(pi, h);
    m[i] = round16<kStochastic>(mi, h >> 16);
    v[i] = round16<kStochastic>(vi, h >> 32);
    bad += !is_finite(p[i]);
  }
  return bad;
}

// LAMB's first pass: the moments written rounded, the direction rebuilt from them (the moments
// the next step reads) and written over the gradient, the squared norms added to pn and un.
template <bool kStochastic>
void lamb16_moments_block(const bf16* __restrict p, float* __restrict g, bf16* __restrict m,
                          bf16* __restrict v, float scale, int64_t n, const LambStep& k, float wd,
                          CounterStream bits, uint64_t first, double& pn, double& un) {
  double sp = 0, su = 0;
#pragma omp simd reduction(+ : sp, su)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float mi = k.b1 * to_float(m[i]) + k.a1 * gi, vi = k.b2 * to_float(v[i]) + k.a2 * gi * gi;
    const uint64_t h = kStochastic ? bits(first + static_cast<uint64_t>(i)) : 0;
    m[i] = round16<kStochastic>(mi, h >> 16);
    v[i] = round16<kStochastic>(vi, h >> 32);
    const float pi = to_float(p[i]);
    const float u = k.direction(to_float(m[i]), to_float(v[i]), pi, wd);
    g[i] = u;
    sp += static_cast<double>(pi) * pi;
    su += static_cast<double>(u) * u;
  }
  pn += sp, un += su;
}

// LAMB's second pass: p -= step * u, rounded. Returns how many weights written are not finite.
template <bool kStochastic>
int64_t lamb16_apply_block(bf16* __restrict p, const float* __restrict u, int64_t n, float step,
                           CounterStream bits, uint64_t first) {
  int64_t bad = 0;
#pragma omp simd reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) {
    p[i] = round16<kStochastic>(to_float(p[i]) - step * u[i],
                                kStochastic ? bits(first + static_cast<uint64_t>(i)) : 0);
    bad += !is_finite(p[i]);
  }
  return bad;
}

constexpr int64_t kBlock = 16384;  // elements a thread takes at a time

// The sum of body(i, w) over the blocks [i, i + w) of n elements, the blocks split over threads:
// the count of non-finite weights an update wrote.
template <typename F>
int64_t count_over_blocks(int64_t n, F body) {
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t i = 0; i < n; i += kBlock) bad += body(i, std::min(kBlock, n - i));
  return bad;
}

// LAMB's (and bf16 AdamW's) constants from a step's.
LambStep lamb_step(const AdamStep& k) {
  return {static_cast<float>(k.beta1),     static_cast<float>(k.beta2),
          static_cast<float>(1 - k.beta1), static_cast<float>(1 - k.beta2),
          static_cast<float>(1 / k.c1),    static_cast<float>(1 / k.c2),
          static_cast<float>(k.eps)};
}

void require_masters(const View& p, const View& m, const View& v, const View& p16) {
  if (m.dtype != p.dtype || v.dtype != p.dtype || (p.dtype == DType::bf16 && p16) ||
      (p.dtype != DType::f32 && p.dtype != DType::bf16))
    throw std::logic_error("cpu optimizer: weights and moments f32 (a bf16 copy allowed) or bf16");
}

template <bool kStochastic>
int64_t adamw16(const View& p, const View& m, const View& v, const View& g, const AdamStep& k,
                const MasterRounding& r) {
  const int64_t n = p.numel();
  bf16 *pp = p.as<bf16>(), *mm = m.as<bf16>(), *vv = v.as<bf16>();
  const float* gg = g.as<const float>();
  const LambStep ks = lamb_step(k);
  const float decay = static_cast<float>(1.0 - k.lr * k.weight_decay);
  const CounterStream stream(r.seed, r.key);
  return count_over_blocks(n, [&](int64_t i, int64_t w) {
    return adamw16_block<kStochastic>(pp + i, mm + i, vv + i, gg + i, k.grad_scale, w, ks,
                                      static_cast<float>(k.lr), decay, stream,
                                      r.first + static_cast<uint64_t>(i));
  });
}

template <bool kStochastic>
SquaredNorms lamb16_direction(const View& p, const View& g, const View& m, const View& v,
                              const AdamStep& k, const MasterRounding& r) {
  const int64_t n = p.numel();
  const bf16* pp = p.as<const bf16>();
  float* gg = g.as<float>();
  bf16 *mm = m.as<bf16>(), *vv = v.as<bf16>();
  const LambStep ks = lamb_step(k);
  const float wd = static_cast<float>(k.weight_decay);
  const CounterStream stream(r.seed, r.key);
  double pn = 0, un = 0;
#pragma omp parallel for schedule(static) reduction(+ : pn, un)
  for (int64_t i = 0; i < n; i += kBlock)
    lamb16_moments_block<kStochastic>(pp + i, gg + i, mm + i, vv + i, k.grad_scale,
                                      std::min(kBlock, n - i), ks, wd, stream,
                                      r.first + static_cast<uint64_t>(i), pn, un);
  return {pn, un};
}

template <bool kStochastic>
int64_t lamb16_apply(const View& p, const View& u, float step, const MasterRounding& r) {
  const int64_t n = p.numel();
  bf16* pp = p.as<bf16>();
  const float* uu = u.as<const float>();
  const CounterStream stream(r.seed, r.key);
  return count_over_blocks(n, [&](int64_t i, int64_t w) {
    return lamb16_apply_block<kStochastic>(pp + i, uu + i, w, step, stream,
                                           r.first + static_cast<uint64_t>(i));
  });
}

}  // namespace

int64_t adamw_update(View p, View p16, View m, View v, View g, const AdamStep& k,
                     const MasterRounding& rounding) {
  require_masters(p, m, v, p16);
  if (p.dtype == DType::bf16)
    return rounding.stochastic ? adamw16<true>(p, m, v, g, k, rounding)
                               : adamw16<false>(p, m, v, g, k, rounding);
  const int64_t n = p.numel();
  float *pp = p.as<float>(), *mm = m.as<float>(), *vv = v.as<float>();
  bf16* copy = p16 ? p16.as<bf16>() : nullptr;
  const float* gg = g.as<const float>();
  return count_over_blocks(n, [&](int64_t i, int64_t w) {
    if (copy)
      return adamw_block<true>(pp + i, copy + i, mm + i, vv + i, gg + i, k.grad_scale, w, k.lr,
                               k.weight_decay, k.beta1, k.beta2, k.c1, k.c2, k.eps);
    return adamw_block<false>(pp + i, nullptr, mm + i, vv + i, gg + i, k.grad_scale, w, k.lr,
                              k.weight_decay, k.beta1, k.beta2, k.c1, k.c2, k.eps);
  });
}

SquaredNorms lamb_direction(View p, View g, View m, View v, const AdamStep& k,
                            const MasterRounding& rounding) {
  require_masters(p, m, v, View());
  if (p.dtype == DType::bf16)
    return rounding.stochastic ? lamb16_direction<true>(p, g, m, v, k, rounding)
                               : lamb16_direction<false>(p, g, m, v, k, rounding);
  const int64_t n = p.numel();
  const float* pp = p.as<const float>();
  float *gg = g.as<float>(), *mm = m.as<float>(), *vv = v.as<float>();
  const LambStep ks = lamb_step(k);
  const float wd = static_cast<float>(k.weight_decay);
  double pn = 0, un = 0;
#pragma omp parallel for schedule(static) reduction(+ : pn, un)
  for (int64_t i = 0; i < n; i += kBlock)
    lamb_moments_block(pp + i, gg + i, mm + i, vv + i, k.grad_scale, std::min(kBlock, n - i), ks,
                       wd, pn, un);
  return {pn, un};
}

int64_t lamb_apply(View p, View p16, View u, double step, const MasterRounding& rounding) {
  const float s = static_cast<float>(step);
  if (p.dtype == DType::bf16)
    return rounding.stochastic ? lamb16_apply<true>(p, u, s, rounding)
                               : lamb16_apply<false>(p, u, s, rounding);
  const int64_t n = p.numel();
  float* pp = p.as<float>();
  bf16* copy = p16 ? p16.as<bf16>() : nullptr;
  const float* uu = u.as<const float>();
  return count_over_blocks(n, [&](int64_t i, int64_t w) {
    return copy ? lamb_apply_block<true>(pp + i, copy + i, uu + i, w, s)
                : lamb_apply_block<false>(pp + i, nullptr, uu + i, w, s);
  });
}

double sum_squares(View x) {
  const float* g = x.as<const float>();
  const size_t n = static_cast<size_t>(x.numel());
  double s = 0;
#pragma omp parallel for simd reduction(+ : s)
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
  return s;
}

void scale(View x, float factor) {
  float* g = x.as<float>();
  const size_t n = static_cast<size_t>(x.numel());
#pragma omp parallel for simd
  for (size_t i = 0; i < n; ++i) g[i] *= factor;
}

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA::cpu
