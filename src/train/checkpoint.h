// A training run's files: what a checkpoint holds beside its tensors (the 'packbert' metadata, the
// format in docs/FORMATS.md, read and written in one place), the checks that a resume continues
// the same run, the weights + moments tensors and the Stepper's counters that pre-training's
// checkpoints and fine-tuning's resume file share, and metrics.jsonl's cut-back on resume.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "model/params.h"
#include "train/loader.h"
#include "train/loop.h"

namespace packbert::train {

// What a resumed pre-training invocation asks for, compared field by field with the run that
// wrote the checkpoint.
struct ResumeRequest {
  LoopOptions loop;
  std::string init;       // --init given now ("" for none)
  std::string sequences;  // the sequences file, for messages
  uint64_t sequences_checksum = 0;
  bool packed = false, one_per_row = false;
  model::Sparsity sparsity;
  int64_t max_steps = 0;
  int64_t rows_per_batch = 0;  // rows of a whole step's micro-batch: processes x rows each
  int processes = 1;
};

// The divergence guard's state (PretrainOptions::divergence_factor), carried in checkpoints.
struct DivergenceGuard {
  static constexpr int kWarmup = 10;  // training steps averaged before the guard acts on them
  double train_ema = 0, lowest_train_ema = 0;
  int64_t train_steps = 0;  // steps averaged so far
  double best_eval = 0;     // lowest held-out MLM loss so far
  int64_t best_eval_step = -1;
  // The EMA (weight 0.1) of the training loss, and whether it is above factor x its lowest.
  bool train_diverged(double loss, double factor);
  bool eval_diverged(double mlm_loss, double factor) const {
    return factor > 0 && best_eval_step >= 0 && mlm_loss > factor * best_eval;
  }
};

struct TrainingState {
  int64_t step = 0;       // optimizer steps done
  std::string optimizer;  // "adamw" | "lamb" (empty in checkpoints older than the field)
  Cursor cursor;          // where the data order goes on
  uint64_t sequences_checksum = 0;
  bool packed = false, one_per_row = false;
  std::string precision = "fp32", master_weights = "fp32", loss_scaling = "off";
  std::string backend = "cpu";  // informational: a run may resume on another backend
  int64_t rows_per_batch = 0;   // rows of a whole step's micro-batch: processes x rows each
  int processes = 1;
  std::optional<uint64_t> seed;
  double elapsed = 0;      // training seconds so far
  double train_flops = 0;  // the encoder's linear-layer training FLOPs so far
  std::optional<DivergenceGuard> divergence;
  std::string init;  // the model the run started from (empty: a fresh one)
  // The sparse run's settings (block, sparsity, prune_ratio, updates, regrow, init), or null.
  nlohmann::json sparsity;
  // The Stepper's counters (save_stepper_state: optimizer steps, the outlier guard, the scaler).
  nlohmann::json stepper = nlohmann::json::object();

  model::Sparsity block_sparsity() const;
  nlohmann::json to_json() const;
  // `where` names the file in errors.
  static TrainingState from_json(const nlohmann::json& j, const std::string& where);
  // The state of a checkpoint file: InputError when it is not a packbert training checkpoint.
  static TrainingState read(const io::SafetensorsFile& f);

  // Throws InputError naming the first setting in which `now` differs from the run that wrote
  // this state, or when there is nothing left to train.
  void check_resumable(const ResumeRequest& now, const std::string& where) const;
};

// What a training run's file records beyond its config, shared by pretrain's checkpoints and
// fine-tuning's resume file: the weights and Adam/LAMB moments as tensors (moments under
// "optimizer.m." / "optimizer.v."), and the Stepper's counters (the optimizer's step count, the
// gradient-norm guard's history, the outlier skips, the loss scaler) as JSON fields.
std::vector<io::TensorToWrite> weight_and_moment_tensors(const model::ParamLayout& layout,
                                                         const float* weights, const float* m,
                                                         const float* v);
void save_stepper_state(Stepper& stepper, nlohmann::json& state);
// The moments and step count from `file` (this rank's shard of each), then the counters that
// `state` records (files written before they were are read as they were: no history).
void load_stepper_state(Stepper& stepper, const model::ParamLayout& layout,
                        const io::SafetensorsFile& file, const nlohmann::json& state);

// Keeps the metrics.jsonl records of steps up to `step` (a resumed run writes the later ones
// again); a last line cut short by a kill is dropped, any other bad line refused.
void truncate_metrics(const std::string& path, int64_t step);
// The checkpoint-<step><suffix> entries of `dir` (files, or directories when `directories`), by
// step, with their paths; names whose step is not a number of at most 18 digits are not theirs.
std::vector<std::pair<int64_t, std::string>> checkpoints_in(const std::string& dir,
                                                            const std::string& suffix,
                                                            bool directories);
// The name of a file pretrain writes into its run directory (an input must not be one).
bool is_run_output(const std::string& name);

// The model config a packbert checkpoint's metadata records (InputError when it has none).
model::BertConfig checkpoint_config(const io::SafetensorsFile& f);
// The block sparsity a packbert checkpoint's metadata records (dense for any other file).
model::Sparsity sparsity_of(const io::SafetensorsFile& f);
// "dense weights", or "`block` B `sparsity` S" (option fields, for messages).
std::string sparsity_text(const model::Sparsity& s);

}  // namespace packbert::train
