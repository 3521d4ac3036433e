// Fine-tuning's run files: the resume file (weights, moments, the Stepper's counters, the flags
// that must match and the place in the epoch) and the best evaluation's weights (--save-best),
// and the model published to out_dir.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "data/casing.h"
#include "io/safetensors.h"
#include "model/bert.h"
#include "train/finetune.h"
#include "train/loop.h"
#include "train/model_files.h"

namespace packbert::train {

// Where a fine-tuning run is: optimizer steps done, the epoch and step within it to go on from,
// its training seconds.
struct FinetunePlace {
  int epoch = 0;
  int64_t step_in_epoch = 0;
  double elapsed = 0;
  double train_flops = 0;  // the run's training FLOPs so far (metrics' train_flops)
};

// What a fine-tuning run's resume file records beside the weights and moments: what must match
// for a bit-exact continuation (every flag that changes the result), and where the run was.
nlohmann::json resume_identity(const FinetuneOptions& o);
// The dev results so far (restored with the run's position on --resume).
nlohmann::json dev_results(const FinetuneResult& r);
void restore_dev_results(const nlohmann::json& j, FinetuneTask task, FinetuneResult& r);
// The state of the run a --resume file holds, checked against this run's `identity` (the data
// and flags it must share); the file itself in `file`.
nlohmann::json read_resume_state(const FinetuneOptions& o, const nlohmann::json& identity,
                                 std::optional<io::SafetensorsFile>& file);
// The run's metrics.jsonl so far (`log` flushed first), read once per save for the resume file
// and the checkpoint directory's trainer_state.json.
std::string run_records(const FinetuneOptions& o, std::ostream& log);
// Writes the resume file: weights, moments, the optimizer's state, the place to go on from and
// the metrics `records`; atomically, rank 0 alone (the moments gathered under ZeRO-1).
void save_resume(const FinetuneOptions& o, model::BertModel& m, Stepper& stepper,
                 const nlohmann::json& identity, const FinetuneResult& res, const FinetunePlace& at,
                 const std::string& records);
// The dev evaluations made so far (whichever task's scores they are).
size_t evaluations(const FinetuneResult& res);
// Which evaluation's save_best metric is best: the highest (all are higher-is-better), a tie
// keeping the earlier, a NaN (a constant prediction's correlation) beaten by any number; -1 when
// there is none or no save_best.
int best_evaluation(const FinetuneOptions& o, const FinetuneResult& res);
// HF's EarlyStoppingCallback counter over the evaluations so far: reset by one that beats the
// best before it by more than early_stopping_threshold, else (a NaN too) one more.
int evaluations_without_improvement(const FinetuneOptions& o, const FinetuneResult& res);
bool early_stopping_reached(const FinetuneOptions& o, const FinetuneResult& res);
// Keeps the model's weights in best_path when the last evaluation is the best (best_evaluation),
// and records it.
void keep_if_best(const FinetuneOptions& o, const model::BertModel& m, const FinetuneResult& res,
                  std::ostream& log);
// An epoch for metrics.jsonl: a whole number as one (1), else as it is (1.5).
nlohmann::json json_epoch(double epoch);
// The model to write to out_dir under save_best: the best evaluation's weights, in a model of
// m's shape and heads; m itself otherwise.
const model::BertModel& published_model(const FinetuneOptions& o, const model::BertModel& m,
                                        std::unique_ptr<model::BertModel>& best);
// The files a fine-tuned model directory holds beside its weights.
ModelFiles task_model_files(const FinetuneOptions& o, const data::Casing& casing,
                            const std::vector<std::string>& names = {});
// The run's length: its optimizer steps, the steps of a whole epoch and the epochs begun.
struct RunLength {
  int64_t max_steps = 0, steps_per_epoch = 0;
  int epochs = 0;
};
// Under keep_checkpoints (rank 0): <checkpoints_dir>/checkpoint-<step>/ with the model as
// transformers loads it (task_model_files, labels.json for a classifier) and trainer_state.json;
// then only the latest keep_checkpoints and the best evaluation's are kept.
void save_checkpoint_dir(const FinetuneOptions& o, const model::BertModel& m,
                         const ModelFiles& files, const FinetuneResult& res,
                         const FinetunePlace& at, const RunLength& length,
                         const std::string& records);
// Once the model is published: the checkpoint directories move into final_dir.
void move_checkpoints(const FinetuneOptions& o);
// Rank 0 writes the model to publish (published_model) to out_dir, with the classifier's label
// names (and labels.json) when it has them.
void write_published(const FinetuneOptions& o, const model::BertModel& m,
                     const data::Casing& casing, const std::vector<std::string>& names = {});

}  // namespace packbert::train
