// trainer_state.json: the run's state as Hugging Face's Trainer writes it into each checkpoint
// (global_step, epoch, max_steps, log_history, best_metric, best_model_checkpoint, ...), built
// from the run's metrics.jsonl records, so that a user or a tool that reads transformers' layout
// finds a packbert run where it looks.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace packbert::train {

struct TrainerStateInfo {
  int64_t global_step = 0, max_steps = 0;
  double epoch = 0;  // epochs done, fractional mid-epoch (pre-training: passes over the data)
  int num_train_epochs = 0;
  int64_t logging_steps = 0, eval_steps = 0, save_steps = 0, train_batch_size = 0;
  std::optional<double> best_metric;  // the best evaluation's metric, and where it is
  std::optional<int64_t> best_global_step;
  std::string best_model_checkpoint;
  double total_flos = 0;
};

// One metrics.jsonl record as a log_history entry, or null for those HF does not log (every
// logging_steps-th step record, and the last one, are; evaluations always): step records as
// {loss, grad_norm, learning_rate, epoch, step}, evaluations with HF's eval_ names
// (eval_accuracy, eval_matthews_correlation, eval_pearson, eval_spearmanr, eval_exact_match,
// eval_loss for pre-training's MLM loss, ...) and the rest as eval_<key>.
nlohmann::json log_history_entry(const nlohmann::json& record, int64_t logging_steps,
                                 int64_t last_step);

// trainer_state.json's object: `info` and the log history of `metrics_jsonl` (a run's
// metrics.jsonl text) up to info.global_step.
nlohmann::json trainer_state(const TrainerStateInfo& info, const std::string& metrics_jsonl);

}  // namespace packbert::train
