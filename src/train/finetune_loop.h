// Fine-tuning's training loop, which the classification, regression and SQuAD drivers share
// (finetune.cpp): epochs or a number of steps, evaluation after each epoch or every eval_steps,
// the best evaluation kept, early stopping, the resume file and the checkpoint directories.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>
#include <vector>

#include "dist/comm.h"
#include "io/fault.h"
#include "io/safetensors.h"
#include "model/bert.h"
#include "model/weights.h"
#include "stopwatch.h"
#include "text.h"
#include "train/checkpoint.h"
#include "train/finetune.h"
#include "train/finetune_resume.h"
#include "train/loop.h"
#include "train/metrics.h"
#include "train/model_files.h"
#include "train/progress.h"
#include "train/scores.h"
#include "train/sparsity.h"
#include "train/task_model.h"

namespace packbert::train {

// The recompute policy a fine-tuning step of full rows fits memory with (`auto` resolved).
model::Recompute step_policy(const model::BertModel& m, const FinetuneOptions& o);
// Whether any rank was asked to stop (SIGINT/SIGTERM): every rank stops after the same step.
bool stop_requested(const FinetuneOptions& o, dist::Comm& comm);
// The order an epoch visits n rows in: a shuffle seeded by (seed, epoch).
std::vector<size_t> epoch_order(size_t n, uint64_t seed, int epoch);
// The run's length: steps per epoch (of processes x rows_per_batch rows x accumulation, `micros`
// micro-batches an epoch), its steps in all (max_steps, or epochs of them) and the epochs those
// begin.
RunLength run_length(const FinetuneOptions& o, int64_t micros);

// The training both tasks share: rows shuffled per epoch, the one training step (train/loop.h)
// over steps of processes x rows_per_batch rows x accumulation, a JSONL line per step (rank 0),
// and `evaluate(epoch, elapsed)` (which logs its own line, at that many training seconds) after
// every epoch or every eval_steps steps, with the best model kept, early stopping, the resume
// file and the checkpoint directories (`files`: what one holds beside the weights).
template <typename Seq, typename Evaluate>
class FinetuneLoop {
 public:
  FinetuneLoop(model::BertModel& m, const FinetuneOptions& o, const std::vector<Seq>& seqs,
               const std::vector<std::vector<int64_t>>& rows, std::ostream& log,
               FinetuneResult& res, const ModelFiles& files, Evaluate evaluate)
      : m_(m),
        o_(o),
        seqs_(seqs),
        rows_(rows),
        log_(log),
        res_(res),
        files_(files),
        evaluate_(evaluate),
        lo_(o.loop),
        step_rows_(static_cast<int64_t>(comm_.size()) * lo_.rows_per_batch),
        micros_((static_cast<int64_t>(rows.size()) + step_rows_ - 1) / step_rows_),
        length_(run_length(o, micros_)),
        identity_(resume_identity(o)) {
    res_.max_steps = length_.max_steps;
    if (o.warmup_ratio)
      lo_.warmup_steps =
          static_cast<int64_t>(std::ceil(*o.warmup_ratio * static_cast<double>(length_.max_steps)));
  }

  void run() {
    start();
    progress_.emplace("finetune", "step", res_.steps, length_.max_steps, "tok", o_.logging_steps);
    // (a run resumed after early stopping had stopped it has nothing left to train)
    bool done = early_stopping_reached(o_, res_);
    const int first_epoch = at_.epoch;
    for (int epoch = first_epoch; epoch < length_.epochs && !done && !res_.stopped; ++epoch)
      done = train_epoch(epoch, epoch == first_epoch ? at_.step_in_epoch : 0);
    if (res_.stopped) return;
    if (done && res_.steps < length_.max_steps) say_early_stop();
    res_.best = best_evaluation(o_, res_);
  }

 private:
  // The Stepper, after --resume's weights (it may turn them into 16-bit masters), then the
  // optimizer's state and the place to go on from.
  void start() {
    std::optional<io::SafetensorsFile> resumed;
    nlohmann::json state;
    if (o_.resume) {
      state = read_resume_state(o_, identity_, resumed);
      model::load_model_weights(m_, *resumed);
    }
    stepper_ = std::make_unique<Stepper>(m_, lo_, lo_.optimizer, lo_.accumulation,
                                         step_policy(m_, o_), comm_);
    if (!resumed) return;
    load_stepper_state(*stepper_, m_.layout(), *resumed, state);
    res_.steps = state.at("steps").get<int64_t>();
    at_ = {state.at("epoch").get<int>(), state.at("step_in_epoch").get<int64_t>(),
           state.value("elapsed", 0.0), state.value("train_flops", 0.0)};
    restore_dev_results(state.at("dev"), o_.task, res_);
    if (comm_.root() && state.contains("metrics") && state["metrics"].is_string())
      log_ << state["metrics"].get<std::string>() << std::flush;
  }

  // One epoch's steps from step s0 (a resumed epoch skips the rows of the steps it had done,
  // every one of them full); true when early stopping ends the run.
  bool train_epoch(int epoch, int64_t s0) {
    const std::vector<size_t> order = epoch_order(rows_.size(), lo_.seed, epoch);
    const int64_t per_epoch = length_.steps_per_epoch;
    const int64_t epoch_steps =
        std::min(per_epoch, length_.max_steps - static_cast<int64_t>(epoch) * per_epoch);
    size_t next_row = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(order.size()), s0 * lo_.accumulation * step_rows_));
    auto next = [&] {
      std::vector<std::vector<int64_t>> batch_rows;
      for (; batch_rows.size() < static_cast<size_t>(step_rows_) && next_row < order.size();
           ++next_row)
        batch_rows.push_back(rows_[order[next_row]]);
      return make_batch(seqs_, batch_rows, o_.max_seq_len);
    };
    bool done = false;
    for (int64_t s = s0; s < epoch_steps && !done; ++s) {
      step(epoch, s, next);
      const bool epoch_end = s + 1 == epoch_steps;
      if (epoch_end)
        at_.epoch = epoch + 1, at_.step_in_epoch = 0;
      else
        at_.epoch = epoch, at_.step_in_epoch = s + 1;
      if (stop_requested(o_, comm_)) {
        if (comm_.root()) progress_->finish();
        save();
        res_.stopped = true;
        return false;
      }
      const bool evaluates =
          o_.eval_steps > 0 ? res_.steps % o_.eval_steps == 0 || res_.steps == length_.max_steps
                            : epoch_end;
      if (evaluates) done = evaluate_now(epoch, s + 1);
      if (evaluates || epoch_end ||
          (o_.checkpoint_every > 0 && res_.steps % o_.checkpoint_every == 0))
        save();
    }
    if (comm_.root()) progress_->finish();
    return done;
  }

  // One optimizer step (step s of the epoch) and its metrics record and progress line.
  template <typename Next>
  void step(int epoch, int64_t s, Next& next) {
    const int n =
        static_cast<int>(std::min<int64_t>(lo_.accumulation, micros_ - s * lo_.accumulation));
    const double t0 = now_seconds();
    const StepResult r = stepper_->step(res_.steps, length_.max_steps, next, "no model written", n);
    StepMetrics sm = StepMetrics::of(r, m_.layout().heads(), *stepper_, lo_, comm_.size());
    sm.regression = m_.config().regression();
    sm.step = ++res_.steps, sm.epoch = epoch + 1;
    sm.seconds = now_seconds() - t0;
    sm.elapsed = at_.elapsed += sm.seconds;
    sm.train_flops = at_.train_flops += flops_per_token_ * static_cast<double>(r.real_tokens);
    if (comm_.root()) {
      log_ << sm.to_json().dump() << std::endl;
      char fields[128];
      std::snprintf(fields, sizeof fields, "epoch %d/%d  loss %.4f  lr %.2e%s", epoch + 1,
                    length_.epochs, r.loss(), r.lr, r.skipped ? "  (update skipped)" : "");
      progress_->update(res_.steps, static_cast<double>(r.real_tokens), sm.seconds, fields);
    }
    io::crash_point("step");
  }

  // An evaluation after the step just done: its scores, the best model kept; whether early
  // stopping ends the run.
  bool evaluate_now(int epoch, int64_t steps_in_epoch) {
    if (comm_.root()) progress_->finish();
    const int64_t per_epoch = length_.steps_per_epoch;
    const double epoch_done =
        epoch + static_cast<double>(steps_in_epoch) / static_cast<double>(per_epoch);
    res_.dev_steps.push_back(res_.steps);
    res_.dev_epochs.push_back(epoch_done);
    evaluate_(epoch_done, at_.elapsed);
    // Said when measured: a run stopped later has shown this one's.
    std::ostringstream when;
    when << "finetune: epoch "
         << (steps_in_epoch == per_epoch ? std::to_string(epoch + 1) : fixed(epoch_done, 2)) << "/"
         << length_.epochs << " (step " << res_.steps << ") dev " << latest_dev_scores(res_);
    say(o_.say, when.str());
    keep_if_best(o_, m_, res_, log_);
    return early_stopping_reached(o_, res_);
  }

  // A save of the run's state: the resume file and, under keep_checkpoints, a directory.
  void save() {
    const std::string records = comm_.root() ? run_records(o_, log_) : std::string();
    save_resume(o_, m_, *stepper_, identity_, res_, at_, records);
    save_checkpoint_dir(o_, m_, files_, res_, at_, length_, records);
  }

  void say_early_stop() {
    res_.stopped_early = true;
    const size_t best = static_cast<size_t>(best_evaluation(o_, res_));
    say(o_.say, "finetune: early stopping at step " + std::to_string(res_.steps) + " of " +
                    std::to_string(length_.max_steps) + ": " +
                    std::to_string(o_.early_stopping_patience) +
                    " evaluations without `save_best` " + o_.save_best + " beating " +
                    fixed(dev_metric(res_, o_.save_best, best), 4) + " by more than " +
                    fixed(o_.early_stopping_threshold, 4) + "; the model of step " +
                    std::to_string(res_.dev_steps[best]) + " is the one written");
  }

  model::BertModel& m_;
  const FinetuneOptions& o_;
  const std::vector<Seq>& seqs_;
  const std::vector<std::vector<int64_t>>& rows_;
  std::ostream& log_;
  FinetuneResult& res_;
  const ModelFiles& files_;
  Evaluate evaluate_;
  dist::Comm& comm_ = dist::Comm::world();
  LoopOptions lo_;  // o.loop with warmup_ratio resolved (the Stepper keeps a reference)
  int64_t step_rows_, micros_;
  RunLength length_;
  nlohmann::json identity_;               // what the resume file records and a resume must match
  std::optional<ProgressLine> progress_;  // (from the step a resumed run goes on from)
  double flops_per_token_ = nonembedding_flops_per_token(m_.layout());
  FinetunePlace at_;
  std::unique_ptr<Stepper> stepper_;
};

template <typename Seq, typename Evaluate>
void train_epochs(model::BertModel& m, const FinetuneOptions& o, const std::vector<Seq>& seqs,
                  const std::vector<std::vector<int64_t>>& rows, std::ostream& log,
                  FinetuneResult& res, const ModelFiles& files, Evaluate evaluate) {
  FinetuneLoop<Seq, Evaluate>(m, o, seqs, rows, log, res, files, evaluate).run();
}

}  // namespace packbert::train
