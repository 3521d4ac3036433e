#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "error.h"
#include "rng.h"

namespace packbert::train {

const char* optimizer_name(OptimizerKind kind) {
  return kind == OptimizerKind::lamb ? "lamb" : "adamw";
}

OptimizerKind parse_optimizer(const std::string& name, const std::string& flag) {
  if (name == "adamw") return OptimizerKind::adamw;
  if (name == "lamb") return OptimizerKind::lamb;
  throw InputError(flag + ": expected adamw|lamb, got '" + name + "'");
}

const char* masters_name(Masters masters) {
  switch (masters) {
    case Masters::fp32:
      return "fp32";
    case Masters::bf16:
      return "bf16";
    case Masters::bf16_rn:
      return "bf16-rn";
  }
  return "?";
}

Masters parse_masters(const std::string& name, const std::string& flag) {
  for (Masters m : {Masters::fp32, Masters::bf16, Masters::bf16_rn})
    if (name == masters_name(m)) return m;
  throw InputError(flag + ": expected fp32|bf16|bf16-rn, got '" + name + "'");
}

namespace {

// The stochastic-rounding stream of tensor `tensor` at `step`.
CounterStream rounding_stream(uint64_t seed, int64_t step, size_t tensor) {
  constexpr uint64_t kRounding = 0x726f756e64ULL;  // "round": apart from dropout's keys
  return {seed, mix64(static_cast<uint64_t>(step) * kGolden64 + tensor) ^ kRounding};
}

}  // namespace

RoundingBits rounding_bits(uint64_t seed, int64_t step, size_t tensor, size_t index) {
  const uint64_t h = rounding_stream(seed, step, tensor)(index);
  return {static_cast<uint16_t>(h), static_cast<uint16_t>(h >> 16), static_cast<uint16_t>(h >> 32)};
}

Optimizer::Optimizer(const model::ParamLayout& layout, OptimizerConfig config, size_t begin,
                     size_t end)
    : layout_(layout),
      cfg_(config),
      begin_(std::min(begin, layout.total())),
      end_(std::min(end, layout.total())),
      bf16_(config.masters != Masters::fp32) {
  if (bf16_)
    m16_.resize(end_ - begin_), v16_.resize(end_ - begin_);
  else
    m_.resize(end_ - begin_, 0.0f), v_.resize(end_ - begin_, 0.0f);
  if (cfg_.kind == OptimizerKind::lamb) norms_.resize(2 * layout.tensors().size());
}

void Optimizer::set_moments(const model::TensorSpec& t, const float* m, const float* v) {
  const size_t a = std::max(t.offset, begin_), b = std::min(t.offset + t.numel, end_);
  if (a >= b) return;
  const float *ms = m + (a - t.offset), *vs = v + (a - t.offset);
  const int64_t n = static_cast<int64_t>(b - a);
  if (bf16_) {  // (values a checkpoint widened from bf16 round back exactly)
    kernels::to_bf16(m16_.data() + (a - begin_), ms, n);
    kernels::to_bf16(v16_.data() + (a - begin_), vs, n);
    return;
  }
  std::copy_n(ms, n, m_.begin() + static_cast<long>(a - begin_));
  std::copy_n(vs, n, v_.begin() + static_cast<long>(a - begin_));
}

void Optimizer::zero_moments(size_t first, size_t n) {
  const size_t a = std::max(first, begin_), b = std::min(first + n, end_);
  if (a >= b) return;
  if (bf16_) {
    std::fill(m16_.begin() + static_cast<long>(a - begin_),
              m16_.begin() + static_cast<long>(b - begin_), kernels::bf16{});
    std::fill(v16_.begin() + static_cast<long>(a - begin_),
              v16_.begin() + static_cast<long>(b - begin_), kernels::bf16{});
    return;
  }
  std::fill(m_.begin() + static_cast<long>(a - begin_), m_.begin() + static_cast<long>(b - begin_),
            0.0f);
  std::fill(v_.begin() + static_cast<long>(a - begin_), v_.begin() + static_cast<long>(b - begin_),
            0.0f);
}

namespace {

// A moment in fp32: `wide` itself, or `narrow` widened into `scratch`.
const float* fp32_of(bool bf16, const std::vector<float>& wide,
                     const std::vector<kernels::bf16>& narrow, std::vector<float>& scratch) {
  if (!bf16) return wide.data();
  scratch.resize(narrow.size());
  kernels::to_float(scratch.data(), narrow.data(), static_cast<int64_t>(narrow.size()));
  return scratch.data();
}

}  // namespace

const float* Optimizer::m_fp32(std::vector<float>& scratch) const {
  return fp32_of(bf16_, m_, m16_, scratch);
}

const float* Optimizer::v_fp32(std::vector<float>& scratch) const {
  return fp32_of(bf16_, v_, v16_, scratch);
}

size_t Optimizer::state_bytes() const {
  return (bf16_ ? 2 * m16_.size() * sizeof(kernels::bf16) : 2 * m_.size() * sizeof(float)) +
         norms_.size() * sizeof(double);
}

namespace {

using kernels::bf16;
using kernels::to_float;

// x in bf16: rounded stochastically with 16 random bits, or to nearest.
template <bool kStochastic>
bf16 round16(float x, uint64_t bits) {
  if constexpr (kStochastic) return kernels::to_bf16_stochastic(x, static_cast<uint16_t>(bits));
  return kernels::to_bf16(x);
}

// One AdamW update over n elements, in double like the PyTorch reference it is checked against.
// Returns how many of the weights written are not finite.
template <bool kMirror>
int64_t adamw_block(float* __restrict p, kernels::bf16* __restrict p16, float* __restrict m,
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
    bad += !kernels::is_finite(p[i]);
    if constexpr (kMirror) p16[i] = kernels::to_bf16(p[i]);
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

// Adam's constants at one step from the optimizer's settings and bias corrections 1 - beta^t.
LambStep adam_step(const OptimizerConfig& c, std::pair<double, double> corrections) {
  const auto [c1, c2] = corrections;
  return {static_cast<float>(c.beta1),     static_cast<float>(c.beta2),
          static_cast<float>(1 - c.beta1), static_cast<float>(1 - c.beta2),
          static_cast<float>(1 / c1),      static_cast<float>(1 / c2),
          static_cast<float>(c.eps)};
}

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
int64_t lamb_apply_block(float* __restrict p, kernels::bf16* __restrict p16,
                         const float* __restrict u, int64_t n, float step) {
  int64_t bad = 0;
#pragma omp simd reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) {
    p[i] -= step * u[i];
    bad += !kernels::is_finite(p[i]);
    if constexpr (kMirror) p16[i] = kernels::to_bf16(p[i]);
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
    bad += !kernels::is_finite(p[i]);
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
    bad += !kernels::is_finite(p[i]);
  }
  return bad;
}

constexpr int64_t kBlock = 16384;  // elements a thread takes at a time

}  // namespace

bool Optimizer::step(float* params, float* grads, double lr, kernels::bf16* params16,
                     const Reduce& reduce, float grad_scale) {
  ++t_;
  if (bf16_) return step16(params16, grads, lr, reduce, grad_scale);
  const double b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
  const auto [c1, c2] = bias_corrections();
  int64_t bad = 0;  // weights written that are not finite
  if (cfg_.kind == OptimizerKind::adamw) {
    each_part([&](size_t, const model::TensorSpec& t, size_t a, int64_t n) {
      float *p = params + a, *m = m_.data() + (a - begin_), *v = v_.data() + (a - begin_);
      kernels::bf16* p16 = params16 ? params16 + a : nullptr;
      const float* g = grads + a;
      const double wd = t.no_decay ? 0.0 : cfg_.weight_decay;
      // Blocks per thread around a plain loop over restrict pointers, which GCC vectorises
      // (it does not under `omp parallel for simd` here).
#pragma omp parallel for schedule(static) reduction(+ : bad)
      for (int64_t i = 0; i < n; i += kBlock) {
        const int64_t w = std::min(kBlock, n - i);
        if (p16)
          bad += adamw_block<true>(p + i, p16 + i, m + i, v + i, g + i, grad_scale, w, lr, wd, b1,
                                   b2, c1, c2, eps);
        else
          bad += adamw_block<false>(p + i, nullptr, m + i, v + i, g + i, grad_scale, w, lr, wd, b1,
                                    b2, c1, c2, eps);
      }
    });
    return bad == 0;
  }
  // LAMB: the moments and each tensor's squared norms of weights and update direction u (left in
  // the gradient's place), summed over the shards; then the trust-scaled step.
  std::fill(norms_.begin(), norms_.end(), 0.0);
  const LambStep k = adam_step(cfg_, {c1, c2});
  each_part([&](size_t t_index, const model::TensorSpec& t, size_t a, int64_t n) {
    const float* p = params + a;
    float *g = grads + a, *m = m_.data() + (a - begin_), *v = v_.data() + (a - begin_);
    const float wd = t.no_decay ? 0.0f : static_cast<float>(cfg_.weight_decay);
    double pn = 0, un = 0;
#pragma omp parallel for schedule(static) reduction(+ : pn, un)
    for (int64_t i = 0; i < n; i += kBlock)
      lamb_moments_block(p + i, g + i, m + i, v + i, grad_scale, std::min(kBlock, n - i), k, wd, pn,
                         un);
    norms_[2 * t_index] = pn, norms_[2 * t_index + 1] = un;
  });
  if (reduce) reduce(norms_.data(), norms_.size());
  each_part([&](size_t t_index, const model::TensorSpec& t, size_t a, int64_t n) {
    float* p = params + a;
    const float* u = grads + a;
    kernels::bf16* p16 = params16 ? params16 + a : nullptr;
    const double pn = std::sqrt(norms_[2 * t_index]), un = std::sqrt(norms_[2 * t_index + 1]);
    const float step =
        static_cast<float>(lr * ((t.no_decay || pn == 0 || un == 0) ? 1.0 : pn / un));
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t w = std::min(kBlock, n - i);
      if (p16)
        bad += lamb_apply_block<true>(p + i, p16 + i, u + i, w, step);
      else
        bad += lamb_apply_block<false>(p + i, nullptr, u + i, w, step);
    }
  });
  return bad == 0;
}

std::pair<double, double> Optimizer::bias_corrections() const {
  return {1.0 - std::pow(cfg_.beta1, static_cast<double>(t_)),
          1.0 - std::pow(cfg_.beta2, static_cast<double>(t_))};
}

bool Optimizer::step16(bf16* params16, float* grads, double lr, const Reduce& reduce, float scale) {
  return cfg_.masters == Masters::bf16 ? step16_rounded<true>(params16, grads, lr, reduce, scale)
                                       : step16_rounded<false>(params16, grads, lr, reduce, scale);
}

template <bool kStochastic>
bool Optimizer::step16_rounded(bf16* params16, float* grads, double lr, const Reduce& reduce,
                               float scale) {
  const LambStep k = adam_step(cfg_, bias_corrections());
  auto bits = [&](size_t tensor) { return rounding_stream(cfg_.seed, t_, tensor); };
  int64_t bad = 0;  // weights written that are not finite
  if (cfg_.kind == OptimizerKind::adamw) {
    each_part([&](size_t t_index, const model::TensorSpec& t, size_t a, int64_t n) {
      bf16 *p = params16 + a, *m = m16_.data() + (a - begin_), *v = v16_.data() + (a - begin_);
      const float* g = grads + a;
      const float decay = static_cast<float>(1.0 - lr * (t.no_decay ? 0.0 : cfg_.weight_decay));
      const CounterStream stream = bits(t_index);
#pragma omp parallel for schedule(static) reduction(+ : bad)
      for (int64_t i = 0; i < n; i += kBlock)
        bad += adamw16_block<kStochastic>(p + i, m + i, v + i, g + i, scale,
                                          std::min(kBlock, n - i), k, static_cast<float>(lr), decay,
                                          stream, a + static_cast<size_t>(i));
    });
    return bad == 0;
  }
  // LAMB as in step(), the direction rebuilt from the rounded moments.
  std::fill(norms_.begin(), norms_.end(), 0.0);
  each_part([&](size_t t_index, const model::TensorSpec& t, size_t a, int64_t n) {
    const bf16* p = params16 + a;
    float* g = grads + a;
    bf16 *m = m16_.data() + (a - begin_), *v = v16_.data() + (a - begin_);
    const float wd = t.no_decay ? 0.0f : static_cast<float>(cfg_.weight_decay);
    const CounterStream stream = bits(t_index);
    double pn = 0, un = 0;
#pragma omp parallel for schedule(static) reduction(+ : pn, un)
    for (int64_t i = 0; i < n; i += kBlock)
      lamb16_moments_block<kStochastic>(p + i, g + i, m + i, v + i, scale, std::min(kBlock, n - i),
                                        k, wd, stream, a + static_cast<size_t>(i), pn, un);
    norms_[2 * t_index] = pn, norms_[2 * t_index + 1] = un;
  });
  if (reduce) reduce(norms_.data(), norms_.size());
  each_part([&](size_t t_index, const model::TensorSpec& t, size_t a, int64_t n) {
    bf16* p = params16 + a;
    const float* u = grads + a;
    const double pn = std::sqrt(norms_[2 * t_index]), un = std::sqrt(norms_[2 * t_index + 1]);
    const float step =
        static_cast<float>(lr * ((t.no_decay || pn == 0 || un == 0) ? 1.0 : pn / un));
    const CounterStream stream = bits(t_index);
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (int64_t i = 0; i < n; i += kBlock)
      bad += lamb16_apply_block<kStochastic>(p + i, u + i, std::min(kBlock, n - i), step, stream,
                                             a + static_cast<size_t>(i));
  });
  return bad == 0;
}

bool apply_update(Optimizer& optimizer, model::BertModel<float>& m, double lr,
                  model::Precision precision, float grad_scale) {
  if (m.masters_in_bf16()) {
    const bool finite =
        optimizer.step(nullptr, m.grads().data(), lr, m.weights16(), {}, grad_scale);
    m.masters16_written();
    return finite;
  }
  const bool bf16 = precision == model::Precision::bf16;
  kernels::bf16* copy = bf16 ? m.weights16() : nullptr;
  const bool finite = optimizer.step(m.params().data(), m.grads().data(), lr, copy, {}, grad_scale);
  if (bf16) m.weights16_written();
  return finite;
}

double grad_norm(const float* grads, size_t n, const Optimizer::Reduce& reduce) {
  double s = 0;
#pragma omp parallel for simd reduction(+ : s)
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(grads[i]) * grads[i];
  if (reduce) reduce(&s, 1);
  return std::sqrt(s);
}

float clip_factor(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

double clip_grad_norm(float* grads, size_t n, double max_norm, const Optimizer::Reduce& reduce) {
  const double norm = grad_norm(grads, n, reduce);
  const float scale = clip_factor(norm, max_norm);
  if (scale != 1.0f) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; ++i) grads[i] *= scale;
  }
  return norm;
}

double learning_rate(double base, int64_t step, int64_t warmup, int64_t total, double power) {
  if (step < warmup) return base * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (total <= warmup) return base;
  double left = 1.0 - static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  return base * std::pow(std::max(left, 0.0), power);
}

}  // namespace packbert::train
