// The training loop: pre-training runs, checkpoints and bit-exact resume, data parallelism in
// one process, export, sparsity and precision settings end to end.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "data/pretraining.h"
#include "error.h"
#include "io/safetensors.h"
#include "kernels/cpu_features.h"
#include "model/weights.h"
#include "model_batches.h"
#include "rng.h"
#include "train/memory_plan.h"
#include "train/model_files.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "train_world.h"

namespace packbert::train {
namespace {

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
  EXPECT_EQ(model::as_vector(resumed.model().params()), model::as_vector(full.model().params()));
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
    EXPECT_NE(std::string(e.what()).find("was trained with `block` 8 `sparsity` 0.5"),
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
  const std::vector<float> a = model::as_vector(dense->model().params());
  const std::vector<float> f = model::as_vector(fan_in->model().params());
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
  ModelFiles files;
  files.vocab = w.vocab;
  export_model(t.model(), out, files);
  auto exported = load_model(out, model::Heads{});
  auto from_checkpoint = load_model(t.checkpoint_path(), model::Heads{});
  EXPECT_EQ(model::as_vector(exported->params()), model::as_vector(from_checkpoint->params()));
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
    EXPECT_NE(std::string(e.what()).find("was trained with `precision` bf16"), std::string::npos)
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
    EXPECT_TRUE(t.model().masters16());
    EXPECT_EQ(t.model().params().size(), model::fp32_kept_arena(t.model().layout()).total);
    EXPECT_LT(t.model().params().size() * 4, t.model().layout().total());
  }
  o.loop.optimizer.masters = Masters::bf16_rn;
  o.max_steps = 4;
  try {
    Trainer t(o, true);
    FAIL() << "resumed a bf16-master checkpoint with round-to-nearest masters";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with `masters` bf16"), std::string::npos)
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
  std::vector<float> before = model::as_vector(t.model().params());
  int64_t skipped = 0, applied = 0, first_applied = 0;
  double scale = o.loop.loss_scaling.initial;
  std::atomic<bool> stop{false};
  t.run(stop,
        [&](const StepMetrics& s) {
          const std::vector<float> after = model::as_vector(t.model().params());
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
    std::vector<float> before = model::as_vector(t.model().params());
    int64_t skipped = 0, applied = 0;
    std::atomic<bool> stop{false};
    t.run(stop,
          [&](const StepMetrics& s) {
            const std::vector<float> after = model::as_vector(t.model().params());
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
// fp32 masters and round-to-nearest is bench/experiments/precision_parity.py).
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
    m1 = model::as_vector(t.optimizer().m());
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
      EXPECT_EQ(model::as_vector(t.optimizer().m()), m1);
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
  export_model(*m, again);
  auto n = load_model(again, model::Heads{});
  EXPECT_EQ(model::as_vector(m->params()), model::as_vector(n->params()));
  EXPECT_EQ(n->config().hidden_size, 16);
}

// --dtype bf16: BF16 tensors (half the bytes), torch_dtype bfloat16, and loading them back gives
// each weight rounded to nearest. A model trained with bf16 master weights exports its masters
// exactly, in either dtype.
TEST(Export, Bf16StoresEachWeightRoundedToNearestInHalfTheBytes) {
  World w;
  auto m = load_model(w.init, model::Heads{});
  const std::string wide = (w.dir / "wide").string(), narrow = (w.dir / "narrow").string();
  export_model(*m, wide);
  ModelFiles bf16_files;
  bf16_files.dtype = model::Precision::bf16;
  export_model(*m, narrow, bf16_files);
  const auto a = fs::file_size(wide + "/model.safetensors"),
             b = fs::file_size(narrow + "/model.safetensors");
  // The payload halves; the header grows by a byte per tensor ("BF16" for "F32") at most, padded.
  const double tensors = static_cast<double>(m->layout().tensors().size());
  EXPECT_NEAR(static_cast<double>(a - b), 2.0 * static_cast<double>(m->layout().total()),
              tensors + 8);
  std::ifstream cf(narrow + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(cf).at("torch_dtype"), "bfloat16");
  auto n = load_model(narrow, model::Heads{});
  const std::vector<float> before = model::as_vector(std::as_const(*m).params());
  const std::vector<float> after = model::as_vector(std::as_const(*n).params());
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i)
    ASSERT_EQ(after[i], kernels::to_float(kernels::to_bf16(before[i]))) << i;
  // bf16 masters: exported in fp32 they load back as the same bf16 values, bit for bit.
  n->keep_masters16(model::Masters::bf16);
  const std::string masters = (w.dir / "masters").string();
  export_model(*n, masters);
  auto back = load_model(masters, model::Heads{});
  EXPECT_EQ(model::as_vector(std::as_const(*back).params()), after);
}

// --dtype fp16: F16 tensors, torch_dtype float16, each weight rounded to nearest IEEE binary16
// (11 significant bits: not the bf16 values, which keep 8).
TEST(Export, Fp16StoresEachWeightRoundedToNearest) {
  World w;
  auto m = load_model(w.init, model::Heads{});
  const std::string dir = (w.dir / "f16").string();
  ModelFiles f16_files;
  f16_files.dtype = model::Precision::fp16;
  export_model(*m, dir, f16_files);
  std::ifstream cf(dir + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(cf).at("torch_dtype"), "float16");
  const io::SafetensorsFile file = io::SafetensorsFile::read(dir + "/model.safetensors");
  EXPECT_EQ(file.tensors().begin()->second.dtype, "F16");
  auto n = load_model(dir, model::Heads{});
  const std::vector<float> before = model::as_vector(std::as_const(*m).params());
  const std::vector<float> after = model::as_vector(std::as_const(*n).params());
  ASSERT_EQ(before.size(), after.size());
  size_t unlike_bf16 = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    ASSERT_EQ(after[i], kernels::to_float(kernels::to_f16(before[i]))) << i;
    unlike_bf16 += after[i] != kernels::to_float(kernels::to_bf16(before[i]));
  }
  EXPECT_GT(unlike_bf16, before.size() / 2);
}

}  // namespace
}  // namespace packbert::train
