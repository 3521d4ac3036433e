#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "error.h"

namespace packbert::train {

const char* optimizer_name(OptimizerKind kind) {
  return kind == OptimizerKind::lamb ? "lamb" : "adamw";
}

OptimizerKind parse_optimizer(const std::string& name, const std::string& flag) {
  if (name == "adamw") return OptimizerKind::adamw;
  if (name == "lamb") return OptimizerKind::lamb;
  throw InputError(flag + ": expected adamw|lamb, got '" + name + "'");
}

Optimizer::Optimizer(const model::ParamLayout& layout, OptimizerConfig config)
    : layout_(layout), cfg_(config), m_(layout.total(), 0.0f), v_(layout.total(), 0.0f) {
  size_t largest = 0;
  for (const model::TensorSpec& t : layout.tensors()) largest = std::max(largest, t.numel);
  if (cfg_.kind == OptimizerKind::lamb) u_.resize(largest);
}

namespace {

// One AdamW update over n elements, in double like the PyTorch reference it is checked against.
template <bool kMirror>
void adamw_block(float* __restrict p, kernels::bf16* __restrict p16, float* __restrict m,
                 float* __restrict v, const float* __restrict g, int64_t n, double lr, double wd,
                 double b1, double b2, double c1, double c2, double eps) {
  for (int64_t i = 0; i < n; ++i) {
    const double pi = p[i] * (1.0 - lr * wd);
    const double mi = b1 * m[i] + (1 - b1) * g[i], vi = b2 * v[i] + (1 - b2) * g[i] * g[i];
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    p[i] = static_cast<float>(pi - lr * (mi / c1) / (std::sqrt(vi / c2) + eps));
    if constexpr (kMirror) p16[i] = kernels::to_bf16(p[i]);
  }
}

}  // namespace

void Optimizer::step(float* params, const float* grads, double lr, kernels::bf16* params16) {
  ++t_;
  const double b1 = cfg_.beta1, b2 = cfg_.beta2;
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(t_)),
               c2 = 1.0 - std::pow(b2, static_cast<double>(t_));
  for (const model::TensorSpec& t : layout_.tensors()) {
    float* p = params + t.offset;
    kernels::bf16* p16 = params16 ? params16 + t.offset : nullptr;
    const float* g = grads + t.offset;
    float* m = m_.data() + t.offset;
    float* v = v_.data() + t.offset;
    const double wd = t.no_decay ? 0.0 : cfg_.weight_decay;
    const int64_t n = static_cast<int64_t>(t.numel);
    if (cfg_.kind == OptimizerKind::adamw) {
      const double eps = cfg_.eps;
      // Blocks per thread around a plain loop over restrict pointers, which GCC vectorises
      // (it does not under `omp parallel for simd` here).
      constexpr int64_t kBlock = 16384;
#pragma omp parallel for schedule(static)
      for (int64_t a = 0; a < n; a += kBlock) {
        const int64_t w = std::min(kBlock, n - a);
        if (p16)
          adamw_block<true>(p + a, p16 + a, m + a, v + a, g + a, w, lr, wd, b1, b2, c1, c2, eps);
        else
          adamw_block<false>(p + a, nullptr, m + a, v + a, g + a, w, lr, wd, b1, b2, c1, c2, eps);
      }
      continue;
    }
    // LAMB: first the update direction and both norms, then the trust-scaled step.
    double* u = u_.data();
    double pn = 0, un = 0;
#pragma omp parallel for schedule(static) reduction(+ : pn, un)
    for (int64_t i = 0; i < n; ++i) {
      double mi = b1 * m[i] + (1 - b1) * g[i], vi = b2 * v[i] + (1 - b2) * g[i] * g[i];
      m[i] = static_cast<float>(mi);
      v[i] = static_cast<float>(vi);
      u[i] = (mi / c1) / (std::sqrt(vi / c2) + cfg_.eps) + wd * p[i];
      pn += static_cast<double>(p[i]) * p[i];
      un += u[i] * u[i];
    }
    pn = std::sqrt(pn);
    un = std::sqrt(un);
    const double trust = (t.no_decay || pn == 0 || un == 0) ? 1.0 : pn / un;
    if (p16) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        p[i] = static_cast<float>(p[i] - lr * trust * u[i]);
        p16[i] = kernels::to_bf16(p[i]);
      }
    } else {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(p[i] - lr * trust * u[i]);
    }
  }
}

void apply_update(Optimizer& optimizer, model::BertModel<float>& m, double lr,
                  model::Precision precision) {
  const bool bf16 = precision == model::Precision::bf16;
  kernels::bf16* copy = bf16 ? m.weights16() : nullptr;
  optimizer.step(m.params().data(), m.grads().data(), lr, copy);
  if (bf16) m.weights16_written();
}

double clip_grad_norm(float* grads, size_t n, double max_norm) {
  double s = 0;
#pragma omp parallel for simd reduction(+ : s)
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(grads[i]) * grads[i];
  double norm = std::sqrt(s);
  if (max_norm > 0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
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
