#include "dist/grad_sync.h"

#include <algorithm>

namespace packbert::dist {

GradientSync::GradientSync(Comm& comm, int zero, size_t total) : comm_(comm) {
  bounds_ = {0, total};
  if (!comm.distributed()) return;
  kind_ = zero == 1 ? Kind::zero1 : Kind::allreduce;
  if (sharded()) bounds_ = shard_bounds(total, comm.size());
}

std::pair<size_t, size_t> GradientSync::shard() const {
  if (!sharded()) return {bounds_.front(), bounds_.back()};
  const size_t r = static_cast<size_t>(comm_.rank());
  return {bounds_[r], bounds_[r + 1]};
}

namespace {

// [a, e) split by the range r: the parts before, inside and after it (each possibly empty).
struct Split {
  size_t a, ra, re, e;
};
Split split(size_t a, size_t e, std::pair<size_t, size_t> r) {
  const size_t ra = std::clamp(r.first, a, e), re = std::clamp(r.second, ra, e);
  return {a, ra, re, e};
}

}  // namespace

std::function<void(size_t, size_t)> GradientSync::on_ready(float* grads) {
  // One range as this process sums it: all-reduced, or reduce-scattered with the part kept whole
  // all-reduced.
  std::function<void(size_t, size_t)> sum;
  if (kind_ == Kind::allreduce)
    sum = [this, grads](size_t a, size_t e) { comm_.start_allreduce(grads + a, e - a); };
  if (kind_ == Kind::zero1)
    sum = [this, grads](size_t a, size_t e) {
      const Split p = split(a, e, whole_);
      if (p.a < p.ra) comm_.start_reduce_scatter(grads, p.a, p.ra, bounds_);
      if (p.ra < p.re) comm_.start_allreduce(grads + p.ra, p.re - p.ra);
      if (p.re < p.e) comm_.start_reduce_scatter(grads, p.re, p.e, bounds_);
    };
  if (!sum) return {};
  return [this, sum](size_t a, size_t e) {
    const Split p = split(a, e, skip_);  // (the skipped part: not summed)
    if (p.a < p.ra) sum(p.a, p.ra);
    if (p.re < p.e) sum(p.re, p.e);
    comm_.progress();
  };
}

void GradientSync::start(float* x, size_t n) {
  if (kind_ != Kind::none) comm_.start_allreduce(x, n);
}

void GradientSync::finish(float*) {
  comm_.wait_all();
}

std::function<void(double*, size_t)> GradientSync::shard_sum() {
  if (!sharded()) return {};
  return [this](double* s, size_t n) { comm_.allreduce_sum(s, n); };
}

void GradientSync::gather(float* weights) {
  if (sharded()) comm_.allgather(weights, bounds_);
}

void GradientSync::gather(uint16_t* weights16) {
  if (sharded()) comm_.allgather(weights16, bounds_);
}

}  // namespace packbert::dist
