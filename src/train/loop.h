// The one training step of every run, pre-training and fine-tuning, in one process or across
// MPI ranks (docs/DESIGN.md §7): the micro-batches of a step through forward and backward, the
// gradients summed across processes, averaged over micro-batches, clipped, checked and applied.
//
// A step's whole batch is what one process with ranks × rows_per_batch rows would use; each rank
// computes a share of its sequences, balanced by their FLOPs (a row is too coarse a piece: 9 rows
// of 512 split 5 and 4 ways), that divides its losses by the whole batch's counts and draws its
// dropout at its sequences' places in the whole (model/batch.h). So the shares' gradients sum to
// the whole batch's, and the rank count does not change results beyond float summation order.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/grad_sync.h"
#include "model/bert.h"
#include "train/optimizer.h"
#include "train/pipeline.h"

namespace packbert::train {

// The largest loss scale taken or grown to. A scale past fp32's range is allowed: the loss
// gradient itself then overflows, and dynamic scaling halves it like any other overflow.
constexpr double kMaxLossScale = 1e300;

// Loss scaling (PyTorch's GradScaler): backward starts from the losses times `scale`, so small
// gradients stay representable where they are stored in 16 bits; the optimizer divides it out
// as it reads each gradient (before clipping: the norm clipped is the true one). Dynamic scaling
// halves the scale and skips the step when a gradient is non-finite (an overflow), and doubles it
// after `window` clean steps in a row (a step skipped as an outlier has a finite gradient, so it
// counts as clean). Off, the scale is 1 and nothing changes.
struct LossScaling {
  enum class Mode : uint8_t { off, fixed, dynamic };
  Mode mode = Mode::off;
  double initial = 65536;  // 2^16, PyTorch's; the fixed scale under `fixed`
  int64_t window = 2000;   // clean steps before the scale doubles (dynamic)
  bool on() const { return mode != Mode::off; }
};
// "off", "dynamic" or the fixed scale, in as many digits as tell it apart from any other double.
std::string loss_scaling_name(const LossScaling& s);
// Parses `off`, `dynamic` or a fixed positive scale; names `flag` in the error.
LossScaling parse_loss_scaling(const std::string& text, const std::string& flag);

// The state of loss scaling through a run; part of the checkpoint, so a resumed run scales as an
// unbroken one would.
struct LossScaler {
  double scale = 1;
  int64_t clean = 0;      // steps without overflow since the scale last changed (dynamic)
  int64_t overflows = 0;  // steps skipped because a scaled gradient was non-finite

  LossScaler() = default;
  explicit LossScaler(const LossScaling& s) : scale(s.on() ? s.initial : 1.0) {}
  // After a step whose gradient was finite (true) or not: under dynamic scaling, halves the scale
  // on an overflow, doubles it on the window-th clean step in a row.
  void update(const LossScaling& s, bool finite);
};

// What every training run is driven by; pretrain and finetune hold one each (their own data
// options beside it). Errors about a field name the field; the CLI maps it to its flag.
struct LoopOptions {
  OptimizerConfig optimizer;
  double lr = 1e-3;
  int64_t warmup_steps = 10;
  double decay_power = 1.0;  // 1 = linear decay to 0 at the last step, 0 = constant
  double clip_norm = 1.0;    // global gradient norm (0 = off)
  int rows_per_batch = 16;   // rows (packs) per micro-batch, per process
  int accumulation = 1;      // micro-batches per optimizer step
  uint64_t seed = 1;         // initialisation, order, dropout and masks
  int nan_abort = 5;         // give up after this many non-finite steps in a row
  LossScaling loss_scaling;
  // Skip an update whose gradient norm is an outlier: above mean + z * std of the last
  // GradNormGuard::kWindow accepted norms. 0 = off.
  double outlier_z = 0;
  // What backward rebuilds instead of keeping; `auto` picks the cheapest policy whose step fits
  // memory_limit. A policy predicted not to fit is refused before training starts.
  model::Recompute recompute;
  std::optional<double> memory_limit;  // bytes; unset = the memory available when the run starts
  model::Precision precision = model::Precision::fp32;
  kernels::BackendKind backend = kernels::BackendKind::cpu;  // where the model's ops run
  // ZeRO stage: 0 = every process holds the optimizer state; 1 = each holds the moments of its
  // shard of the parameters only (gradients reduce-scattered, parameters all-gathered).
  int zero = 0;
};

// Throws InputError naming the first field of `o` out of its range ("rows_per_batch must be at
// least 1"); the CLI turns field names into flags (cli/flags.h).
void check_loop_options(const LoopOptions& o);

// The z-score guard on gradient norms (llm.c's): a norm above mean + z × std of the last
// kWindow accepted norms is an outlier; it needs kMinHistory accepted norms before it judges.
// Its state is part of the checkpoint, so a resumed run decides exactly as an unbroken one.
struct GradNormGuard {
  static constexpr int kWindow = 64, kMinHistory = 16;
  std::vector<double> recent = std::vector<double>(kWindow, 0.0);  // ring of accepted norms
  int64_t accepted = 0;

  bool is_outlier(double norm, double z) const;
  void accept(double norm) { recent[static_cast<size_t>(accepted++ % kWindow)] = norm; }
};

// One optimizer step, summed over every rank.
struct StepResult {
  double mlm_loss = 0, nsp_loss = 0, cls_loss = 0, span_loss = 0;  // means over the step
  int64_t mlm_count = 0, mlm_correct = 0, nsp_count = 0, nsp_correct = 0;
  int64_t cls_count = 0, cls_correct = 0;
  int64_t real_tokens = 0, sequences = 0;  // computed padding excluded
  double lr = 0, grad_norm = 0;  // grad_norm: of the unscaled mean gradient, before clipping
  double loss_scale = 1;         // the scale this step's backward ran with
  bool skipped = false;          // no update was applied
  // "non-finite loss", "non-finite gradient", "loss-scale overflow" (dynamic loss scaling: the
  // scale halves) or "outlier gradient norm"
  std::string skip_reason;
  double imbalance = 1;     // the most real tokens one rank computed over the mean (1 = even)
  double comm_seconds = 0;  // waiting on collectives outside backward (exposed communication)
  // Pipeline stages: the seconds each stage (its first replica) waited on its neighbours during
  // the step's forwards and backwards and the word table's exchange: the measured bubble.
  std::vector<double> stage_wait_seconds;
  double loss() const { return mlm_loss + nsp_loss + cls_loss + span_loss; }
};

// True when no element is NaN or infinite.
bool all_finite(const float* x, size_t n);

struct StepSums;  // what a step's micro-batches add up (loop.cpp)

class Stepper {
 public:
  // oc: the optimizer after any packing adjustment; recompute: resolved (not `auto`). Under
  // 16-bit master weights (o.optimizer.masters) it turns the model's weights into them
  // (BertModel::keep_masters16): load the weights first.
  Stepper(model::BertModel& m, const LoopOptions& o, const OptimizerConfig& oc, int accumulation,
          model::Recompute recompute, dist::Comm& comm);
  // A pipeline stage of `grid` (m is grid.stage()'s stage of the model), or one stage with its
  // replicas: the step's micro-batches run on the 1F1B schedule (train/pipeline.h), each replica
  // computing its share of every micro-batch on every stage; the gradients are summed among the
  // stage's replicas (grid.data()), the tied word table's two shares between the first and last
  // stage, and the global norm over the stages (the word table counted once), so every rank
  // clips, scales and skips alike.
  Stepper(model::BertModel& m, const LoopOptions& o, const OptimizerConfig& oc, int accumulation,
          model::Recompute recompute, const dist::Grid& grid);
  ~Stepper();

  // Step `index` (from 0) of `total`: `next` hands out the step's micro-batches, each the whole
  // batch of every rank's rows in order; `micro_batches` of them (0: the accumulation; fewer for
  // the last step of an epoch, say). A run that cannot go on (nan_abort non-finite steps in a
  // row, or an update that made the weights non-finite) throws InputError ending with `kept`,
  // what the caller keeps of earlier work.
  StepResult step(int64_t index, int64_t total, const std::function<model::PackedBatch()>& next,
                  const std::string& kept, int micro_batches = 0);

  Optimizer& optimizer() { return *opt_; }
  const Optimizer& optimizer() const { return *opt_; }
  GradNormGuard& guard() { return guard_; }
  int64_t outlier_skips() const { return outlier_skips_; }
  void set_outlier_skips(int64_t n) { outlier_skips_ = n; }
  LossScaler& scaler() { return scaler_; }
  // The moments of the whole arena (m, v) in fp32, for a checkpoint: the optimizer's own when it
  // holds them all in fp32 (widened into m_all and v_all under 16-bit masters); under ZeRO-1
  // gathered into m_all and v_all on the root, and null elsewhere.
  std::pair<const float*, const float*> whole_moments(std::vector<float>& m_all,
                                                      std::vector<float>& v_all);
  // The pieces of a whole batch (its sequences) that `rank` of `ranks` computes, given each
  // piece's work: balanced by it (the largest first, each to the rank with the least so far), in
  // ascending order.
  static std::vector<int> pieces_of_rank(const std::vector<double>& work, int ranks, int rank);

 private:
  Stepper(model::BertModel& m, const LoopOptions& o, const OptimizerConfig& oc, int accumulation,
          model::Recompute recompute, std::unique_ptr<dist::Grid> own, const dist::Grid* grid);
  // The micro-batches of step `index` forward and backward (loss scale `scale`), their losses,
  // counts and tokens added to sums.
  void run_micro_batches(int64_t index, int micros, StepSums& sums,
                         const std::function<model::PackedBatch()>& next, double scale);
  // The same for a pipeline stage, on the 1F1B schedule.
  void run_stage(int64_t index, int micros, StepSums& sums,
                 const std::function<model::PackedBatch()>& next, double scale);
  // Forward's options for micro-batch `micro` of step `index` under loss scale `scale`: dropout
  // on, its masks drawn for that micro-batch's place in the run.
  model::StepOptions training_options(int64_t index, int micro, double scale) const;
  // This replica's share of a whole batch (the whole of it in one replica).
  model::PackedBatch share_of(const model::PackedBatch& whole) const;
  // The gradients' global norm: over this rank's range (the shard under ZeRO-1), summed over
  // the stage's replicas and the stages (the word table counted on the first stage only).
  double global_norm(const float* g);
  bool skips(StepResult& r, int64_t index, const std::string& kept);
  bool update(StepResult& r, float grad_scale);

  model::BertModel& m_;
  LoopOptions o_;
  int accumulation_;
  model::Recompute recompute_;
  std::unique_ptr<dist::Grid> own_grid_;  // one stage over the world (the first constructor)
  const dist::Grid& grid_;
  dist::Comm& comm_;                         // the stage's replicas (grid_.data())
  std::unique_ptr<StageLinks> links_;        // to the neighbouring stages, when pipelined
  const model::TensorSpec* tied_ = nullptr;  // the word table, on a first or last stage
  std::vector<model::PackedBatch> shares_;   // a stage's micro-batches in flight
  model::TokenLayout received_;              // the layout of the micro-batch a stage receives
  dist::GradientSync sync_;                  // all-reduce, ZeRO-1 or nothing
  std::unique_ptr<Optimizer> opt_;
  GradNormGuard guard_;
  int64_t outlier_skips_ = 0;
  LossScaler scaler_;
  int nan_streak_ = 0;
};

}  // namespace packbert::train
