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

namespace {

// The key of tensor `tensor`'s stochastic-rounding stream at `step`.
uint64_t rounding_key(int64_t step, size_t tensor) {
  constexpr uint64_t kRounding = 0x726f756e64ULL;  // "round": apart from dropout's keys
  return mix64(static_cast<uint64_t>(step) * kGolden64 + tensor) ^ kRounding;
}

}  // namespace

RoundingBits rounding_bits(uint64_t seed, int64_t step, size_t tensor, size_t index) {
  const uint64_t h = counter_bits(seed, rounding_key(step, tensor), index);
  return {static_cast<uint16_t>(h), static_cast<uint16_t>(h >> 16), static_cast<uint16_t>(h >> 32)};
}

Optimizer::Optimizer(const model::ParamLayout& layout, OptimizerConfig config, size_t begin,
                     size_t end)
    : layout_(layout),
      cfg_(config),
      begin_(std::min(begin, layout.total())),
      end_(std::min(end, layout.total())) {
  const kernels::DType dtype = model::masters_dtype(cfg_.masters);
  const int64_t n = static_cast<int64_t>(end_ - begin_);
  kernels::Device& device = kernels::backend(cfg_.backend).device();
  m_ = kernels::Buffer(device, dtype, n);
  v_ = kernels::Buffer(device, dtype, n);
  if (cfg_.kind == OptimizerKind::lamb) norms_.resize(2 * layout.tensors().size());
}

void Optimizer::set_moments(const model::TensorSpec& t, const float* m, const float* v) {
  const size_t a = std::max(t.offset, begin_), b = std::min(t.offset + t.numel, end_);
  if (a >= b) return;
  const int64_t n = static_cast<int64_t>(b - a), at = static_cast<int64_t>(a - begin_);
  // (under 16-bit masters, values a checkpoint widened from them round back exactly)
  const kernels::Backend& be = kernels::backend(cfg_.backend);
  be.convert(m_.view().slice(at, n), kernels::View::vector(m + (a - t.offset), n));
  be.convert(v_.view().slice(at, n), kernels::View::vector(v + (a - t.offset), n));
}

void Optimizer::zero_moments(size_t first, size_t n) {
  const size_t a = std::max(first, begin_), b = std::min(first + n, end_);
  if (a >= b) return;
  const int64_t at = static_cast<int64_t>(a - begin_), count = static_cast<int64_t>(b - a);
  for (const kernels::Buffer* moment : {&m_, &v_}) {
    const kernels::View v = moment->view();
    for (int64_t i = 0; i < count; ++i) v.put(at + i, 0.0);
  }
}

namespace {

// A moment in fp32: itself, or widened into `scratch`.
const float* fp32_of(const kernels::Buffer& moment, std::vector<float>& scratch,
                     kernels::BackendKind backend) {
  if (moment.dtype() == kernels::DType::f32) return moment.span<const float>().data();
  scratch.resize(static_cast<size_t>(moment.size()));
  kernels::backend(backend).convert(kernels::View::vector(scratch.data(), moment.size()),
                                    moment.view());
  return scratch.data();
}

}  // namespace

const float* Optimizer::m_fp32(std::vector<float>& scratch) const {
  return fp32_of(m_, scratch, cfg_.backend);
}

const float* Optimizer::v_fp32(std::vector<float>& scratch) const {
  return fp32_of(v_, scratch, cfg_.backend);
}

size_t Optimizer::state_bytes() const {
  return m_.bytes() + v_.bytes() + norms_.size() * sizeof(double);
}

bool Optimizer::step(kernels::View whole, float* grads, double lr, kernels::View copy16,
                     const Reduce& reduce, float grad_scale) {
  ++t_;
  using kernels::View;
  if (whole.dtype != m_.dtype() || whole.numel() != static_cast<int64_t>(layout_.total()) ||
      (copy16 && (model::is_16bit(cfg_.masters) || copy16.numel() != whole.numel())))
    throw std::logic_error("Optimizer::step: weights or copy do not match the masters or arena");
  const kernels::Backend& be = kernels::backend(cfg_.backend);
  const auto [c1, c2] = bias_corrections();
  // Part [a, a + n) of the arena: the weights (the masters), their 16-bit copy (under a 16-bit
  // step with fp32 masters), the moments and the constants.
  auto weights = [&](size_t a, int64_t n) { return whole.slice(static_cast<int64_t>(a), n); };
  auto copy = [&](size_t a, int64_t n) {
    return copy16 ? copy16.slice(static_cast<int64_t>(a), n) : View();
  };
  auto moments = [&](size_t a, int64_t n) {
    const int64_t at = static_cast<int64_t>(a - begin_);
    return std::pair{m_.view().slice(at, n), v_.view().slice(at, n)};
  };
  auto constants = [&](const model::TensorSpec& t) {
    return kernels::AdamStep{
        lr,        cfg_.beta1, cfg_.beta2, cfg_.eps, c1, c2, t.no_decay ? 0.0 : cfg_.weight_decay,
        grad_scale};
  };
  // (keyed by the tensor's place in the whole model: a pipeline stage rounds as one process)
  auto rounding = [&](size_t tensor, size_t a) {
    const model::TensorSpec& t = layout_.tensors()[tensor];
    kernels::MasterRounding r;
    r.stochastic = model::rounds_stochastically(cfg_.masters);
    r.seed = cfg_.seed, r.key = rounding_key(t_, t.whole_index);
    r.first = t.whole_offset + (a - t.offset);
    return r;
  };
  int64_t bad = 0;  // weights written that are not finite
  if (cfg_.kind == OptimizerKind::adamw) {
    each_part([&](size_t k, const model::TensorSpec& t, size_t a, int64_t n) {
      const auto [m, v] = moments(a, n);
      bad += be.adamw_update(weights(a, n), copy(a, n), m, v, View::vector(grads + a, n),
                             constants(t), rounding(k, a));
    });
    return bad == 0;
  }
  // LAMB: the moments and each tensor's squared norms of weights and update direction u (left in
  // the gradient's place), summed over the shards; then the trust-scaled step.
  std::fill(norms_.begin(), norms_.end(), 0.0);
  each_part([&](size_t k, const model::TensorSpec& t, size_t a, int64_t n) {
    const auto [m, v] = moments(a, n);
    const kernels::SquaredNorms s = be.lamb_direction(weights(a, n), View::vector(grads + a, n), m,
                                                      v, constants(t), rounding(k, a));
    norms_[2 * k] = s.weights, norms_[2 * k + 1] = s.direction;
  });
  if (reduce) reduce(norms_.data(), norms_.size());
  each_part([&](size_t k, const model::TensorSpec& t, size_t a, int64_t n) {
    const double pn = std::sqrt(norms_[2 * k]), un = std::sqrt(norms_[2 * k + 1]);
    const double step = lr * ((t.no_decay || pn == 0 || un == 0) ? 1.0 : pn / un);
    bad +=
        be.lamb_apply(weights(a, n), copy(a, n), View::vector(grads + a, n), step, rounding(k, a));
  });
  return bad == 0;
}

std::pair<double, double> Optimizer::bias_corrections() const {
  return {1.0 - std::pow(cfg_.beta1, static_cast<double>(t_)),
          1.0 - std::pow(cfg_.beta2, static_cast<double>(t_))};
}

bool apply_update(Optimizer& optimizer, model::BertModel& m, double lr, model::Precision precision,
                  float grad_scale) {
  const kernels::View copy = m.copy16_for_optimizer(precision);
  const bool finite = optimizer.step(m.masters(), m.grads().data(), lr, copy, {}, grad_scale);
  if (copy) m.weights16_written();
  m.masters_written();
  return finite;
}

double grad_norm(const float* grads, size_t n, const Optimizer::Reduce& reduce,
                 kernels::BackendKind backend) {
  double s =
      kernels::backend(backend).sum_squares(kernels::View::vector(grads, static_cast<int64_t>(n)));
  if (reduce) reduce(&s, 1);
  return std::sqrt(s);
}

float clip_factor(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

double clip_grad_norm(float* grads, size_t n, double max_norm, const Optimizer::Reduce& reduce,
                      kernels::BackendKind backend) {
  const double norm = grad_norm(grads, n, reduce, backend);
  const float scale = clip_factor(norm, max_norm);
  if (scale != 1.0f)
    kernels::backend(backend).scale(kernels::View::vector(grads, static_cast<int64_t>(n)), scale);
  return norm;
}

double learning_rate(double base, int64_t step, int64_t warmup, int64_t total, double power) {
  if (step < warmup) return base * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (total <= warmup) return base;
  double left = 1.0 - static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  return base * std::pow(std::max(left, 0.0), power);
}

}  // namespace packbert::train
