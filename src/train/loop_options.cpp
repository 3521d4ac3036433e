// LoopOptions' checks and the loss-scaling flag's text, and the step's guards: the dynamic loss
// scaler's update, the finiteness check and the gradient-norm outlier test.
#include <cmath>
#include <string>

#include "error.h"
#include "train/loop.h"

namespace packbert::train {

std::string loss_scaling_name(const LossScaling& s) {
  if (s.mode == LossScaling::Mode::off) return "off";
  if (s.mode == LossScaling::Mode::dynamic) return "dynamic";
  std::ostringstream out;
  out << std::setprecision(std::numeric_limits<double>::max_digits10) << s.initial;
  return out.str();
}

LossScaling parse_loss_scaling(const std::string& text, const std::string& flag) {
  LossScaling s;
  if (text == "off") return s;
  if (text == "dynamic") {
    s.mode = LossScaling::Mode::dynamic;
    return s;
  }
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end || !(x > 0 && x <= kMaxLossScale))
    throw InputError(flag + ": " + text + ": expected off, dynamic or a scale in (0, 1e300]");
  s.mode = LossScaling::Mode::fixed;
  s.initial = x;
  return s;
}

void LossScaler::update(const LossScaling& s, bool finite) {
  if (s.mode != LossScaling::Mode::dynamic) return;
  if (!finite) {
    scale *= 0.5;
    clean = 0;
    ++overflows;
  } else if (++clean >= s.window) {
    scale = std::min(scale * 2, kMaxLossScale);
    clean = 0;
  }
}

void check_loop_options(const LoopOptions& o) {
  if (o.rows_per_batch < 1) throw OptionError("rows_per_batch", "must be at least 1");
  if (o.accumulation < 1) throw OptionError("accumulation", "must be at least 1");
  if (!(std::isfinite(o.lr) && o.lr > 0))
    throw OptionError("lr", "must be a positive finite number");
  if (o.warmup_steps < 0) throw OptionError("warmup_steps", "must not be negative");
  if (!(o.clip_norm >= 0)) throw OptionError("clip_norm", "must be 0 (off) or positive");
  if (!(o.outlier_z >= 0)) throw OptionError("outlier_z", "must be 0 (off) or positive");
  if (o.nan_abort < 1) throw OptionError("nan_abort", "must be at least 1");
  if (o.zero != 0 && o.zero != 1) throw OptionError("zero", "must be 0 or 1");
  if (o.loss_scaling.on() &&
      !(o.loss_scaling.initial > 0 && o.loss_scaling.initial <= kMaxLossScale))
    throw OptionError("loss_scale_init", "must be in (0, 1e300]");
  if (o.loss_scaling.window < 1) throw OptionError("loss_scale_window", "must be at least 1");
  const Masters masters = o.optimizer.masters;
  if (model::is_16bit(masters) && o.precision != model::precision_of(masters)) {
    const std::string wanted = model::precision_name(model::precision_of(masters));
    throw OptionError("masters", std::string(masters_name(masters)) + " needs `precision` " +
                                     wanted + ": 16-bit master weights are the " + wanted +
                                     " GEMMs' operands");
  }
}

bool all_finite(const float* x, size_t n) {
  int64_t bad = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : bad)
  for (size_t i = 0; i < n; ++i) bad += !kernels::is_finite(x[i]);
  return bad == 0;
}

bool GradNormGuard::is_outlier(double norm, double z) const {
  if (accepted < kMinHistory) return false;
  const int64_t n = std::min<int64_t>(accepted, kWindow);
  double mean = 0, var = 0;
  for (int64_t i = 0; i < n; ++i) mean += recent[static_cast<size_t>(i)];
  mean /= static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    const double d = recent[static_cast<size_t>(i)] - mean;
    var += d * d;
  }
  const double sd = std::sqrt(var / static_cast<double>(n - 1));
  return norm > mean + z * sd;
}

}  // namespace packbert::train
