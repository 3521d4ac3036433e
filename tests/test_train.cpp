// Training pieces: optimizers against PyTorch goldens, clipping, schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/weights.h"
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
