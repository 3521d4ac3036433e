// Optimizers over the parameter arena: AdamW and LAMB, global-norm clipping, LR schedules.
// Moments live in arenas with the parameters' layout; tensors flagged no_decay (biases and
// LayerNorm) get no weight decay and, in LAMB, no trust ratio.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/device.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "model/bert.h"
#include "model/params.h"
#include "model/precision.h"

namespace packbert::train {

enum class OptimizerKind { adamw, lamb };

// "adamw" or "lamb": the names flags and checkpoints use.
const char* optimizer_name(OptimizerKind kind);
// The kind a name stands for; InputError naming `flag` for any other name.
OptimizerKind parse_optimizer(const std::string& name, const std::string& flag);

// Where the weights and the moments live (`--master-weights`, model/precision.h).
using model::Masters;
using model::masters_name;
using model::parse_masters;

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::lamb;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-6, weight_decay = 0.01;
  Masters masters = Masters::fp32;
  // Stochastic rounding's stream: bits for element i of tensor k at step t are the counter-based
  // draw (seed, key(t, k), i) (rng.h), so they do not depend on threads or shards.
  uint64_t seed = 0;
  kernels::BackendKind backend = kernels::BackendKind::cpu;  // where the updates run
};

// The rounding of the 16-bit masters at `step` (from 1) of element `index` of tensor `tensor`
// (its offset in the arena): 16 random bits each for the weight, the first and the second
// moment.
struct RoundingBits {
  uint16_t weight, m, v;
};
RoundingBits rounding_bits(uint64_t seed, int64_t step, size_t tensor, size_t index);

// AdamW (Loshchilov & Hutter, as torch.optim.AdamW): p -= lr * wd * p, then the bias-corrected
// Adam step p -= lr * m_hat / (sqrt(v_hat) + eps).
// LAMB (You et al. 2019): u = m_hat / (sqrt(v_hat) + eps) + wd * p per tensor, scaled by the
// trust ratio ||p|| / ||u|| (1 when either norm is 0, and for no_decay tensors):
// p -= lr * trust * u.
//
// An optimizer may own a shard [begin, end) of the arena only (ZeRO-1: its moments are that
// long, and step() updates only those parameters). LAMB's trust ratio needs each tensor's whole
// norms: step() sums its shard's part of them and hands the sums to `reduce`, which adds the
// other shards' (an all-reduce across processes) before any parameter moves.
class Optimizer {
 public:
  using Reduce = std::function<void(double* sums, size_t n)>;
  Optimizer(const model::ParamLayout& layout, OptimizerConfig config, size_t begin = 0,
            size_t end = SIZE_MAX);
  // One update with learning rate lr; `step` counts from 1 (bias correction). weights, grads
  // and copy16 span the whole arena; weights are in the masters' DType (config().masters).
  // copy16, when not empty (fp32 masters only), is the 16-bit copy of the weights a 16-bit step
  // multiplies with, rewritten from each updated element in the same pass. The gradient used is
  // grads * grad_scale, the factor applied as each element is read (clipping, the average over
  // micro-batches), so no pass over the gradients scales them first. grads is consumed: LAMB
  // leaves its update direction there. Returns whether every weight written is finite (checked
  // in the same pass).
  //
  // Under 16-bit masters the moments are 16-bit too. Each element is widened, updated in float as
  // above, and written back rounded: stochastically or to nearest (model::rounds_stochastically).
  bool step(kernels::View weights, float* grads, double lr, kernels::View copy16 = {},
            const Reduce& reduce = {}, float grad_scale = 1.0f);
  // The same over fp32 weights with no 16-bit copy.
  bool step(float* params, float* grads, double lr, const Reduce& reduce = {},
            float grad_scale = 1.0f) {
    return step(kernels::View::vector(params, static_cast<int64_t>(layout_.total())), grads, lr, {},
                reduce, grad_scale);
  }
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  // Sets the moments of tensor t (m, v: the whole tensor's) where it lies in this shard.
  void set_moments(const model::TensorSpec& t, const float* m, const float* v);
  // Zeroes both moments of the arena range [first, first + n) where it lies in this shard (a
  // regrown block of a sparse weight starts afresh).
  void zero_moments(size_t first, size_t n);
  int64_t steps() const { return t_; }
  // The moments of [begin(), end()) as held under fp32 masters (std::logic_error under 16-bit
  // masters).
  std::span<float> m() { return m_.span<float>(); }
  std::span<float> v() { return v_.span<float>(); }
  std::span<const float> m() const { return m_.span<const float>(); }
  std::span<const float> v() const { return v_.span<const float>(); }
  // The moments of [begin(), end()) in fp32 under any masters: the optimizer's own, or under
  // 16-bit masters their values widened into `scratch`.
  const float* m_fp32(std::vector<float>& scratch) const;
  const float* v_fp32(std::vector<float>& scratch) const;
  // Bytes of the optimizer state held: the moments, and LAMB's per-tensor norms.
  size_t state_bytes() const;
  void set_steps(int64_t t) { t_ = t; }
  const OptimizerConfig& config() const { return cfg_; }

 private:
  // Adam's bias corrections 1 - beta^t for the step t_.
  std::pair<double, double> bias_corrections() const;
  // Calls f(k, tensor, first, n) for the part [first, first + n) of each tensor k inside this
  // shard.
  template <typename F>
  void each_part(F f) const {
    const std::vector<model::TensorSpec>& tensors = layout_.tensors();
    for (size_t k = 0; k < tensors.size(); ++k) {
      const model::TensorSpec& t = tensors[k];
      const size_t a = std::max(t.offset, begin_), b = std::min(t.offset + t.numel, end_);
      if (a < b) f(k, t, a, static_cast<int64_t>(b - a));
    }
  }
  const model::ParamLayout& layout_;
  OptimizerConfig cfg_;
  size_t begin_, end_;
  kernels::Buffer m_, v_;      // of [begin_, end_), in the masters' DType (the backend's Device)
  std::vector<double> norms_;  // LAMB: per tensor, the squared norms of the weights and update
  int64_t t_ = 0;
};

// One update of the model's weights with lr (BertModel::masters()), rewriting the 16-bit copy
// that steps of `precision` read in the same pass where the optimizer writes that type
// (BertModel::copy16_for_optimizer). Under 16-bit masters the model then widens the tensors it
// also reads in fp32 (BertModel::keep_masters16). The gradient is the model's times grad_scale
// (Optimizer::step); returns whether the weights stayed finite.
bool apply_update(Optimizer& optimizer, model::BertModel& m, double lr, model::Precision precision,
                  float grad_scale = 1.0f);

// The global L2 norm of grads (squares summed in double). With `reduce`, grads are one shard of
// the gradients: the shards' sums of squares are added by it (an all-reduce) first.
double grad_norm(const float* grads, size_t n, const Optimizer::Reduce& reduce = {},
                 kernels::BackendKind backend = kernels::BackendKind::cpu);
// The factor that brings a gradient of global norm `norm` to at most max_norm, as torch's
// clip_grad_norm_: max_norm / (norm + 1e-6) when norm > max_norm > 0, else 1.
float clip_factor(double norm, double max_norm);
// Scales grads in place by clip_factor (no pass when it is 1); returns the norm before
// clipping. `reduce` as in grad_norm.
double clip_grad_norm(float* grads, size_t n, double max_norm, const Optimizer::Reduce& reduce = {},
                      kernels::BackendKind backend = kernels::BackendKind::cpu);

// Linear warmup for `warmup` steps, then polynomial decay (power 1 = linear) to 0 at `total`.
double learning_rate(double base, int64_t step, int64_t warmup, int64_t total, double power = 1.0);

}  // namespace packbert::train
