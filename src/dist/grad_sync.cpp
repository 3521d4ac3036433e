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

std::function<void(size_t, size_t)> GradientSync::on_ready(float* grads) {
  if (kind_ == Kind::allreduce)
    return [this, grads](size_t a, size_t e) {
      comm_.start_allreduce(grads + a, e - a);
      comm_.progress();
    };
  if (kind_ == Kind::zero1)
    return [this, grads](size_t a, size_t e) {
      // (the part of the range kept whole is all-reduced; what lies either side, scattered)
      const size_t wa = std::clamp(whole_.first, a, e), we = std::clamp(whole_.second, wa, e);
      if (a < wa) comm_.start_reduce_scatter(grads, a, wa, bounds_);
      if (wa < we) comm_.start_allreduce(grads + wa, we - wa);
      if (we < e) comm_.start_reduce_scatter(grads, we, e, bounds_);
      comm_.progress();
    };
  return {};
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
