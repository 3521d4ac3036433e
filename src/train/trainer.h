// The pre-training loop: MLM + NSP over a packs file (or the padded baseline), with gradient
// accumulation, clipping, warmup + decay, AdamW or LAMB, packing-aware hyperparameters,
// periodic held-out evaluation, JSONL metrics, atomic checkpoints that resume bit-exactly, and a
// clean stop on request (SIGINT/SIGTERM in the CLI).
#pragma once

#include <atomic>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "data/sequences.h"
#include "io/safetensors.h"
#include "model/bert.h"
#include "train/checkpoint.h"
#include "train/loader.h"
#include "train/loop.h"
#include "train/metrics.h"
#include "train/metrics_log.h"
#include "train/optimizer.h"
#include "train/sparsity.h"

namespace packbert::train {

struct PretrainOptions {
  std::string sequences;   // .seqs file
  std::string packs;       // .packs file; empty = padded baseline (one sequence per row)
  std::string out_dir;     // checkpoint.safetensors and metrics.jsonl go here
  bool overwrite = false;  // start over in an out_dir that holds an earlier run's checkpoint
  std::string vocab;       // needed for dynamic masking and the vocab check
  std::string init;        // optional: HF-layout dir or checkpoint to start from
  // With init a packbert training checkpoint (two-phase pre-training): carry its optimizer
  // moments and step count into this run instead of starting them at zero. The learning-rate
  // schedule, data order and step counter start over either way.
  bool carry_optimizer = false;
  model::ShapeRequest shape;  // model shape when not initialised from a checkpoint
  LoopOptions loop;           // optimizer, schedule, batch, precision, recompute, ZeRO
  // Pipeline stages (docs/DESIGN.md §7c): the processes form pipeline_stages stages x the rest as
  // replicas; stage_layers, when given, the layers of each stage (else balanced by FLOPs).
  int pipeline_stages = 1;
  std::vector<int> stage_layers;
  SparseOptions sparse;                 // block-sparse encoder weights (train/sparsity.h)
  std::string packing_adjust = "none";  // none | ga | beta (Graphcore)
  int64_t max_steps = 100;
  int64_t checkpoint_every = 0;  // 0 = only at the end (and on stop)
  // Checkpoints kept in out_dir: checkpoint.safetensors (the latest) and the keep_checkpoints - 1
  // before it as checkpoint-<step>.safetensors; older ones are removed.
  int keep_checkpoints = 2;
  // Stop (exit 2, nothing written) when the held-out MLM loss rises above this multiple of its
  // best so far, or the training loss's moving average above this multiple of its lowest; 0 = off.
  double divergence_factor = 4;
  int64_t eval_every = 0;  // 0 = only at the end
  // Where metrics go besides metrics.jsonl (TensorBoard event files in out_dir/runs/), and the
  // step records trainer_state.json's log_history keeps (every logging_steps-th and the last).
  ReportTo report;
  int64_t logging_steps = 10;
  // Sequences held out for evaluation when the sequences file records no held-out split of its
  // own (prepare --eval-fraction splits by document, which is what to use): the file's last
  // ones. Unset: 0.02 for such files; set with a file that has a split: an error.
  std::optional<double> eval_fraction;
  bool dynamic_masking = false;
  double max_minutes = 0;  // stop (with a checkpoint) after this long; 0 = no limit
  // Stop (with a checkpoint) at the first evaluation whose held-out MLM accuracy reaches this
  // (MLPerf's time-to-train rule); 0 = off. Needs evaluations (eval_every) to act before the end.
  double target_accuracy = 0;
  bool compute_padding = false;  // padded baseline that pays for padding like frameworks do
  // With packs: the packs' sequences one per row (padded), the same sequences per step and in the
  // same order as packed training with the same seed: the padded side of a paired comparison.
  bool one_per_row = false;
  // Set by the CLI: whether --preset was given (resume refuses one that is not the checkpoint's).
  bool preset_given = false;
};

// Pre-training metrics over one epoch of `loader` (dropout off): what pretrain reports on its
// held-out split and `packbert eval` over a whole file. step, elapsed and eval_seconds are left 0.
// `progress`, when given, is called after each batch with the sequences it held and its seconds.
// `links`: m is a pipeline stage, whose forward takes the stage below's output from them and hands
// its own up; the last stage's metrics are the evaluation's (the others' are zero).
EvalMetrics evaluate_mlm(
    model::BertModel& m, BatchLoader& loader, model::Precision precision = model::Precision::fp32,
    const std::function<void(int64_t sequences, double seconds)>& progress = {},
    StageLinks* links = nullptr);

// Why Trainer::run returned. target_reached: an evaluation (the last one included) reached
// target_accuracy.
enum class StopReason { finished, requested, time_limit, target_reached };

class Trainer {
 public:
  // resume: continue from out_dir/checkpoint.safetensors (must exist and match the options);
  // metrics.jsonl is cut back to the checkpoint's step. Without resume, an out_dir that holds a
  // checkpoint is refused unless options.overwrite. Stale temporary files of a killed write are
  // removed either way.
  Trainer(const PretrainOptions& options, bool resume);
  ~Trainer();

  // Runs until max_steps, a stop request, or the time limit. Calls the callbacks per step and
  // per evaluation (both also go to out_dir/metrics.jsonl), then evaluates and checkpoints.
  // A run that cannot go on (non-finite loss --nan-abort times in a row, or an update that made
  // the parameters non-finite) throws InputError and writes no checkpoint: the last good one
  // stays as it was.
  StopReason run(const std::atomic<bool>& stop,
                 const std::function<void(const StepMetrics&)>& on_step,
                 const std::function<void(const EvalMetrics&)>& on_eval);
  EvalMetrics evaluate();
  // Writes the checkpoint atomically; refuses (InputError, nothing written) when a parameter or
  // moment is not finite.
  void save_checkpoint();
  int64_t step() const { return step_; }
  // The pipeline stages' layer counts ("6,6"; "12" for one stage).
  std::string stage_layers_text() const;
  model::BertModel& model() { return *model_; }
  const Optimizer& optimizer() const { return stepper_->optimizer(); }
  const model::BertConfig& config() const { return model_->config(); }
  std::string checkpoint_path() const;
  // checkpoint-<step>.safetensors: an earlier checkpoint kept beside the latest.
  std::string earlier_checkpoint_path(int64_t step) const;
  // best.safetensors: the whole state (weights and moments) at the evaluation with the lowest
  // held-out MLM loss.
  std::string best_path() const;
  int64_t saved_step() const { return saved_step_; }  // step of the checkpoint on disk; -1: none
  int64_t outlier_skips() const { return stepper_->outlier_skips(); }
  // Steps skipped because a gradient overflowed under --loss-scale dynamic, and the scale now.
  int64_t overflow_skips() const { return stepper_->scaler().overflows; }
  double loss_scale() const { return stepper_->scaler().scale; }
  // The tensors --init did not hold (heads, pooler), initialised from the seed instead.
  const std::vector<std::string>& initialized() const { return initialized_; }

 private:
  // The run's set-up, in the order it happens: options, outputs, inputs, the checkpoint's run
  // (resume), the model, the step plan, the held-out split, carried or restored state.
  void setup(bool resume);
  void check_options(bool resume) const;
  void check_outputs(bool resume) const;
  void read_inputs();
  void check_resumed_model(const TrainingState& state, const io::SafetensorsFile& ckpt);
  void make_model(const io::SafetensorsFile* ckpt, const TrainingState* state,
                  const std::optional<model::BertConfig>& new_shape);
  OptimizerConfig plan_steps();
  void split_rows();
  void carry_optimizer(const OptimizerConfig& oc);
  void restore(const io::SafetensorsFile& ckpt, const TrainingState& state);
  TrainingState training_state();
  // The earlier checkpoints in out_dir by step, oldest first.
  std::vector<std::pair<int64_t, std::string>> earlier_checkpoints() const;
  void save_best(const EvalMetrics& e);
  // This run's whole state (weights, moments, block patterns, counters) to `path`, every rank
  // taking part (ZeRO-1's and the stages' gathers), rank 0 writing. `best` null: the checkpoint
  // (the one on disk first kept as checkpoint-<step> under keep_checkpoints); InputError when a
  // value is not finite. Otherwise best.safetensors with `best` in its state; nothing written
  // when a value is not finite.
  void write_state(const std::string& path, const nlohmann::json& best);
  // Before a new run's first write: removes an earlier run's checkpoint-*.safetensors and
  // best.safetensors (--overwrite starts over).
  void clear_earlier_run();
  void check_disk_space() const;
  // The pipeline stage this process runs of a model of config c (the whole model in one stage).
  model::Stage stage_of(const model::BertConfig& c);  // (sets stages_)
  // Under pipeline stages: each stage's first replica sends `mine` (arrays of its stage layout's
  // size) to world rank 0, which returns them laid out as the whole model's arrays (the tied word
  // table from the first stage; tied_equal, when given, is cleared on rank 0 where the last
  // stage's copy differs from it in any bit); empty elsewhere.
  std::vector<std::vector<float>> gather_stages(const std::vector<const float*>& mine,
                                                bool* tied_equal = nullptr) const;
  model::ParamLayout whole_layout() const;
  // Trainer::run's parts: what the run keeps on disk (for messages), a divergence's error, an
  // evaluation and a checkpoint with their metrics.jsonl records, one step and its metrics.
  std::string kept_text() const;
  [[noreturn]] void diverged(const std::string& what) const;
  void evaluate_and_record(const std::function<void(const EvalMetrics&)>& on_eval);
  void checkpoint_and_record();
  // out_dir/trainer_state.json (Hugging Face's) for the checkpoint just written (rank 0).
  void write_trainer_state();
  StepMetrics train_step(double flops_per_token);

  PretrainOptions opt_;
  dist::Comm& comm_;
  std::unique_ptr<dist::Grid> grid_;  // stages x replicas
  std::vector<model::Stage> stages_;  // the pipeline's stages (one: the whole model)
  data::SequencesFile seqs_;
  uint64_t seqs_checksum_ = 0;
  std::optional<data::PacksFile> packs_;
  std::optional<data::Vocab> vocab_;
  std::unique_ptr<model::BertModel> model_;
  std::vector<std::string> initialized_;
  std::unique_ptr<Stepper> stepper_;
  std::unique_ptr<BatchLoader> loader_;
  LoaderOptions train_rows_, eval_rows_;
  int64_t step_rows_ = 0;  // rows (packs) per micro-batch of the whole step: ranks x rows_per_batch
  int accumulation_ = 1;
  model::Recompute recompute_;  // the policy the steps use (`auto` resolved)
  int64_t step_ = 0;
  Cursor cursor_;
  double elapsed_ = 0;  // training seconds so far, earlier (resumed) runs included
  int64_t saved_step_ = -1;
  bool new_log_ = false;    // run() replaces metrics.jsonl (a new run) instead of appending
  double train_flops_ = 0;  // the encoder's linear-layer training FLOPs so far (resumes too)
  DivergenceGuard divergence_;
  std::vector<std::string> kept_;  // the earlier checkpoints' file names after the last save
  MetricsLog log_;                 // metrics.jsonl (and reporters), rank 0 during run()
  int64_t evaluated_at_ = -1;      // the step of the last evaluation
  bool resave_ = false;   // an evaluation after this step's checkpoint changed what it records
  bool reached_ = false;  // an evaluation met target_accuracy (rank 0's verdict, shared)
  bool earlier_run_cleared_ = false;  // clear_earlier_run() done (or a resume: nothing to clear)
};

}  // namespace packbert::train
