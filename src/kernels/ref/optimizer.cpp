// The reference backend's optimizer updates (see ref.h): one element at a time in double,
// written back to the weights' and moments' dtype (bf16 masters rounded as `rounding` says).
#include <cmath>

#include "kernels/ref/ref.h"
#include "rng.h"

namespace packbert::kernels::ref {

namespace {

// Element i of a tensor, written back: to the View's dtype, or for bf16 masters rounded with
// the element's bits (shift: 0 for the weight, 16 and 32 for the moments) when stochastic.
struct Writer {
  const MasterRounding& r;
  void put(const View& x, int64_t i, int shift, double value) const {
    if (x.dtype != DType::bf16 || !r.stochastic) return x.put(i, value);
    const uint64_t bits = counter_bits(r.seed, r.key, r.first + static_cast<uint64_t>(i));
    x.as<bf16>()[i] =
        to_bf16_stochastic(static_cast<float>(value), static_cast<uint16_t>(bits >> shift));
  }
};

bool finite(const View& p, int64_t i) {
  return std::isfinite(p.at(i));
}

}  // namespace

int64_t adamw_update(View p, View p16, View m, View v, View g, const AdamStep& k,
                     const MasterRounding& rounding) {
  const Writer w{rounding};
  int64_t bad = 0;
  for (int64_t i = 0; i < p.numel(); ++i) {
    const double gi = g.at(i) * k.grad_scale;
    const double mi = k.beta1 * m.at(i) + (1 - k.beta1) * gi;
    const double vi = k.beta2 * v.at(i) + (1 - k.beta2) * gi * gi;
    const double pi =
        p.at(i) * (1 - k.lr * k.weight_decay) - k.lr * (mi / k.c1) / (std::sqrt(vi / k.c2) + k.eps);
    w.put(p, i, 0, pi);
    w.put(m, i, 16, mi);
    w.put(v, i, 32, vi);
    if (p16) p16.put(i, p.at(i));
    bad += !finite(p, i);
  }
  return bad;
}

SquaredNorms lamb_direction(View p, View g, View m, View v, const AdamStep& k,
                            const MasterRounding& rounding) {
  const Writer w{rounding};
  SquaredNorms norms;
  for (int64_t i = 0; i < p.numel(); ++i) {
    const double gi = g.at(i) * k.grad_scale;
    w.put(m, i, 16, k.beta1 * m.at(i) + (1 - k.beta1) * gi);
    w.put(v, i, 32, k.beta2 * v.at(i) + (1 - k.beta2) * gi * gi);
    // From the moments as stored: what the next step reads.
    const double u =
        (m.at(i) / k.c1) / (std::sqrt(v.at(i) / k.c2) + k.eps) + k.weight_decay * p.at(i);
    g.put(i, u);
    norms.weights += p.at(i) * p.at(i);
    norms.direction += g.at(i) * g.at(i);
  }
  return norms;
}

int64_t lamb_apply(View p, View p16, View u, double step, const MasterRounding& rounding) {
  const Writer w{rounding};
  int64_t bad = 0;
  for (int64_t i = 0; i < p.numel(); ++i) {
    w.put(p, i, 0, p.at(i) - step * u.at(i));
    if (p16) p16.put(i, p.at(i));
    bad += !finite(p, i);
  }
  return bad;
}

double sum_squares(View x) {
  double s = 0;
  for (int64_t i = 0; i < x.numel(); ++i) s += x.at(i) * x.at(i);
  return s;
}

void scale(View x, float factor) {
  for (int64_t i = 0; i < x.numel(); ++i) x.put(i, x.at(i) * factor);
}

}  // namespace packbert::kernels::ref
