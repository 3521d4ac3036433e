// What a pre-training checkpoint holds beside its tensors: the 'packbert' metadata (the format in
// docs/FORMATS.md), read and written in one place, and the checks that a resume continues the
// same run. The tensors (weights, moments, sparse patterns) are written by the Trainer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "model/params.h"
#include "train/loader.h"

namespace packbert::train {

struct PretrainOptions;

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

  // Throws InputError naming the first setting in which `now` (with this invocation's sequences
  // checksum, rows per whole micro-batch and process count) differs from the run that wrote
  // this state, or when there is nothing left to train.
  void check_resumable(const PretrainOptions& now, uint64_t sequences_checksum,
                       int64_t rows_per_batch, int processes, const std::string& where) const;
};

// The block sparsity a packbert checkpoint's metadata records (dense for any other file).
model::Sparsity sparsity_of(const io::SafetensorsFile& f);
// "dense weights", or "`block` B `sparsity` S" (option fields, for messages).
std::string sparsity_text(const model::Sparsity& s);

}  // namespace packbert::train
