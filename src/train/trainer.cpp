// The Trainer's run: steps, held-out evaluation (evaluate_mlm), divergence checks, and the
// metrics.jsonl records of each.
#include "train/trainer.h"

#include <omp.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/comm.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/fault.h"
#include "io/memory.h"
#include "io/paths.h"
#include "io/safetensors.h"
#include "model/hf_import.h"
#include "model/weights.h"
#include "stopwatch.h"
#include "text.h"
#include "train/memory_plan.h"
#include "train/model_files.h"

namespace packbert::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

Trainer::~Trainer() = default;

EvalMetrics evaluate_mlm(model::BertModel& m, BatchLoader& loader, model::Precision precision,
                         const std::function<void(int64_t, double)>& progress, StageLinks* links) {
  EvalMetrics e;
  double mlm_sum = 0, nsp_sum = 0;
  int64_t nsp_n = 0, mlm_correct = 0, nsp_correct = 0;
  while (loader.cursor().epoch == 0) {
    const double t0 = now_seconds();
    const int64_t before = e.sequences;
    model::PackedBatch b = loader.next();
    model::StepOptions so;
    so.precision = precision;
    const bool below = links && !m.layout().has_embeddings(),
               above = links && !m.layout().has_heads();
    const kernels::View input =
        below ? links->receive_input(0, 0, model::token_layout(b, m.config()).tokens())
              : kernels::View();
    model::Outputs o = m.forward(b, so, input);
    if (above) links->send_output(0, m.stage_output());
    if (links) links->finish();
    io::crash_point("eval");  // (PACKBERT_CRASH_AT=eval:N: the N-th evaluation batch)
    mlm_sum += o.mlm_loss * static_cast<double>(o.mlm_count);
    nsp_sum += o.nsp_loss * static_cast<double>(o.nsp_count);
    e.mlm_count += o.mlm_count;
    nsp_n += o.nsp_count;
    mlm_correct += o.mlm_correct;
    nsp_correct += o.nsp_correct;
    for (int32_t y : m.tokens().nsp_label) e.sequences += y != -100;
    if (progress) progress(e.sequences - before, now_seconds() - t0);
  }
  e.mlm_loss = e.mlm_count ? mlm_sum / static_cast<double>(e.mlm_count) : 0;
  e.mlm_acc = e.mlm_count ? static_cast<double>(mlm_correct) / static_cast<double>(e.mlm_count) : 0;
  e.nsp_loss = nsp_n ? nsp_sum / static_cast<double>(nsp_n) : 0;
  e.nsp_acc = nsp_n ? static_cast<double>(nsp_correct) / static_cast<double>(nsp_n) : 0;
  return e;
}

EvalMetrics Trainer::evaluate() {
  if (eval_rows_.row_end == 0) return EvalMetrics{step_};
  BatchLoader loader(seqs_, seqs_checksum_, nullptr, vocab_ ? &*vocab_ : nullptr, eval_rows_, {});
  if (!grid_->pipelined()) {
    EvalMetrics e = evaluate_mlm(*model_, loader, opt_.loop.precision);
    e.step = step_;
    return e;
  }
  // Every replica runs the held-out batches through its stages; the last stage's first
  // replica's metrics are every rank's.
  StageLinks links(grid_->pipe(), model_->config().hidden_size,
                   model::storage_dtype(opt_.loop.precision));
  model_->use_pass(0);
  EvalMetrics e = evaluate_mlm(*model_, loader, opt_.loop.precision, {}, &links);
  const bool mine = grid_->last_stage() && grid_->replica() == 0;
  double v[6] = {e.mlm_loss,
                 e.mlm_acc,
                 e.nsp_loss,
                 e.nsp_acc,
                 static_cast<double>(e.mlm_count),
                 static_cast<double>(e.sequences)};
  if (!mine) std::fill(std::begin(v), std::end(v), 0.0);
  grid_->world().allreduce_sum(v, 6);
  e.mlm_loss = v[0], e.mlm_acc = v[1], e.nsp_loss = v[2], e.nsp_acc = v[3];
  e.mlm_count = std::llround(v[4]), e.sequences = std::llround(v[5]);
  e.step = step_;
  return e;
}

std::string Trainer::kept_text() const {
  std::string s = saved_step_ >= 0
                      ? "checkpoint.safetensors (step " + std::to_string(saved_step_) + ")"
                      : std::string("no checkpoint yet");
  for (const auto& [step, path] : earlier_checkpoints())
    s += ", " + fs::path(path).filename().string();
  if (divergence_.best_eval_step >= 0)
    s += ", best.safetensors (step " + std::to_string(divergence_.best_eval_step) + ")";
  return s;
}

void Trainer::diverged(const std::string& what) const {
  throw InputError("step " + std::to_string(step_) + ": the run diverged: " + what +
                   " (`divergence_factor` " + fixed(opt_.divergence_factor, 2) +
                   "); no checkpoint written; kept in " + opt_.out_dir + ": " + kept_text());
}

// An evaluation of the held-out split, recorded; a new best is saved, a diverged one ends the
// run; whether it reached target_accuracy is every rank's (rank 0's verdict).
void Trainer::evaluate_and_record(const std::function<void(const EvalMetrics&)>& on_eval) {
  evaluated_at_ = step_;
  const double e0 = now_seconds();
  EvalMetrics e = evaluate();
  e.elapsed = elapsed_;
  e.eval_seconds = now_seconds() - e0;
  if (eval_rows_.row_end == 0) return;
  const bool diverging = divergence_.eval_diverged(e.mlm_loss, opt_.divergence_factor);
  const bool best = !diverging && std::isfinite(e.mlm_loss) &&
                    (divergence_.best_eval_step < 0 || e.mlm_loss < divergence_.best_eval);
  if (best) save_best(e);
  if (comm_.root()) {
    log_ << e.to_json().dump() << std::endl;
    if (best)
      log_ << json{{"type", "best"},
                   {"step", e.step},
                   {"file", "best.safetensors"},
                   {"mlm_loss", e.mlm_loss},
                   {"elapsed", e.elapsed}}
                  .dump()
           << std::endl;
    if (on_eval) on_eval(e);
  }
  if (diverging)
    diverged("held-out MLM loss " + fixed(e.mlm_loss, 2) + " is above " +
             fixed(opt_.divergence_factor, 2) + " x its best, " + fixed(divergence_.best_eval, 2) +
             " at step " + std::to_string(divergence_.best_eval_step));
  if (best) {
    divergence_.best_eval = e.mlm_loss, divergence_.best_eval_step = step_;
    resave_ |= saved_step_ == step_;  // (the checkpoint of this step must record it)
  }
  double hit = comm_.root() && opt_.target_accuracy > 0 && e.mlm_acc >= opt_.target_accuracy;
  comm_.allreduce_max(&hit, 1);
  reached_ = hit > 0;
}

void Trainer::checkpoint_and_record() {
  save_checkpoint();
  if (!comm_.root()) return;
  log_ << json{{"type", "checkpoint"},
               {"step", step_},
               {"file", "checkpoint.safetensors"},
               {"earlier", kept_},
               {"elapsed", elapsed_}}
              .dump()
       << std::endl;
  write_trainer_state();
}

// One optimizer step (and, on its schedule, a sparse pattern update), its metrics.
StepMetrics Trainer::train_step(double flops_per_token) {
  const double t0 = now_seconds();
  // A step that ends with a pattern update under gradient regrow collects the dense gradient's
  // block norms on the way.
  const bool update = is_update_step(opt_.sparse, step_ + 1, opt_.max_steps);
  if (update && opt_.sparse.regrow == Regrow::gradient) model_->collect_block_grads(true);
  const std::string kept = saved_step_ >= 0 ? "no checkpoint written; the one of step " +
                                                  std::to_string(saved_step_) + " in " +
                                                  checkpoint_path() + " is unchanged"
                                            : std::string("no checkpoint written");
  const StepResult r = stepper_->step(
      step_, opt_.max_steps, [&] { return loader_->next(); }, kept);
  UpdateStats moved;
  if (update) {
    moved = update_patterns(*model_, stepper_->optimizer(), opt_.sparse, step_ + 1, opt_.max_steps,
                            opt_.loop.seed);
    model_->collect_block_grads(false);
  }
  train_flops_ += flops_per_token * static_cast<double>(r.real_tokens);
  StepMetrics s = StepMetrics::of(r, model_->layout().heads(), *stepper_, opt_.loop, comm_.size());
  s.step = step_ + 1;
  s.train_flops = train_flops_;
  s.pattern_update = update, s.blocks_moved = moved.moved, s.churn = moved.churn();
  cursor_ = loader_->cursor();
  ++step_;
  s.seconds = now_seconds() - t0;
  elapsed_ += s.seconds;
  s.elapsed = elapsed_;
  return s;
}

StopReason Trainer::run(const std::atomic<bool>& stop,
                        const std::function<void(const StepMetrics&)>& on_step,
                        const std::function<void(const EvalMetrics&)>& on_eval) {
  // Rank 0 alone writes metrics and calls back; every rank trains and evaluates.
  if (comm_.root()) {
    if (new_log_ && fs::is_directory(opt_.out_dir + "/runs"))  // (an earlier run's events)
      for (const auto& entry : fs::directory_iterator(opt_.out_dir + "/runs"))
        if (entry.path().filename().string().starts_with("events.out.tfevents."))
          fs::remove(entry.path());
    if (!log_.is_open())
      log_.open(opt_.out_dir + "/metrics.jsonl", !new_log_, opt_.report, opt_.out_dir + "/runs",
                new_log_ ? -1 : step_);
  }
  new_log_ = false;
  const Schedule schedule{opt_.max_steps, opt_.eval_every, opt_.checkpoint_every, opt_.max_minutes};
  const double flops_per_token = nonembedding_flops_per_token(whole_layout());
  // A stop request (a signal to any rank) or the time limit (any rank's clock) stops every rank
  // after the same step.
  auto agreed = [&](bool local_stop, bool local_time) {
    double flags[2] = {local_stop ? 1.0 : 0.0, local_time ? 1.0 : 0.0};
    comm_.allreduce_max(flags, 2);
    return std::pair{flags[0] > 0, flags[1] > 0};
  };
  bool stop_now = agreed(stop.load(), false).first;
  StopReason reason = StopReason::finished;
  while (step_ < opt_.max_steps) {
    if (stop_now) {
      reason = StopReason::requested;
      break;
    }
    const StepMetrics s = train_step(flops_per_token);
    if (comm_.root()) {
      log_ << s.to_json().dump() << std::endl;
      if (on_step) on_step(s);
    }
    io::crash_point("step");
    if (!s.skipped && divergence_.train_diverged(s.loss, opt_.divergence_factor))
      diverged("the training loss's moving average " + fixed(divergence_.train_ema, 2) +
               " is above " + fixed(opt_.divergence_factor, 2) + " x its lowest, " +
               fixed(divergence_.lowest_train_ema, 2));
    if (schedule.evaluates_after(step_)) evaluate_and_record(on_eval);
    // (the last step's checkpoint is written after its evaluation, below)
    if (schedule.checkpoints_after(step_)) checkpoint_and_record();
    if (reached_) {
      reason = StopReason::target_reached;
      break;
    }
    const auto [stop_any, time_any] = agreed(stop.load(), schedule.out_of_time(elapsed_));
    if (time_any) {
      reason = StopReason::time_limit;
      break;
    }
    stop_now = stop_any;
  }
  if (evaluated_at_ != step_) evaluate_and_record(on_eval);  // (none twice after one step)
  if (reached_ && reason == StopReason::finished) reason = StopReason::target_reached;
  if (saved_step_ != step_ || resave_) checkpoint_and_record();
  return reason;
}

}  // namespace packbert::train
