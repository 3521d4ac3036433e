// Training pieces: optimizers against PyTorch goldens, clipping, schedules.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/safetensors.h"
#include "model/weights.h"
#include "rng.h"
#include "train/memory_plan.h"
#include "train/optimizer.h"

namespace packbert::train {
namespace {

void check_optimizer(OptimizerKind kind, const char* prefix) {
  io::SafetensorsFile f = io::SafetensorsFile::read(std::string(PACKBERT_SOURCE_DIR) +
                                                    "/tests/golden/optimizers.safetensors");
  model::BertConfig c =
      model::config_from_json(nlohmann::json::parse(f.metadata().at("config")), "optimizer golden");
  model::ParamLayout layout(c, model::Heads{});
  std::vector<float> params(layout.total()), grads(layout.total());
  for (const model::TensorSpec& t : layout.tensors()) {
    auto v = f.floats("params." + t.name, &t.shape);
    std::copy(v.begin(), v.end(), params.begin() + static_cast<long>(t.offset));
  }
  OptimizerConfig cfg;
  cfg.kind = kind;
  Optimizer opt(layout, cfg);
  std::vector<double> lrs = nlohmann::json::parse(f.metadata().at("lrs"));
  for (size_t s = 0; s < lrs.size(); ++s) {
    for (const model::TensorSpec& t : layout.tensors()) {
      auto g = f.floats("grad." + std::to_string(s) + "." + t.name);
      std::copy(g.begin(), g.end(), grads.begin() + static_cast<long>(t.offset));
    }
    opt.step(params.data(), grads.data(), lrs[s]);
    for (const model::TensorSpec& t : layout.tensors()) {
      auto want = f.floats(std::string(prefix) + std::to_string(s) + "." + t.name);
      for (size_t i = 0; i < t.numel; ++i)
        ASSERT_NEAR(params[t.offset + i], want[i], 1e-6 * std::abs(want[i]) + 1e-8)
            << prefix << " step " << s << " " << t.name << "[" << i << "]";
    }
  }
  EXPECT_EQ(opt.steps(), 3);
}

TEST(Optimizer, AdamWMatchesTorchOptimAdamW) {
  check_optimizer(OptimizerKind::adamw, "adamw.");
}
TEST(Optimizer, LambMatchesReference) {
  check_optimizer(OptimizerKind::lamb, "lamb.");
}

TEST(Optimizer, ClipGradNorm) {
  std::vector<float> g = {3, 4};
  EXPECT_NEAR(clip_grad_norm(g.data(), 2, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(std::hypot(g[0], g[1]), 1.0, 1e-5);
  std::vector<float> h = {0.3f, 0.4f};
  clip_grad_norm(h.data(), 2, 1.0);
  EXPECT_FLOAT_EQ(h[0], 0.3f);  // under the limit: untouched
}

// The optimizer's grad_scale is the same as scaling the gradients first (the factor clipping
// and micro-batch averaging fold into the update), bit for bit, for both optimizers; and the
// step reports weights it made non-finite.
TEST(Optimizer, GradScaleEqualsScalingTheGradientsFirstAndNonFiniteWeightsAreReported) {
  model::BertConfig c = model::bert_preset("tiny");
  c.vocab_size = 500;
  const model::ParamLayout layout(c, model::Heads{});
  std::vector<float> w(layout.total()), g(layout.total());
  SplitMix64 rng(3);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = static_cast<float>(static_cast<double>(rng.next() >> 11) * 0x1p-53 - 0.5);
    g[i] = static_cast<float>(static_cast<double>(rng.next() >> 11) * 0x1p-53 - 0.5);
  }
  const float scale = 0.37f;
  for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::lamb}) {
    OptimizerConfig cfg;
    cfg.kind = kind;
    Optimizer folded(layout, cfg), first(layout, cfg);
    std::vector<float> wa = w, wb = w;
    for (int s = 0; s < 3; ++s) {
      std::vector<float> ga = g, gb = g;
      for (float& x : gb) x *= scale;
      EXPECT_TRUE(folded.step(wa.data(), ga.data(), 1e-2, {}, scale));
      EXPECT_TRUE(first.step(wb.data(), gb.data(), 1e-2));
    }
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0)
        << optimizer_name(kind);
    EXPECT_NE(wa, w);
    std::vector<float> ga = g;
    EXPECT_FALSE(folded.step(wa.data(), ga.data(), 1e39, {}, 1.0f)) << optimizer_name(kind);
  }
}

// Stochastic rounding is exactly unbiased: over all 2^16 random inputs, x rounds up for as many
// of them as its distance from the lower neighbour in 2^-16 gaps, so the mean is x itself.
TEST(StochasticRounding, IsExactlyUnbiasedAndLandsOnANeighbour) {
  for (float x : {1.0f, 1.00390625f, 1.001f, -3.14159f, 1e-30f, -7.5e20f, 0.0f, 65504.3f}) {
    const float lo = kernels::to_float(
        kernels::bf16{static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16)});  // toward zero
    double sum = 0;
    for (uint32_t r = 0; r < 65536; ++r) {
      const float y = kernels::to_float(kernels::to_bf16_stochastic(x, static_cast<uint16_t>(r)));
      ASSERT_TRUE(y == lo || std::abs(y) > std::abs(lo)) << x;
      ASSERT_LE(std::abs(y - lo), std::abs(lo) * 0x1p-7 + 1e-45) << x;  // one bf16 gap at most
      sum += y;
    }
    EXPECT_EQ(sum / 65536.0, static_cast<double>(x)) << x;
  }
  EXPECT_TRUE(std::isinf(kernels::to_float(kernels::to_bf16_stochastic(INFINITY, 0xffff))));
  EXPECT_TRUE(std::isnan(kernels::to_float(kernels::to_bf16_stochastic(NAN, 0xffff))));
}

// A model's worth of tensors with bf16 masters: weights random, gradients random.
struct Bf16MasterState {
  model::ParamLayout layout{[] {
                              model::BertConfig c = model::bert_preset("tiny");
                              c.vocab_size = 2000;
                              return c;
                            }(),
                            model::Heads{}};
  std::vector<kernels::bf16> w16;
  std::vector<float> grads;
  Bf16MasterState() {
    std::vector<float> w(layout.total());
    model::init_params(layout, w.data(), 3);
    w16.resize(w.size());
    kernels::to_bf16(w16.data(), w.data(), static_cast<int64_t>(w.size()));
    grads.resize(w.size());
    SplitMix64 rng(5);
    for (float& g : grads)
      g = static_cast<float>(static_cast<double>(rng.next() >> 11) * 0x1p-53 - 0.5);
  }
  std::vector<kernels::bf16> steps(OptimizerKind kind, Masters masters, int n, double lr,
                                   int threads) {
    OptimizerConfig c;
    c.kind = kind, c.masters = masters, c.seed = 11;
    Optimizer opt(layout, c);
    std::vector<kernels::bf16> w = w16;
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    for (int s = 0; s < n; ++s) {
      std::vector<float> g = grads;  // a step consumes its gradient
      opt.step(kernels::View::vector(w.data(), static_cast<int64_t>(w.size())), g.data(), lr);
    }
    omp_set_num_threads(before);
    return w;
  }
};

bool same_bits(const std::vector<kernels::bf16>& a, const std::vector<kernels::bf16>& b) {
  return std::equal(a.begin(), a.end(), b.begin(),
                    [](kernels::bf16 x, kernels::bf16 y) { return x.bits == y.bits; });
}

// The rounding bits are a function of (seed, step, tensor, index): the same on any number of
// threads, and different from round-to-nearest.
TEST(Optimizer, Bf16MastersAreReproducibleOnAnyThreadCount) {
  Bf16MasterState s;
  for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::lamb}) {
    const auto one = s.steps(kind, Masters::bf16, 3, 1e-3, 1);
    EXPECT_TRUE(same_bits(one, s.steps(kind, Masters::bf16, 3, 1e-3, 2)));
    EXPECT_TRUE(same_bits(one, s.steps(kind, Masters::bf16, 3, 1e-3, 1)));
    EXPECT_FALSE(same_bits(one, s.steps(kind, Masters::bf16_rn, 3, 1e-3, 1)));
  }
}

// Under bf16 masters an update is the fp32 optimizer's, rounded: from the same weights (bf16
// values) and gradients, two steps with round-to-nearest land each weight within a bf16 gap
// (half from each rounding) plus 1% of its move of where fp32 masters go, for AdamW and LAMB.
// Most weights move by several gaps (lr 1e-2), so a wrong term (bias correction, trust ratio,
// a moment read back wrong) would show.
TEST(Optimizer, Bf16MastersFollowTheFp32Update) {
  Bf16MasterState s;
  const double lr = 1e-2;
  const int steps = 2;
  for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::lamb}) {
    const std::vector<kernels::bf16> w16 = s.steps(kind, Masters::bf16_rn, steps, lr, 2);
    OptimizerConfig c;
    c.kind = kind;
    Optimizer opt(s.layout, c);
    std::vector<float> w(s.w16.size());
    kernels::to_float(w.data(), s.w16.data(), static_cast<int64_t>(w.size()));
    for (int step = 0; step < steps; ++step) {
      std::vector<float> g = s.grads;
      opt.step(w.data(), g.data(), lr);
    }
    size_t off = 0, far_moved = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      const double start = kernels::to_float(s.w16[i]), got = kernels::to_float(w16[i]);
      // The gap above the larger of the two (they may sit either side of a power of two).
      const double gap =
          std::ldexp(1.0, std::ilogb(std::max({std::abs(got), std::abs(w[i]) * 1.0, 1e-30})) - 7);
      const double moved = std::abs(w[i] - start);
      off += std::abs(got - w[i]) > gap + 0.01 * moved;
      far_moved += moved > 4 * gap;
    }
    EXPECT_EQ(off, 0u) << optimizer_name(kind);
    EXPECT_GT(far_moved, w.size() / 4) << optimizer_name(kind);
  }
}

// An AdamW step moves each weight by about lr: far below half a bf16 gap (2^-9 relative) for
// weights near 1, so round-to-nearest loses every such update while stochastic rounding keeps
// it on average. The weights here: the LayerNorm ones (1.0), whose gap above is 2^-7.
TEST(Optimizer, SmallUpdatesSurviveStochasticRoundingAndVanishToNearest) {
  Bf16MasterState s;
  const double lr = 1e-4;
  std::vector<size_t> ones;
  for (const model::TensorSpec& t : s.layout.tensors())
    if (t.is_layernorm_weight)
      for (size_t i = 0; i < t.numel; ++i) ones.push_back(t.offset + i);
  ASSERT_GT(ones.size(), 500u);
  // How far the weights moved against their gradient, on average.
  auto mean_move = [&](const std::vector<kernels::bf16>& w) {
    double sum = 0;
    for (size_t i : ones) sum += (kernels::to_float(w[i]) - 1.0) * (s.grads[i] > 0 ? -1 : 1);
    return sum / static_cast<double>(ones.size());
  };
  const int n = 40;
  EXPECT_EQ(mean_move(s.steps(OptimizerKind::adamw, Masters::bf16_rn, n, lr, 2)), 0.0);
  // Adam moves every weight by about lr a step against a fixed gradient (m_hat / sqrt(v_hat) =
  // sign(g)). Each stochastic rounding adds noise of up to a gap; averaged over the weights it
  // leaves the sum of the steps.
  EXPECT_NEAR(mean_move(s.steps(OptimizerKind::adamw, Masters::bf16, n, lr, 2)), n * lr,
              0.3 * n * lr);
}

// What plan counts for weights and optimizer state is what the engine holds under bf16 masters; for
// BERT-base that is at most 0.55x of fp32 masters (with their bf16 copy, at the same precision).
TEST(MemoryPlan, Bf16MastersHoldWhatThePlanCounts) {
  PlanRequest r{model::bert_preset("tiny"),
                model::Heads{},
                OptimizerKind::lamb,
                {},
                model::Precision::bf16,
                Masters::bf16,
                {},
                {},
                1};
  r.config.vocab_size = 2000;
  r.shape = uniform_shape(64, 2, 1);
  const StepPlan plan = plan_step(r, model::Recompute{});
  model::BertModel m(r.config, r.heads);
  m.keep_masters16(model::Masters::bf16);
  OptimizerConfig c;
  c.masters = Masters::bf16;
  Optimizer opt(m.layout(), c);
  EXPECT_EQ(plan.params_bytes,
            m.params().size() * sizeof(float) + m.layout().total() * sizeof(kernels::bf16));
  EXPECT_EQ(plan.optimizer_bytes, opt.state_bytes());
  r.masters = Masters::fp32;
  EXPECT_EQ(plan_step(r, model::Recompute{}).optimizer_bytes,
            Optimizer(m.layout(), OptimizerConfig{}).state_bytes());

  PlanRequest base{model::bert_preset("base"),
                   model::Heads{},
                   OptimizerKind::lamb,
                   {},
                   model::Precision::bf16,
                   Masters::bf16,
                   {},
                   {},
                   1};
  base.shape = uniform_shape(2048, 4, 1);
  const StepPlan b16 = plan_step(base, model::Recompute{});
  base.masters = Masters::fp32;
  const StepPlan b32 = plan_step(base, model::Recompute{});
  const double ratio = static_cast<double>(b16.params_bytes + b16.optimizer_bytes) /
                       static_cast<double>(b32.params_bytes + b32.optimizer_bytes);
  EXPECT_LE(ratio, 0.55);
  EXPECT_GE(ratio, 0.40);
}

TEST(Schedule, WarmupThenLinearOrPolynomialDecay) {
  EXPECT_NEAR(learning_rate(1.0, 0, 10, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(1.0, 9, 10, 110), 1.0, 1e-12);
  EXPECT_NEAR(learning_rate(1.0, 10, 10, 110), 1.0, 1e-12);
  EXPECT_NEAR(learning_rate(1.0, 60, 10, 110), 0.5, 1e-12);
  EXPECT_NEAR(learning_rate(1.0, 60, 10, 110, 2.0), 0.25, 1e-12);
  EXPECT_NEAR(learning_rate(1.0, 200, 10, 110), 0.0, 1e-12);
}

}  // namespace
}  // namespace packbert::train
