// Training pieces: optimizers against PyTorch goldens, clipping, schedules.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

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
      EXPECT_TRUE(folded.step(wa.data(), ga.data(), 1e-2, nullptr, {}, scale));
      EXPECT_TRUE(first.step(wb.data(), gb.data(), 1e-2));
    }
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0)
        << optimizer_name(kind);
    EXPECT_NE(wa, w);
    std::vector<float> ga = g;
    EXPECT_FALSE(folded.step(wa.data(), ga.data(), 1e39, nullptr, {}, 1.0f))
        << optimizer_name(kind);
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
      opt.step(nullptr, g.data(), lr, w.data());
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
                {}};
  r.config.vocab_size = 2000;
  r.shape = uniform_shape(64, 2, 1);
  const StepPlan plan = plan_step(r, model::Recompute{});
  model::BertModel<float> m(r.config, r.heads);
  m.keep_masters_in_bf16();
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
                   {}};
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

// ---- The training loop ----
#include <filesystem>
#include <fstream>
#include <random>

#include "data/pretraining.h"
#include "error.h"
#include "kernels/cpu.h"
#include "train/trainer.h"

namespace packbert::train {
namespace {

namespace fs = std::filesystem;

// A small world: a 40-token vocabulary, a synthetic corpus with learnable structure (Zipf word
// frequencies, and sentences that count upwards half of the time), a tiny model exported as
// the --init directory.
struct World {
  fs::path dir;
  std::string vocab, seqs, packs, init;
  std::string seqs64;  // the same corpus in sequences of up to 64 tokens (a second phase)
  World() {
    dir = fs::temp_directory_path() /
          ("packbert_train_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
    std::vector<std::string> tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (int i = 0; i < 35; ++i) tokens.push_back(std::to_string(i).insert(0, 1, 'w'));
    vocab = (dir / "vocab.txt").string();
    {
      std::ofstream v(vocab);
      for (auto& t : tokens) v << t << "\n";
    }
    data::Vocab vb = data::Vocab::load(vocab);
    std::mt19937 rng(3);
    std::vector<double> weights;
    for (int r = 1; r <= 35; ++r) weights.push_back(1.0 / std::pow(r, 1.5));
    std::vector<data::Document> docs(120);
    for (auto& d : docs)
      for (int s = 0; s < 4; ++s) {
        data::Sentence sent;
        int start = static_cast<int>(rng() % 20), len = 3 + static_cast<int>(rng() % 6);
        std::discrete_distribution<int> zipf(weights.begin(), weights.end());
        bool counting = rng() % 2;
        for (int i = 0; i < len; ++i) sent.push_back(5 + (counting ? (start + i) % 35 : zipf(rng)));
        d.push_back(sent);
      }
    data::PretrainingOptions o;
    o.max_seq_len = 32;
    data::SequencesFile f = data::create_pretraining_data(docs, vb, o);
    seqs = (dir / "d.seqs").string();
    packs = (dir / "d.packs").string();
    data::write_sequences(seqs, f);
    o.max_seq_len = 64;
    seqs64 = (dir / "d64.seqs").string();
    data::write_sequences(seqs64, data::create_pretraining_data(docs, vb, o));
    pack::PackOptions po;
    po.max_len = 32;
    data::write_packs(packs, data::make_packs(f, data::sequences_checksum(seqs),
                                              pack::Algo::optimal, po, 1, nullptr));
    model::BertConfig c;
    c.vocab_size = 40;
    c.hidden_size = 16;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.intermediate_size = 32;
    c.max_position_embeddings = 32;
    model::BertModel<float> m(c, model::Heads{});
    model::init_params(m.layout(), m.params().data(), 7);
    init = (dir / "init").string();
    export_model(m, init, vocab);
  }
  ~World() { fs::remove_all(dir); }
  PretrainOptions options(const std::string& run) const {
    PretrainOptions o;
    o.sequences = seqs;
    o.packs = packs;
    o.vocab = vocab;
    o.init = init;
    o.out_dir = (dir / run).string();
    o.loop.rows_per_batch = 4;
    o.max_steps = 8;
    o.loop.lr = 5e-3;
    o.loop.warmup_steps = 2;
    o.eval_fraction = 0.1;
    o.checkpoint_every = 3;
    return o;
  }
  // A run long and fast enough to learn the corpus: 120 AdamW steps at 1e-2, no checkpoints.
  PretrainOptions learning_options(const std::string& run) const {
    PretrainOptions o = options(run);
    o.max_steps = 120;
    o.loop.lr = 1e-2;
    o.loop.optimizer.kind = OptimizerKind::adamw;
    o.loop.warmup_steps = 10;
    o.checkpoint_every = 0;
    return o;
  }
};

std::vector<double> losses_of(Trainer& t, int64_t stop_after,
                              const std::function<void(int64_t)>& hook = {}) {
  std::vector<double> out;
  std::atomic<bool> stop{false};
  t.run(stop,
        [&](const StepMetrics& s) {
          out.push_back(s.loss);
          if (hook) hook(s.step);
          if (s.step >= stop_after) stop = true;
        },
        {});
  return out;
}

// Steps 1..5 run, but only the step-3 checkpoint survives (as after kill -9); resuming it must
// retrace the uninterrupted run exactly: losses and every weight.
void check_killed_run_resumes_bit_exactly(model::Precision precision,
                                          Masters masters = Masters::fp32,
                                          const std::function<void(PretrainOptions&)>& tweak = {}) {
  World w;
  PretrainOptions o = w.options("full");
  o.loop.precision = precision;
  o.loop.optimizer.masters = masters;
  if (tweak) tweak(o);
  Trainer full(o, false);
  std::vector<double> reference = losses_of(full, 8);
  ASSERT_EQ(reference.size(), 8u);

  PretrainOptions p = w.options("killed");
  p.loop.precision = precision;
  p.loop.optimizer.masters = masters;
  if (tweak) tweak(p);
  std::string saved = (w.dir / "step3.safetensors").string();
  {
    Trainer t(p, false);
    losses_of(t, 5, [&](int64_t step) {
      if (step == 5)
        fs::copy_file(t.checkpoint_path(), saved, fs::copy_options::overwrite_existing);
    });
  }
  fs::copy_file(saved, p.out_dir + "/checkpoint.safetensors", fs::copy_options::overwrite_existing);
  Trainer resumed(p, true);
  EXPECT_EQ(resumed.step(), 3);
  std::vector<double> after = losses_of(resumed, 8);
  ASSERT_EQ(after.size(), 5u);
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_EQ(after[i], reference[3 + i]) << "step " << 3 + i;
  EXPECT_EQ(resumed.model().params(), full.model().params());
  const size_t n = full.model().layout().total();
  std::vector<float> a, b;
  const float* weights = resumed.model().weights_fp32(a);
  EXPECT_TRUE(std::equal(weights, weights + n, full.model().weights_fp32(b)));
  const float* moment = resumed.optimizer().v_fp32(a);
  EXPECT_TRUE(std::equal(moment, moment + n, full.optimizer().v_fp32(b)));
  const auto& pr = resumed.model().patterns();
  const auto& pf = full.model().patterns();
  ASSERT_EQ(pr.size(), pf.size());
  for (size_t l = 0; l < pr.size(); ++l) {
    EXPECT_EQ(pr[l].qkv.slot_row, pf[l].qkv.slot_row) << "layer " << l;
    EXPECT_EQ(pr[l].qkv.slot_col, pf[l].qkv.slot_col) << "layer " << l;
    EXPECT_EQ(pr[l].inter.slot_col, pf[l].inter.slot_col) << "layer " << l;
    EXPECT_EQ(pr[l].out.slot_row, pf[l].out.slot_row) << "layer " << l;
  }
}

TEST(Trainer, KilledRunResumesBitExactly) {
  check_killed_run_resumes_bit_exactly(model::Precision::fp32);
}

// Block-sparse training with pattern updates at steps 2, 4 and 6 (around the step-3 checkpoint):
// the checkpoint holds the patterns, and the regrowth draws are keyed by (seed, step, tensor), so
// the resumed run moves the same blocks (random and gradient regrow). Resuming with another
// sparsity is refused.
TEST(Trainer, KilledSparseRunResumesBitExactly) {
  for (const Regrow regrow : {Regrow::random, Regrow::gradient})
    check_killed_run_resumes_bit_exactly(model::Precision::fp32, Masters::fp32,
                                         [regrow](PretrainOptions& o) {
                                           o.sparse.sparsity = {8, 0.5};
                                           o.sparse.updates = 4;
                                           o.sparse.regrow = regrow;
                                         });
  World w;
  PretrainOptions o = w.options("switch");
  o.sparse.sparsity = {8, 0.5};
  o.max_steps = 2;
  {
    Trainer t(o, false);
    losses_of(t, 2);
  }
  o.sparse.sparsity = {4, 0.5};
  o.max_steps = 4;
  try {
    Trainer t(o, true);
    FAIL() << "resumed a --block 8 checkpoint with --block 4";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with --block 8 --sparsity 0.5"),
              std::string::npos)
        << e.what();
  }
}

// A new sparse model under --sparse-init fan-in starts from the same draws as under dense, its
// block-sparse weights scaled by 1/sqrt(kept fraction) and nothing else changed; the checkpoint
// records the choice. fan-in with --init (weights from a model) is refused.
TEST(Trainer, FanInSparseInitScalesTheNewSparseWeights) {
  World w;
  auto start = [&](const std::string& run, model::SparseInit init) {
    PretrainOptions o = w.options(run);
    o.init.clear();
    o.shape.preset = "tiny";
    o.sparse.sparsity = {4, 0.9};
    o.sparse.init = init;
    o.max_steps = 1;
    o.checkpoint_every = 0;
    return std::make_unique<Trainer>(o, false);
  };
  auto dense = start("init_dense", model::SparseInit::dense);
  auto fan_in = start("init_fan_in", model::SparseInit::fan_in);
  const std::vector<float>& a = dense->model().params();
  const std::vector<float>& f = fan_in->model().params();
  ASSERT_EQ(a.size(), f.size());
  int scaled = 0;
  for (const model::TensorSpec& t : fan_in->model().layout().tensors()) {
    const double factor = model::sparse_init_factor(t, model::SparseInit::fan_in);
    scaled += t.block > 0;
    EXPECT_EQ(factor > 2.5, t.block > 0) << t.name;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i)
      ASSERT_NEAR(f[i], a[i] * factor, 1e-6 * std::abs(f[i])) << t.name;
  }
  EXPECT_GT(scaled, 0);
  std::atomic<bool> stop{false};
  fan_in->run(stop, {}, {});
  const auto meta =
      io::SafetensorsFile::read((w.dir / "init_fan_in" / "checkpoint.safetensors").string());
  EXPECT_EQ(nlohmann::json::parse(meta.metadata().at("packbert"))["sparsity"]["init"], "fan-in");
  {  // resumed without the flag, the run still records how its weights started
    PretrainOptions r = w.options("init_fan_in");
    r.init.clear();
    r.sparse.sparsity = {4, 0.9};
    r.max_steps = 2;
    r.checkpoint_every = 0;
    Trainer resumed(r, true);
    resumed.run(stop, {}, {});
  }
  const auto again =
      io::SafetensorsFile::read((w.dir / "init_fan_in" / "checkpoint.safetensors").string());
  const nlohmann::json resumed_state = nlohmann::json::parse(again.metadata().at("packbert"));
  EXPECT_EQ(resumed_state["step"], 2);  // written by the resumed run
  EXPECT_EQ(resumed_state["sparsity"]["init"], "fan-in");

  PretrainOptions o = w.options("init_both");
  o.sparse.sparsity = {4, 0.9};
  o.sparse.init = model::SparseInit::fan_in;
  EXPECT_THROW(Trainer(o, false), OptionError);
}

// A sparse run started from a dense model keeps each weight's blocks of largest L1 norm; its
// export is dense (zeros outside the pattern) and loads anywhere as those weights; loading its
// checkpoint without sparsity gives the same dense weights.
TEST(Trainer, SparseRunPrunesItsDenseInitAndExportsDense) {
  World w;
  PretrainOptions o = w.options("sparse");
  o.sparse.sparsity = {4, 0.75};
  o.max_steps = 2;
  Trainer t(o, false);
  auto dense_init = load_model(w.init, model::Heads{});
  for (const model::SparseTensor& st : t.model().sparse_tensors()) {
    const model::TensorSpec* d = dense_init->layout().find(st.spec->name);
    const float* init_w = dense_init->params().data() + d->offset;
    const int rows = static_cast<int>(st.spec->shape[0]),
              cols = static_cast<int>(st.spec->shape[1]);
    const kernels::BlockPattern top =
        kernels::top_blocks_by_l1(init_w, rows, cols, 4, st.spec->kept_blocks);
    std::vector<int32_t> r, c;
    model::tensor_slots(st, r, c);
    EXPECT_EQ(r, top.slot_row) << st.spec->name;
    EXPECT_EQ(c, top.slot_col) << st.spec->name;
    const std::vector<float> kept =
        model::dense_weight(st, t.model().params().data() + st.spec->offset);
    for (int64_t i = 0; i < rows * cols; ++i)
      if (kept[i] != 0.0f) {
        EXPECT_EQ(kept[i], init_w[i]) << st.spec->name << "[" << i << "]";
      }
  }
  std::atomic<bool> stop{false};
  t.run(stop, {}, {});
  const std::string out = (w.dir / "exported").string();
  export_model(t.model(), out, w.vocab);
  auto exported = load_model(out, model::Heads{});
  auto from_checkpoint = load_model(t.checkpoint_path(), model::Heads{});
  EXPECT_EQ(exported->params(), from_checkpoint->params());
  for (const model::SparseTensor& st : t.model().sparse_tensors()) {
    const std::vector<float> dense =
        model::dense_weight(st, t.model().params().data() + st.spec->offset);
    const float* got = exported->params().data() + exported->layout().find(st.spec->name)->offset;
    EXPECT_TRUE(std::equal(dense.begin(), dense.end(), got)) << st.spec->name;
    int64_t zeros = 0;
    for (float v : dense) zeros += v == 0.0f;
    EXPECT_GE(zeros, static_cast<int64_t>(0.75 * static_cast<double>(dense.size())))
        << st.spec->name;
  }
}

// bf16: the checkpoint holds the fp32 masters; the resumed run's bf16 weight copy is rebuilt from
// them and equals the one the optimizer pass wrote, so resume stays bit-exact. Resuming under
// another precision is refused, naming the one the checkpoint was trained with.
TEST(Trainer, KilledBf16RunResumesBitExactlyAndKeepsItsPrecision) {
  if (!kernels::bf16_unavailable_reason().empty())
    GTEST_SKIP() << kernels::bf16_unavailable_reason();
  check_killed_run_resumes_bit_exactly(model::Precision::bf16);
  World w;
  PretrainOptions o = w.options("switch");
  o.loop.precision = model::Precision::bf16;
  o.max_steps = 2;
  {
    Trainer t(o, false);
    losses_of(t, 2);
  }
  o.loop.precision = model::Precision::fp32;
  o.max_steps = 4;
  try {
    Trainer t(o, true);
    FAIL() << "resumed a bf16 checkpoint under fp32";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with --precision bf16"), std::string::npos)
        << e.what();
  }
}

// bf16 master weights: the checkpoint holds the masters and moments widened to fp32, which
// round back to the same bf16 bits, so resume is bit-exact (the stochastic rounding bits are a
// function of seed, step, tensor and index, not of the run's history). Resuming with other
// masters is refused.
TEST(Trainer, KilledBf16MastersRunResumesBitExactly) {
  if (!kernels::bf16_unavailable_reason().empty())
    GTEST_SKIP() << kernels::bf16_unavailable_reason();
  check_killed_run_resumes_bit_exactly(model::Precision::bf16, Masters::bf16);
  World w;
  PretrainOptions o = w.options("switch");
  o.loop.precision = model::Precision::bf16;
  o.loop.optimizer.masters = Masters::bf16;
  o.max_steps = 2;
  {
    Trainer t(o, false);
    losses_of(t, 2);
    // The masters are bf16 values and the model keeps only the small tensors in fp32.
    EXPECT_TRUE(t.model().masters_in_bf16());
    EXPECT_EQ(t.model().params().size(), model::fp32_kept_arena(t.model().layout()).total);
    EXPECT_LT(t.model().params().size() * 4, t.model().layout().total());
  }
  o.loop.optimizer.masters = Masters::bf16_rn;
  o.max_steps = 4;
  try {
    Trainer t(o, true);
    FAIL() << "resumed a bf16-master checkpoint with round-to-nearest masters";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with --master-weights bf16"),
              std::string::npos)
        << e.what();
  }
}

// ---- Loss scaling ----

// PyTorch GradScaler's rule: an overflow halves the scale (and is counted), the window-th clean
// step in a row doubles it; fixed scales and `off` never change.
TEST(LossScaling, OverflowHalvesAndACleanWindowDoubles) {
  LossScaling dynamic;
  dynamic.mode = LossScaling::Mode::dynamic;
  dynamic.initial = 1024;
  dynamic.window = 3;
  LossScaler s(dynamic);
  std::vector<double> scales;
  for (bool finite : {true, true, true, true, false, true, true, false, false, true, true, true}) {
    s.update(dynamic, finite);
    scales.push_back(s.scale);
  }
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 2048, 2048, 1024, 1024, 1024, 512, 256, 256,
                                         256, 512}));
  EXPECT_EQ(s.overflows, 3);
  EXPECT_EQ(s.clean, 0);
  LossScaling fixed = parse_loss_scaling("128", "--loss-scale");
  EXPECT_EQ(fixed.mode, LossScaling::Mode::fixed);
  LossScaler f(fixed);
  f.update(fixed, false);
  EXPECT_EQ(f.scale, 128);
  EXPECT_EQ(LossScaler(parse_loss_scaling("off", "--loss-scale")).scale, 1);
  EXPECT_EQ(loss_scaling_name(parse_loss_scaling("dynamic", "--loss-scale")), "dynamic");
  EXPECT_EQ(loss_scaling_name(fixed), "128");
  EXPECT_NE(loss_scaling_name(parse_loss_scaling("1048577", "--loss-scale")),
            loss_scaling_name(parse_loss_scaling("1048576", "--loss-scale")));
  for (const char* bad : {"0", "-4", "1e301", "nan", "inf", "dynamc", ""})
    EXPECT_THROW(parse_loss_scaling(bad, "--loss-scale"), InputError) << bad;
}

// Scaling by a power of two and dividing it out again is exact in binary floating point, so a
// run with a fixed scale of 2^20 must retrace the unscaled run bit for bit (losses, gradient
// norms, weights). A scale applied to backward but not divided out (or divided out twice, or after
// the clip) changes the updates. In fp32 and, where the CPU has it, bf16 (whose bf16 rounding of
// the output gradients commutes with a power of two as well).
TEST(LossScaling, APowerOfTwoScaleChangesNoBit) {
  World w;
  std::vector<model::Precision> precisions = {model::Precision::fp32};
  if (kernels::bf16_unavailable_reason().empty()) precisions.push_back(model::Precision::bf16);
  for (const model::Precision precision : precisions) {
    auto run = [&](const std::string& scale) {
      PretrainOptions o = w.options("pow2_" + model::precision_name(precision) + "_" + scale);
      o.checkpoint_every = 0;
      o.max_steps = 5;
      o.loop.clip_norm = 0.05;  // so the clip acts
      o.loop.accumulation = 2;
      o.loop.precision = precision;
      o.loop.loss_scaling = parse_loss_scaling(scale, "--loss-scale");
      Trainer t(o, false);
      std::vector<double> trace;
      std::atomic<bool> stop{false};
      t.run(stop,
            [&](const StepMetrics& s) {
              EXPECT_FALSE(s.skipped) << s.skip_reason;
              EXPECT_EQ(s.loss_scale, scale == "off" ? 1 : 1048576);
              EXPECT_GT(s.grad_norm, o.loop.clip_norm) << "the clip does not act";
              trace.push_back(s.loss);
              trace.push_back(s.grad_norm);
            },
            {});
      std::vector<float> copy;
      const float* w32 = t.model().weights_fp32(copy);
      trace.insert(trace.end(), w32, w32 + t.model().layout().total());
      return trace;
    };
    const std::vector<double> plain = run("off"), scaled = run("1048576");
    ASSERT_EQ(plain.size(), scaled.size());
    EXPECT_TRUE(plain == scaled) << model::precision_name(precision);
  }
}

// Issue #10's overflow test: a huge first scale (2^140, past fp32's range) overflows the
// gradients; each such step is skipped, leaves every weight and the optimizer untouched, and
// halves the scale, until the gradients fit and training proceeds (a gradient that grows later
// may overflow again, with the same effect). The steps skipped do not count towards --nan-abort.
TEST(LossScaling, OverflowSkipsStepsAndHalvesTheScaleUntilTrainingProceeds) {
  World w;
  PretrainOptions o = w.options("overflow");
  o.checkpoint_every = 0;
  o.max_steps = 40;
  o.loop.loss_scaling.mode = LossScaling::Mode::dynamic;
  o.loop.loss_scaling.initial = std::ldexp(1.0, 140);
  o.loop.nan_abort = 2;
  Trainer t(o, false);
  std::vector<float> before = t.model().params();
  int64_t skipped = 0, applied = 0, first_applied = 0;
  double scale = o.loop.loss_scaling.initial;
  std::atomic<bool> stop{false};
  t.run(stop,
        [&](const StepMetrics& s) {
          const std::vector<float>& after = t.model().params();
          EXPECT_EQ(s.loss_scale, scale) << "step " << s.step;
          if (s.skipped) {
            EXPECT_EQ(s.skip_reason, "loss-scale overflow") << "step " << s.step;
            EXPECT_TRUE(after == before) << "a skipped step moved the weights, step " << s.step;
            ++skipped;
            scale /= 2;
          } else {
            EXPECT_TRUE(std::isfinite(s.grad_norm));
            EXPECT_FALSE(after == before) << "an applied step left the weights, step " << s.step;
            if (applied++ == 0) first_applied = s.step;
          }
          EXPECT_EQ(t.optimizer().steps(), applied) << "step " << s.step;
          before = after;
        },
        {});
  EXPECT_GE(first_applied, 11) << "2^140 should overflow for at least 10 steps";
  EXPECT_GE(applied, 20);
  EXPECT_EQ(skipped + applied, 40);
  EXPECT_EQ(t.overflow_skips(), skipped);
  EXPECT_EQ(t.loss_scale(), std::ldexp(1.0, 140 - static_cast<int>(skipped)));
  std::cerr << skipped << " steps skipped (training from step " << first_applied
            << "); the scale ended at 2^" << 140 - skipped << "\n";
}

// A dynamic-scaling run killed after its step-3 checkpoint resumes bit-exactly: the scale, its
// clean-step count and the overflows are in the checkpoint. A window of 2 from 2^127 makes the
// scale grow past what the gradients take and fall again around the checkpoint (2^127 for steps
// 1-2, 2^128 for 3-4, an overflow at 2^129 on step 5).
TEST(LossScaling, KilledDynamicRunResumesBitExactly) {
  check_killed_run_resumes_bit_exactly(model::Precision::fp32, Masters::fp32,
                                       [](PretrainOptions& o) {
                                         o.loop.loss_scaling.mode = LossScaling::Mode::dynamic;
                                         o.loop.loss_scaling.initial = std::ldexp(1.0, 127);
                                         o.loop.loss_scaling.window = 2;
                                       });
}

// fp16: the checkpoint holds the fp32 masters, the loss scale and its clean-step count; the
// resumed run's fp16 weight copy is rebuilt from the masters. A window of 2 from 2^20 makes the
// scale climb past what fp16's range (65504) takes for the scaled logit gradients, so steps
// overflow and the scale falls again on both sides of the step-3 checkpoint.
TEST(Trainer, KilledFp16RunResumesBitExactly) {
  check_killed_run_resumes_bit_exactly(model::Precision::fp16, Masters::fp32,
                                       [](PretrainOptions& o) {
                                         o.loop.loss_scaling.mode = LossScaling::Mode::dynamic;
                                         o.loop.loss_scaling.initial = std::ldexp(1.0, 20);
                                         o.loop.loss_scaling.window = 2;
                                       });
}

// Under fp16 the range runs out long before fp32's: a start at 2^40 (which fp32 takes without
// trouble) overflows fp16's gradients, and the dynamic scaler halves its way down, skipping those
// steps without touching the weights, until the scaled gradients fit; then training proceeds.
TEST(LossScaling, Fp16OverflowsWhereFp32DoesNotAndTheScalerRecovers) {
  World w;
  auto run = [&](model::Precision precision) {
    PretrainOptions o = w.options("overflow_" + model::precision_name(precision));
    o.checkpoint_every = 0;
    o.max_steps = 30;
    o.loop.loss_scaling.mode = LossScaling::Mode::dynamic;
    o.loop.loss_scaling.initial = std::ldexp(1.0, 40);
    o.loop.nan_abort = 2;
    o.loop.precision = precision;
    Trainer t(o, false);
    std::vector<float> before = t.model().params();
    int64_t skipped = 0, applied = 0;
    std::atomic<bool> stop{false};
    t.run(stop,
          [&](const StepMetrics& s) {
            const std::vector<float>& after = t.model().params();
            if (s.skipped) {
              EXPECT_EQ(s.skip_reason, "loss-scale overflow") << "step " << s.step;
              EXPECT_TRUE(after == before) << "a skipped step moved the weights, step " << s.step;
              EXPECT_EQ(applied, 0) << "an overflow after training proceeded, step " << s.step;
              ++skipped;
            } else {
              ++applied;
            }
            before = after;
          },
          {});
    EXPECT_EQ(t.overflow_skips(), skipped);
    return skipped;
  };
  EXPECT_EQ(run(model::Precision::fp32), 0) << "fp32 overflowed at 2^40";
  const int64_t skipped = run(model::Precision::fp16);
  EXPECT_GE(skipped, 10) << "fp16's scaled gradients fit at 2^" << 40 - skipped;
  EXPECT_LE(skipped, 27) << "training never proceeded";
  std::cerr << "fp16: " << skipped << " steps skipped, training at 2^" << 40 - skipped << "\n";
}

// Trains `o` (learning_options) and checks it learned the corpus: held-out loss down by 0.5 and
// accuracy up by 0.1.
void check_learns(const PretrainOptions& o) {
  Trainer t(o, false);
  EvalMetrics before = t.evaluate();
  std::atomic<bool> stop{false};
  t.run(stop, {}, {});
  EvalMetrics after = t.evaluate();
  EXPECT_LT(after.mlm_loss, before.mlm_loss - 0.5) << before.mlm_loss << " -> " << after.mlm_loss;
  EXPECT_GT(after.mlm_acc, before.mlm_acc + 0.1) << before.mlm_acc << " -> " << after.mlm_acc;
  std::cerr << "mlm loss " << before.mlm_loss << " -> " << after.mlm_loss << ", acc "
            << before.mlm_acc << " -> " << after.mlm_acc << "\n";
}

TEST(Trainer, LearnsTheSyntheticCorpus) {
  World w;
  check_learns(w.learning_options("learn"));
}

// Block-sparse weights (1 x 1 and 8 x 8, half the blocks, patterns updated along the way) still
// learn the corpus.
TEST(Trainer, LearnsTheSyntheticCorpusBlockSparse) {
  World w;
  for (const int block : {1, 8}) {
    PretrainOptions o = w.learning_options("learn" + std::to_string(block));
    o.sparse.sparsity = {block, 0.5};
    o.sparse.updates = 10;
    o.sparse.lr_scale = 1;
    check_learns(o);
  }
}

// fp16 activations with dynamic loss scaling (fp16's default) learn it too.
TEST(Trainer, LearnsTheSyntheticCorpusInFp16) {
  World w;
  PretrainOptions o = w.learning_options("learn16");
  o.loop.precision = model::Precision::fp16;
  o.loop.loss_scaling.mode = LossScaling::Mode::dynamic;
  check_learns(o);
}

// bf16 master weights written with stochastic rounding learn it too (the long comparison with
// fp32 masters and round-to-nearest is bench/precision_parity.py).
TEST(Trainer, LearnsTheSyntheticCorpusWithBf16Masters) {
  if (!kernels::bf16_unavailable_reason().empty())
    GTEST_SKIP() << kernels::bf16_unavailable_reason();
  World w;
  PretrainOptions o = w.learning_options("learn16");
  o.loop.precision = model::Precision::bf16;
  o.loop.optimizer.masters = Masters::bf16;
  check_learns(o);
}

// MLPerf's rule: training stops at the first evaluation that reaches the target, writes its
// checkpoint, and does not evaluate that step twice.
TEST(Trainer, StopsAtTheFirstEvaluationThatReachesTheTarget) {
  World w;
  PretrainOptions o = w.learning_options("target");
  o.eval_every = 2;
  double start = 0;
  {
    Trainer probe(o, false);
    start = probe.evaluate().mlm_acc;
  }
  o.target_accuracy = start + 0.15;
  o.overwrite = true;
  Trainer t(o, false);
  std::vector<EvalMetrics> evals;
  std::atomic<bool> stop{false};
  const StopReason reason = t.run(stop, {}, [&](const EvalMetrics& e) { evals.push_back(e); });
  EXPECT_EQ(reason, StopReason::target_reached);
  ASSERT_GE(evals.size(), 2u);
  EXPECT_LT(t.step(), 120);
  EXPECT_EQ(evals.back().step, t.step());
  EXPECT_GE(evals.back().mlm_acc, o.target_accuracy);
  for (size_t i = 0; i + 1 < evals.size(); ++i) EXPECT_LT(evals[i].mlm_acc, o.target_accuracy);
  EXPECT_TRUE(fs::exists(t.checkpoint_path()));
  o.target_accuracy = 1.5;
  EXPECT_THROW(Trainer(o, false), InputError);
}

// The padded side of a paired comparison (--one-per-row --compute-padding) trains on the packed
// run's sequences with the same dropout draws: the two runs' losses agree step by step.
TEST(Trainer, OnePerRowWithComputedPaddingTrainsLikePacked) {
  World w;
  auto losses = [&](bool padded) {
    PretrainOptions o = w.options(padded ? "padded" : "packed");
    o.checkpoint_every = 0;
    o.max_steps = 4;
    o.one_per_row = o.compute_padding = padded;
    Trainer t(o, false);
    return losses_of(t, 4);
  };
  const std::vector<double> packed = losses(false), padded = losses(true);
  ASSERT_EQ(packed.size(), 4u);
  ASSERT_EQ(padded.size(), 4u);
  for (size_t i = 0; i < packed.size(); ++i)
    EXPECT_NEAR(padded[i], packed[i], 1e-5 * packed[i]) << "step " << i + 1;
}

// Two-phase pre-training: phase 1 on short sequences from a preset (position embeddings sized
// for 512 from the start), phase 2 on longer ones from phase 1's checkpoint, its optimizer state
// carried over or reset.
TEST(Trainer, TwoPhasePretrainingCarriesOrResetsTheOptimizer) {
  World w;
  PretrainOptions p1 = w.options("phase1");
  p1.init.clear();
  p1.shape.preset = "tiny";
  p1.max_steps = 4;
  p1.checkpoint_every = 0;
  std::vector<float> m1;
  {
    Trainer t(p1, false);
    EXPECT_EQ(t.config().max_position_embeddings, 512);
    losses_of(t, 4);
    m1 = t.optimizer().m();
  }
  for (bool carry : {true, false}) {
    PretrainOptions p2 = w.options(carry ? "phase2_carry" : "phase2_reset");
    p2.sequences = w.seqs64;
    p2.packs.clear();
    p2.init = p1.out_dir + "/checkpoint.safetensors";
    p2.carry_optimizer = carry;
    p2.max_steps = 3;
    p2.checkpoint_every = 0;
    Trainer t(p2, false);
    EXPECT_EQ(t.step(), 0);
    EXPECT_EQ(t.optimizer().steps(), carry ? 4 : 0);
    if (carry)
      EXPECT_EQ(t.optimizer().m(), m1);
    else
      EXPECT_TRUE(std::all_of(t.optimizer().m().begin(), t.optimizer().m().end(),
                              [](float x) { return x == 0; }));
    const std::vector<double> losses = losses_of(t, 3);
    ASSERT_EQ(losses.size(), 3u);
    for (double l : losses) EXPECT_TRUE(std::isfinite(l));
    EXPECT_EQ(t.optimizer().steps(), carry ? 7 : 3);
  }
  PretrainOptions bad = w.options("phase2_bad");
  bad.carry_optimizer = true;  // --init is an HF directory: no optimizer state to carry
  EXPECT_THROW(Trainer(bad, false), InputError);
}

// Each bad input is an InputError whose message names the problem (and where it is).
TEST(Trainer, BadInputIsAnInputErrorNamingTheProblem) {
  World w;
  auto expect_error = [](const PretrainOptions& o, bool resume, const std::string& needle) {
    try {
      Trainer t(o, resume);
      ADD_FAILURE() << "accepted; expected an error with '" << needle << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  PretrainOptions o = w.options("bad");
  o.loop.lr = std::nan("");
  expect_error(o, false, "lr must be a positive finite number");  // the field; the CLI says --lr
  try {
    Trainer t(o, false);
  } catch (const OptionError& e) {
    EXPECT_EQ(e.field(), "lr");
  }
  o = w.options("bad");
  expect_error(o, true, "checkpoint.safetensors: no checkpoint to resume from");
  o.packs = w.packs;
  o.sequences = w.seqs;
  o.vocab = PACKBERT_SOURCE_VOCAB;  // another vocabulary than the data's
  expect_error(o, false, std::string(PACKBERT_SOURCE_VOCAB) + ": not the vocabulary " + w.seqs);
  o = w.options("bad");
  o.init = (w.dir / "missing").string();
  expect_error(o, false, (w.dir / "missing").string());
  o = w.options("bad");
  o.packs.clear();
  o.one_per_row = true;
  expect_error(o, false, "one_per_row lays out the packs of `packs`");
  o = w.options("bad");
  o.compute_padding = true;  // packs laid out packed have no padding to compute
  expect_error(o, false, "compute_padding applies to padded rows");
  o = w.options("bad");
  o.target_accuracy = -0.1;
  expect_error(o, false, "target_accuracy must be in [0, 1]");
}

TEST(Export, RoundTripsThroughTheHuggingFaceLayout) {
  World w;
  auto m = load_model(w.init, model::Heads{});
  EXPECT_TRUE(fs::exists(w.init + "/config.json"));
  EXPECT_TRUE(fs::exists(w.init + "/vocab.txt"));
  std::string again = (w.dir / "again").string();
  export_model(*m, again, "");
  auto n = load_model(again, model::Heads{});
  EXPECT_EQ(m->params(), n->params());
  EXPECT_EQ(n->config().hidden_size, 16);
}

// --dtype bf16: BF16 tensors (half the bytes), torch_dtype bfloat16, and loading them back gives
// each weight rounded to nearest. A model trained with bf16 master weights exports its masters
// exactly, in either dtype.
TEST(Export, Bf16StoresEachWeightRoundedToNearestInHalfTheBytes) {
  World w;
  auto m = load_model(w.init, model::Heads{});
  const std::string wide = (w.dir / "wide").string(), narrow = (w.dir / "narrow").string();
  export_model(*m, wide, "");
  export_model(*m, narrow, "", false, model::Precision::bf16);
  const auto a = fs::file_size(wide + "/model.safetensors"),
             b = fs::file_size(narrow + "/model.safetensors");
  // The payload halves; the header grows by a byte per tensor ("BF16" for "F32") at most, padded.
  const double tensors = static_cast<double>(m->layout().tensors().size());
  EXPECT_NEAR(static_cast<double>(a - b), 2.0 * static_cast<double>(m->layout().total()),
              tensors + 8);
  std::ifstream cf(narrow + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(cf).at("torch_dtype"), "bfloat16");
  auto n = load_model(narrow, model::Heads{});
  const std::vector<float>& before = std::as_const(*m).params();
  const std::vector<float> after = std::as_const(*n).params();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i)
    ASSERT_EQ(after[i], kernels::to_float(kernels::to_bf16(before[i]))) << i;
  // bf16 masters: exported in fp32 they load back as the same bf16 values, bit for bit.
  n->keep_masters_in_bf16();
  const std::string masters = (w.dir / "masters").string();
  export_model(*n, masters, "");
  auto back = load_model(masters, model::Heads{});
  EXPECT_EQ(std::as_const(*back).params(), after);
}

}  // namespace
}  // namespace packbert::train

#include "train/finetune.h"

namespace packbert::train {
namespace {

TEST(Finetune, ClassifierLearnsAKeywordRuleAboveMajority) {
  World w;
  std::mt19937 rng(9);
  auto tsv = [&](int n) {
    std::string s = "label\tsentence\n";
    for (int i = 0; i < n; ++i) {
      std::string text;
      bool yes = rng() % 3 == 0;  // 1/3 "yes": majority baseline 2/3
      int len = 4 + static_cast<int>(rng() % 6), at = static_cast<int>(rng() % len);
      for (int k = 0; k < len; ++k) {
        int word = 5 + static_cast<int>(rng() % 30);  // w5..w34
        if (k == at && yes) word = 3;
        if (k) text += ' ';
        text += std::to_string(word).insert(0, 1, 'w');
      }
      s += std::string(yes ? "yes" : "no") + "\t" + text + "\n";
    }
    return s;
  };
  std::ofstream(w.dir / "train.tsv") << tsv(400);
  std::ofstream(w.dir / "dev.tsv") << tsv(100);
  FinetuneOptions o;
  o.train = (w.dir / "train.tsv").string();
  o.dev = (w.dir / "dev.tsv").string();
  o.init = w.init;
  o.vocab = w.vocab;
  o.out_dir = (w.dir / "ft").string();
  o.max_seq_len = 32;
  o.loop.rows_per_batch = 4;
  o.epochs = 4;
  o.loop.lr = 1e-2;
  FinetuneResult r = finetune(o);
  ASSERT_EQ(r.dev_accuracy.size(), 4u);
  EXPECT_EQ(r.num_labels, 2);
  EXPECT_GT(r.dev_accuracy.back(), r.majority_baseline + 0.15)
      << r.dev_accuracy.back() << " vs majority " << r.majority_baseline;
  EXPECT_TRUE(fs::exists(o.out_dir + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(o.out_dir + "/labels.json"));
  // The export is what transformers expects for a classifier: its architecture, and the label
  // names (not LABEL_i) in id2label / label2id.
  {
    std::ifstream cf(o.out_dir + "/config.json"), lf(o.out_dir + "/labels.json");
    nlohmann::json config = nlohmann::json::parse(cf), labels = nlohmann::json::parse(lf);
    EXPECT_EQ(config["architectures"][0], "BertForSequenceClassification");
    EXPECT_EQ(config["num_labels"], 2);
    ASSERT_EQ(labels.size(), 2u);
    for (auto& [name, id] : labels.items()) {
      EXPECT_EQ(config["id2label"][std::to_string(id.get<int>())], name);
      EXPECT_EQ(config["label2id"][name], id);
    }
    io::SafetensorsFile st = io::SafetensorsFile::read(o.out_dir + "/model.safetensors");
    EXPECT_TRUE(st.has("classifier.weight"));
    EXPECT_FALSE(st.has("cls.predictions.bias"));
  }
  // `packbert eval --task classify` on the exported model agrees with the last epoch.
  TaskEvalOptions eo;
  eo.task = FinetuneTask::classify;
  eo.model = o.out_dir;
  eo.data = o.dev;
  eo.vocab = w.vocab;
  eo.max_seq_len = 32;
  TaskEvalResult ev = evaluate_task(eo);
  EXPECT_EQ(ev.examples, 100);
  EXPECT_NEAR(ev.accuracy, r.dev_accuracy.back(), 0.011);
  // With bf16 master weights (and bf16 compute) it learns the rule too, and exports its masters:
  // every weight a bf16 value.
  if (kernels::bf16_unavailable_reason().empty()) {
    FinetuneOptions b = o;
    b.out_dir = (w.dir / "ft16").string();
    b.loop.precision = model::Precision::bf16;
    b.loop.optimizer.masters = Masters::bf16;
    FinetuneResult r16 = finetune(b);
    EXPECT_GT(r16.dev_accuracy.back(), r16.majority_baseline + 0.15)
        << r16.dev_accuracy.back() << " vs majority " << r16.majority_baseline;
    io::SafetensorsFile st = io::SafetensorsFile::read(b.out_dir + "/model.safetensors");
    for (const char* name : {"bert.encoder.layer.0.attention.self.query.weight", "classifier.bias"})
      for (float x : st.floats(name)) ASSERT_EQ(x, kernels::to_float(kernels::to_bf16(x))) << name;
  }
  // Dev labels must be known from training; columns must exist.
  std::ofstream(w.dir / "bad.tsv") << "label\tsentence\nmaybe\tw5 w6\n";
  o.dev = (w.dir / "bad.tsv").string();
  EXPECT_THROW(finetune(o), InputError);
  std::ofstream(w.dir / "nohead.tsv") << "yes\tw5\n";
  o.dev = (w.dir / "nohead.tsv").string();
  EXPECT_THROW(finetune(o), InputError);
}

}  // namespace
}  // namespace packbert::train

#include "data/squad.h"

namespace packbert::train {
namespace {

const std::string kSquadTiny = std::string(PACKBERT_SOURCE_DIR) + "/tests/data/squad_tiny.json";

TEST(Squad, OfficialNormalisationExactMatchAndF1) {
  EXPECT_EQ(data::squad_normalize("The  Denver Broncos!"), "denver broncos");
  EXPECT_EQ(data::squad_normalize("an (apple), a pear"), "apple pear");
  EXPECT_EQ(data::squad_exact_match("the Broncos", "Broncos."), 1.0);
  EXPECT_EQ(data::squad_exact_match("Denver", "Broncos"), 0.0);
  EXPECT_NEAR(data::squad_f1("Denver Broncos", "Broncos of Denver"), 0.8, 1e-12);  // p 1, r 2/3
  EXPECT_NEAR(data::squad_f1("a b b", "b c"), 0.5, 1e-12);  // "a" is an article; one b in common
  EXPECT_EQ(data::squad_f1("", "Denver"), 0.0);
  std::vector<data::SquadExample> ex(2);
  ex[0].answers = {{"2026", 0}, {"in 2026", 0}};
  ex[1].answers = {{"three", 0}};
  data::SquadScore s = data::squad_score(ex, {"In 2026", "four"});
  EXPECT_DOUBLE_EQ(s.exact_match, 50.0);  // max over references, then mean, in %
  EXPECT_DOUBLE_EQ(s.f1, 50.0);
}

TEST(Squad, WindowsCoverTheContextAndLocateAnswers) {
  data::Vocab vocab = data::Vocab::load(PACKBERT_SOURCE_VOCAB);
  data::Tokenizer tok(vocab, true);
  std::vector<data::SquadExample> ex = data::read_squad(kSquadTiny);
  ASSERT_EQ(ex.size(), 6u);
  EXPECT_EQ(ex[1].id, "q2");
  EXPECT_EQ(ex[1].answers.size(), 2u);
  data::SquadOptions o;
  o.max_seq_len = 40;
  o.doc_stride = 8;
  o.max_query_length = 6;
  data::SquadFeatures f = data::squad_features(ex, tok, o, true);
  EXPECT_EQ(f.unanswerable, 0);
  std::vector<int> windows(ex.size(), 0), with_answer(ex.size(), 0);
  for (const data::SquadFeature& ft : f.features) {
    const data::SquadExample& e = ex[ft.example];
    ++windows[ft.example];
    ASSERT_LE(ft.tokens.size(), 40u);
    EXPECT_EQ(ft.tokens.front(), vocab.cls());
    EXPECT_EQ(ft.tokens.back(), vocab.sep());
    EXPECT_EQ(ft.tokens[ft.doc_offset - 1], vocab.sep());
    EXPECT_LE(ft.doc_offset, 6 + 2);  // the question was cut to max_query_length
    if (ft.start == 0) {
      EXPECT_EQ(ft.end, 0);  // answer not in this window: [CLS]
      continue;
    }
    ++with_answer[ft.example];
    // The located span is exactly the tokenised first answer ("2026", not "2026)").
    std::vector<int32_t> span(ft.tokens.begin() + ft.start, ft.tokens.begin() + ft.end + 1);
    EXPECT_EQ(span, tok.encode(e.answers[0].text)) << e.id;
  }
  for (size_t i = 0; i < ex.size(); ++i) {
    EXPECT_GE(windows[i], 2) << ex[i].id;  // long contexts, short windows
    EXPECT_GE(with_answer[i], 1) << ex[i].id;
    // Every context piece is "max context" in exactly one window.
    std::vector<int> owners(ex[i].pieces.size(), 0);
    for (const data::SquadFeature& ft : f.features)
      if (ft.example == static_cast<int64_t>(i))
        for (size_t k = 0; k < ft.max_context.size(); ++k)
          owners[ft.doc_first + k] += ft.max_context[k];
    for (int n : owners) EXPECT_EQ(n, 1);
  }
}

TEST(Squad, PredictionsMapBackToTheOriginalText) {
  data::Vocab vocab = data::Vocab::load(PACKBERT_SOURCE_VOCAB);
  data::Tokenizer tok(vocab, true);
  std::vector<data::SquadExample> ex = data::read_squad(kSquadTiny);
  data::SquadOptions o;
  o.max_seq_len = 48;
  o.doc_stride = 16;
  data::SquadFeatures train = data::squad_features(ex, tok, o, true);
  data::SquadFeatures dev = data::squad_features(ex, tok, o, false);
  ASSERT_EQ(train.features.size(), dev.features.size());
  // Logits that peak on the located span of each window holding the answer.
  std::vector<std::vector<float>> logits(dev.features.size());
  for (size_t f = 0; f < dev.features.size(); ++f) {
    EXPECT_EQ(dev.features[f].start, 0);  // no labels at evaluation
    logits[f].assign(2 * dev.features[f].tokens.size(), 0.0f);
    if (train.features[f].start > 0) {
      logits[f][2 * train.features[f].start] = 5.0f;
      logits[f][2 * train.features[f].end + 1] = 5.0f;
    }
  }
  std::vector<std::string> pred = data::squad_predictions(ex, dev.features, logits, tok, o);
  EXPECT_EQ(pred[0], "2026");  // not "(in 2026)" nor "2026)"
  EXPECT_EQ(pred[2], "BERT encoders");
  EXPECT_EQ(pred[3], "attend to each other");
  data::SquadScore s = data::squad_score(ex, pred);
  EXPECT_DOUBLE_EQ(s.exact_match, 100.0);
  EXPECT_DOUBLE_EQ(s.f1, 100.0);
  // Spans longer than max_answer_length are never predicted.
  o.max_answer_length = 1;
  pred = data::squad_predictions(ex, dev.features, logits, tok, o);
  EXPECT_NE(pred[3], "attend to each other");
}

// An independent reading of the official SQuAD v2.0 evaluation script (evaluate-v2.0.py), written
// from its published rules for the test: normalize_answer (lower case, punctuation and the
// articles a/an/the removed, whitespace collapsed), compute_exact, compute_f1 (empty only
// matches empty), gold answers those that normalise to something else [""], totals in percent
// with HasAns and NoAns splits.
namespace squad_v2_reference {
std::vector<std::string> tokens(const std::string& text) {
  std::string lowered;
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && std::ispunct(u)) continue;
    lowered += u < 0x80 ? static_cast<char>(std::tolower(u)) : c;
  }
  std::vector<std::string> out;
  std::istringstream in(lowered);
  for (std::string w; in >> w;)
    if (w != "a" && w != "an" && w != "the") out.push_back(w);
  return out;
}
double exact(const std::string& gold, const std::string& pred) {
  return tokens(gold) == tokens(pred) ? 1 : 0;
}
double f1(const std::string& gold, const std::string& pred) {
  const auto g = tokens(gold), p = tokens(pred);
  if (g.empty() || p.empty()) return g == p ? 1 : 0;
  std::multiset<std::string> left(g.begin(), g.end());
  double common = 0;
  for (const auto& w : p) {
    auto it = left.find(w);
    if (it != left.end()) left.erase(it), ++common;
  }
  if (common == 0) return 0;
  const double precision = common / static_cast<double>(p.size()),
               recall = common / static_cast<double>(g.size());
  return 2 * precision * recall / (precision + recall);
}
}  // namespace squad_v2_reference

// #45 item 6: SQuAD v2.0 scores as the official v2 script does, overall and split by HasAns and
// NoAns, against the independent reading above; v1.1 files keep v1.1's scoring.
TEST(Squad, V2ScoresAsTheOfficialScriptDoes) {
  std::vector<data::SquadExample> ex(7);
  auto answers = [](std::initializer_list<const char*> texts) {
    std::vector<data::SquadAnswer> out;
    for (const char* t : texts) out.push_back({t, 0});
    return out;
  };
  ex[0].answers = answers({"the Eiffel Tower", "Eiffel Tower"});
  ex[1].answers = answers({"1889"});
  ex[2].answers = answers({"Gustave Eiffel's company"});
  ex[3].impossible = true;
  ex[4].impossible = true;
  ex[5].answers = answers({"a", "the"});  // normalises to nothing: counted as unanswerable
  ex[6].answers = answers({"Paris, France"});
  const std::vector<std::string> pred = {"Eiffel tower!", "", "the company of Gustave Eiffel", "",
                                         "in 1889", "", "Paris"};
  const data::SquadScore s = data::squad_score(ex, pred);
  ASSERT_TRUE(s.v2);
  double em = 0, f = 0, has_em = 0, has_f = 0, no_em = 0, no_f = 0;
  int has = 0, no = 0;
  for (size_t i = 0; i < ex.size(); ++i) {
    std::vector<std::string> gold;
    for (const auto& a : ex[i].answers)
      if (!squad_v2_reference::tokens(a.text).empty()) gold.push_back(a.text);
    const bool answerable = !gold.empty();
    if (!answerable) gold = {""};
    double e = 0, g = 0;
    for (const auto& a : gold)
      e = std::max(e, squad_v2_reference::exact(a, pred[i])),
      g = std::max(g, squad_v2_reference::f1(a, pred[i]));
    em += e, f += g;
    (answerable ? has_em : no_em) += e;
    (answerable ? has_f : no_f) += g;
    ++(answerable ? has : no);
  }
  EXPECT_EQ(s.total, 7);
  EXPECT_EQ(s.has_total, has);
  EXPECT_EQ(s.no_total, no);
  EXPECT_EQ(has, 4);
  EXPECT_EQ(no, 3);
  EXPECT_NEAR(s.exact_match, 100 * em / 7, 1e-9);
  EXPECT_NEAR(s.f1, 100 * f / 7, 1e-9);
  EXPECT_NEAR(s.has_exact, 100 * has_em / has, 1e-9);
  EXPECT_NEAR(s.has_f1, 100 * has_f / has, 1e-9);
  EXPECT_NEAR(s.no_exact, 100 * no_em / no, 1e-9);
  EXPECT_NEAR(s.no_f1, 100 * no_f / no, 1e-9);
  // Worked by hand: EM 1,0,0,1,0,1,0 = 3/7; NoAns EM 2/3 (the "in 1889" answer to an
  // unanswerable question scores 0).
  EXPECT_NEAR(s.exact_match, 300.0 / 7, 1e-9);
  EXPECT_NEAR(s.no_exact, 200.0 / 3, 1e-9);
  // A v1.1 set (every question answerable) keeps v1.1's scoring.
  std::vector<data::SquadExample> v1(ex.begin(), ex.begin() + 3);
  EXPECT_FALSE(data::squad_score(v1, pred).v2);
}

// SQuAD v2.0 predictions: "" when the null span's score beats the best span's by more than the
// threshold (run_qa's rule); a training example without an answer is trained towards [CLS].
TEST(Squad, V2PredictsNoAnswerByTheNullScore) {
  data::Vocab vocab = data::Vocab::load(PACKBERT_SOURCE_VOCAB);
  data::Tokenizer tok(vocab, true);
  std::vector<data::SquadExample> ex = data::read_squad(kSquadTiny);
  ex[1].impossible = true, ex[1].answers.clear();
  data::SquadOptions o;
  o.max_seq_len = 48;
  o.doc_stride = 16;
  data::SquadFeatures train = data::squad_features(ex, tok, o, true);
  data::SquadFeatures dev = data::squad_features(ex, tok, o, false);
  ASSERT_EQ(train.features.size(), dev.features.size());
  EXPECT_EQ(train.unanswerable, 0);
  for (const auto& ft : train.features)
    if (ft.example == 1) {
      EXPECT_EQ(ft.start + ft.end, 0);  // every window at [CLS]
    }
  std::vector<std::vector<float>> logits(dev.features.size());
  for (size_t f = 0; f < dev.features.size(); ++f) {
    logits[f].assign(2 * dev.features[f].tokens.size(), 0.0f);
    if (train.features[f].start > 0) {
      logits[f][2 * train.features[f].start] = 5.0f;
      logits[f][2 * train.features[f].end + 1] = 5.0f;
    }
    logits[f][0] = logits[f][1] = 3.0f;  // null 6 against the answer's 10, and 0 elsewhere
  }
  o.v2 = true;
  std::vector<std::string> pred = data::squad_predictions(ex, dev.features, logits, tok, o);
  EXPECT_EQ(pred[0], "2026");
  EXPECT_EQ(pred[1], "");  // its best span scores 0 < null 6
  o.null_score_diff_threshold = 10;
  pred = data::squad_predictions(ex, dev.features, logits, tok, o);
  EXPECT_NE(pred[1], "");  // the threshold lets the span through
  o.null_score_diff_threshold = -5;
  pred = data::squad_predictions(ex, dev.features, logits, tok, o);
  EXPECT_EQ(pred[0], "");  // null 6 > 10 - 5
}

TEST(Squad, BadFilesNameTheProblem) {
  World w;
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    const std::string path = (w.dir / "bad.json").string();
    std::ofstream(path) << text;
    try {
      data::read_squad(path);
      ADD_FAILURE() << "no error for " << text;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("{\"data\": [", "not valid JSON");
  expect_error(
      "{\"data\": [{\"paragraphs\": [{\"context\": \"abc\", \"qas\": [{\"id\": \"x\"}]}]}]}",
      "data[0].paragraphs[0].qas[0]: missing 'question'");
  expect_error(
      "{\"data\": [{\"paragraphs\": [{\"context\": \"abc\", \"qas\": [{\"id\": \"x\", "
      "\"question\": \"q\", \"answers\": [{\"text\": \"bcd\", \"answer_start\": 1}]}]}]}]}",
      "answers[0]: answer_start 1 + 3 characters is outside the context");
  expect_error("{\"data\": [{\"paragraphs\": [{\"context\": 5}]}]}", "context: wrong type");
}

// The span head learns to point at a marker word, packed, through the public entry point.
TEST(Finetune, SquadSpanHeadLearnsAMarkerWord) {
  World w;
  std::mt19937 rng(5);
  auto squad = [&](int n, const std::string& prefix) {
    nlohmann::json paragraphs = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
      std::string context;
      int len = 8 + static_cast<int>(rng() % 30), at = static_cast<int>(rng() % len);
      int64_t start = 0;
      for (int k = 0; k < len; ++k) {
        if (k) context += ' ';
        if (k == at) start = static_cast<int64_t>(context.size());
        context += k == at ? std::string("w3") : std::to_string(5 + rng() % 30).insert(0, 1, 'w');
      }
      paragraphs.push_back({{"context", context},
                            {"qas",
                             {{{"id", prefix + std::to_string(i)},
                               {"question", "w1 w2"},
                               {"answers", {{{"text", "w3"}, {"answer_start", start}}}}}}}});
    }
    return nlohmann::json{{"version", "1.1"}, {"data", {{{"paragraphs", paragraphs}}}}}.dump();
  };
  std::ofstream(w.dir / "train.json") << squad(300, "t");
  std::ofstream(w.dir / "dev.json") << squad(60, "d");
  FinetuneOptions o;
  o.task = FinetuneTask::squad;
  o.train = (w.dir / "train.json").string();
  o.dev = (w.dir / "dev.json").string();
  o.init = w.init;
  o.vocab = w.vocab;
  o.out_dir = (w.dir / "qa").string();
  o.max_seq_len = 32;
  o.squad.doc_stride = 8;
  o.squad.max_query_length = 4;
  o.loop.rows_per_batch = 4;
  o.epochs = 3;
  o.loop.lr = 1e-2;
  FinetuneResult r = finetune(o);
  ASSERT_EQ(r.dev_squad.size(), 3u);
  EXPECT_GT(r.dev_sequences, 60);              // some contexts need two windows
  EXPECT_LT(r.train_rows, r.train_sequences);  // packed
  // Chance is about one word in twenty.
  EXPECT_GT(r.dev_squad.back().exact_match, 60.0) << r.dev_squad.back().f1;
  EXPECT_TRUE(fs::exists(o.out_dir + "/model.safetensors"));
  std::ifstream pj(o.out_dir + "/predictions.json");
  nlohmann::json p = nlohmann::json::parse(pj);
  EXPECT_EQ(p.size(), 60u);
  EXPECT_TRUE(p.contains("d0"));
  {
    std::ifstream cf(o.out_dir + "/config.json");
    EXPECT_EQ(nlohmann::json::parse(cf)["architectures"][0], "BertForQuestionAnswering");
    io::SafetensorsFile st = io::SafetensorsFile::read(o.out_dir + "/model.safetensors");
    EXPECT_TRUE(st.has("qa_outputs.weight"));
    EXPECT_TRUE(st.has("qa_outputs.bias"));
  }
  // `packbert eval --task squad` on the exported model agrees with the last epoch; a model
  // without the span head is refused.
  TaskEvalOptions eo;
  eo.model = o.out_dir;
  eo.data = o.dev;
  eo.vocab = w.vocab;
  eo.max_seq_len = 32;
  eo.squad = o.squad;
  eo.predictions = (w.dir / "answers.json").string();
  TaskEvalResult ev = evaluate_task(eo);
  EXPECT_EQ(ev.examples, 60);
  EXPECT_EQ(ev.sequences, r.dev_sequences);
  EXPECT_NEAR(ev.squad.exact_match, r.dev_squad.back().exact_match, 100.0 / 60 + 1e-9);
  EXPECT_TRUE(fs::exists(eo.predictions));
  eo.model = w.init;
  EXPECT_THROW(evaluate_task(eo), InputError);
  // The fine-tuned model (with its qa_outputs head) is a valid --init for another run.
  o.init = o.out_dir;
  o.out_dir = (w.dir / "qa2").string();
  o.epochs = 1;
  EXPECT_NO_THROW(finetune(o));
}

// GLUE's metrics (#45): accuracy, F1 of label 1 and Matthews correlation, against values worked
// by hand from the textbook formulas and sklearn's documented multi-class examples.
TEST(ClassifyScore, AccuracyF1AndMccAsGlueScoresThem) {
  // Binary: tp 3, fn 1, fp 1, tn 3.
  ClassifyScore b = classify_score({0, 1, 1, 0, 1, 1, 0, 0}, {0, 1, 0, 0, 1, 1, 1, 0}, 2);
  EXPECT_DOUBLE_EQ(b.accuracy, 0.75);
  ASSERT_TRUE(b.f1.has_value());
  EXPECT_DOUBLE_EQ(*b.f1, 0.75);                 // 2*3 / (2*3 + 1 + 1)
  EXPECT_DOUBLE_EQ(b.mcc, (9.0 - 1.0) / 16.0);  // (tp tn - fp fn) / sqrt(4 * 4 * 4 * 4)
  // sklearn's matthews_corrcoef docstring: y_true [1, 1, 1, -1], y_pred [1, -1, 1, 1] -> -1/3.
  EXPECT_NEAR(classify_score({1, 1, 1, 0}, {1, 0, 1, 1}, 2).mcc, -1.0 / 3.0, 1e-12);
  // Three classes (sklearn's tests): all wrong in a rotation -> -0.5; all right -> 1.
  ClassifyScore m = classify_score({0, 0, 1, 1, 2, 2}, {2, 2, 0, 0, 1, 1}, 3);
  EXPECT_NEAR(m.mcc, -0.5, 1e-12);
  EXPECT_FALSE(m.f1.has_value());
  EXPECT_DOUBLE_EQ(classify_score({0, 0, 1, 1, 2, 2}, {0, 0, 1, 1, 2, 2}, 3).mcc, 1.0);
  // One class predicted for everything: MCC 0 (sklearn's convention), not NaN.
  EXPECT_EQ(classify_score({0, 1, 0, 1}, {1, 1, 1, 1}, 2).mcc, 0.0);
}

}  // namespace
}  // namespace packbert::train
