// Fine-tuning with packing: sequence (or sentence-pair) classification or regression (STS-B:
// one output, mean squared error) from TSV, CSV or JSONL, and SQuAD v1.1 / v2.0 span extraction
// (data/squad.h). Examples (SQuAD: question + context windows) are packed into rows like
// pre-training sequences; the classifier reads each sequence's pooled [CLS] and the span head's
// softmax runs over each sequence's own tokens, so packing changes nothing but the cost.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/classify_tsv.h"
#include "data/squad.h"
#include "data/tokenizer.h"
#include "model/bert.h"
#include "train/loop.h"
#include "train/metrics_log.h"
#include "train/scores.h"

namespace packbert::train {

enum class FinetuneTask { classify, squad };

// Where fine-tuning and task evaluation say their notes and warnings (on rank 0), one line each:
// the CLI's printer, which turns the option fields they name into flags; unset, stderr as they
// are.
using Say = std::function<void(const std::string& line)>;

struct FinetuneOptions {
  FinetuneTask task = FinetuneTask::classify;
  Say say;
  std::string train, dev, init, out_dir, vocab;
  int max_seq_len = 128;
  int epochs = 3;
  // Optimizer steps in all (Hugging Face's max_steps): > 0 overrides epochs, the data visited
  // again as often as it takes (the last epoch cut short).
  int64_t max_steps = 0;
  // Warm-up as a share of the run's steps (HF's warmup_ratio: ceil(ratio x steps)); unset:
  // loop.warmup_steps.
  std::optional<double> warmup_ratio;
  // Evaluate on dev every this many steps and after the last (HF's eval_strategy "steps"); 0:
  // after every epoch (and after the last step when max_steps cuts an epoch short).
  int64_t eval_steps = 0;
  // Early stopping on save_best's metric (HF's EarlyStoppingCallback): stop after `patience`
  // evaluations in a row that did not beat the best before them by more than `threshold`;
  // 0: never. The best evaluation's model is the one written.
  int early_stopping_patience = 0;
  double early_stopping_threshold = 0;
  // checkpoint-STEP/ directories transformers loads (config.json, model.safetensors, vocab.txt,
  // tokenizer_config.json, special_tokens_map.json, labels.json, trainer_state.json), one at each
  // save of the resume file (every checkpoint_every steps, each evaluation, each epoch's end,
  // a stop): the latest `keep_checkpoints` and the best evaluation's are kept (HF's
  // save_total_limit). They gather in <out_dir>.checkpoints/ and move into out_dir with the
  // model. 0: none.
  int keep_checkpoints = 0;
  ReportTo report;         // metrics.jsonl, and TensorBoard event files in out_dir/runs/
  int logging_steps = 10;  // without a terminal, a progress line every this many steps
  // Resumable fine-tuning: the run's state (weights, moments, position) is written to
  // `<out_dir>.resume.safetensors` every checkpoint_every steps (0: never), at each epoch's end
  // and when `stop` is set (SIGINT/SIGTERM in the CLI); `resume` continues from it bit-exactly.
  // The file is removed once the model is published.
  int64_t checkpoint_every = 0;
  bool resume = false;
  const std::atomic<bool>* stop = nullptr;
  std::string resume_path;  // set by finetune(): <out_dir>.resume.safetensors
  // The dev metric whose best epoch becomes the model written to out_dir (Hugging Face's
  // load_best_model_at_end): classify accuracy | f1 (two labels) | mcc, regression pearson |
  // spearman, squad exact_match | f1;
  // empty: the last epoch's model. The best weights so far wait in <out_dir>.best.safetensors
  // (kept across --resume, removed with the resume file).
  std::string save_best;
  std::string best_path;  // set by finetune(): <out_dir>.best.safetensors
  // Set by finetune(): <out_dir>.checkpoints, and out_dir as given (out_dir itself is then the
  // staging directory).
  std::string checkpoints_dir, final_dir;
  bool packed = true;
  bool overwrite = false;  // replace a model directory already at out_dir
  // classify: train a new classifier (the data's labels, sorted) even when init has one.
  bool new_head = false;
  // classify: a regression head (one output trained towards the labels' values by mean squared
  // error, as Hugging Face's num_labels 1) or a classifier. Unset: init's head when it has one
  // (and not new_head), else regression when the labels are decimal numbers
  // (data::decimal_labels, run_glue's rule).
  std::optional<bool> regression;
  data::TsvColumns columns;  // classify: the text and label columns (empty: from the header)
  // Lowercase when tokenising (--uncased) or not (--cased); unset: data::decide_casing.
  std::optional<bool> lower_case;
  data::SquadOptions squad;  // doc stride, query and answer limits (max_seq_len above wins)
  // Optimizer (AdamW by default), schedule, batch, clipping, accumulation, precision, recompute
  // and ZeRO: the same loop as pre-training, with fine-tuning's defaults (set here).
  LoopOptions loop = [] {
    LoopOptions l;
    l.optimizer.kind = OptimizerKind::adamw;
    l.lr = 5e-5;
    l.rows_per_batch = 8;
    l.warmup_steps = 10;
    return l;
  }();
};

struct FinetuneResult {
  // Each evaluation's step and epoch (fractional mid-epoch), and its scores by task.
  std::vector<int64_t> dev_steps;
  std::vector<double> dev_epochs;
  std::vector<double> dev_accuracy;             // classify: after each evaluation
  std::vector<ClassifyScore> dev_scores;        // classify: after each evaluation
  std::vector<RegressionScore> dev_regression;  // regression: after each evaluation
  // classify: the GLUE task (data::glue_task; "" when neither named nor shown by the header) and
  // the metric that leads its scores: the task's GLUE metric (accuracy, f1, mcc, pearson).
  std::string glue_task, metric;
  double majority_baseline = 0;  // accuracy of always predicting the most frequent train label
  std::vector<data::SquadScore> dev_squad;  // squad: exact match and F1 (%) after each evaluation
  int64_t steps = 0;
  int64_t max_steps = 0;       // the run's planned steps
  bool stopped_early = false;  // early stopping ended the run before max_steps
  int best = -1;  // under save_best: the evaluation whose model was written (-1: the last step's)
  int num_labels = 0;  // classify: the classifier's outputs; 1 is a regression head
  bool regression() const { return num_labels == 1; }
  int64_t train_sequences = 0, dev_sequences = 0;  // examples (classify) or windows (squad)
  int64_t train_rows = 0;                          // rows after packing
  int64_t skipped = 0;  // squad training questions whose answer is not in the context
  std::vector<std::string> initialized;  // tensors --init lacked, initialised from the seed
  std::string label_note;   // classify: where the label ids came from, and what they are
  bool stopped = false;     // `stop` was set: the state is in the resume file, no model written
  std::string resume_path;  // where the run's resumable state is (or was) written
};

// Fine-tunes the model at `init` (any form train::load_model reads; a tensor outside the
// encoder that it lacks, such as the classifier / qa_outputs head, is initialised fresh),
// evaluating on dev after every epoch (accuracy, or SQuAD exact match and F1 with the predictions
// written to out_dir/predictions.json), and exports the result to out_dir (HF layout, with the
// head). Appends JSONL metrics to out_dir/metrics.jsonl.
FinetuneResult finetune(const FinetuneOptions& options);

struct TaskEvalOptions {
  FinetuneTask task = FinetuneTask::squad;
  Say say;
  std::string model;  // fine-tuned model: HF directory (with labels.json for classify)
  std::string data;   // dev TSV or SQuAD JSON
  std::string vocab;
  // squad: {id: answer}; classify: "index<TAB>prediction" lines (run_glue's predict_results)
  std::string predictions;
  std::optional<bool> lower_case;  // as FinetuneOptions::lower_case
  data::TsvColumns columns;        // as FinetuneOptions::columns
  int max_seq_len = 384;
  int rows_per_batch = 8;
  data::SquadOptions squad;
  model::Precision precision = model::Precision::fp32;
  kernels::BackendKind backend = kernels::BackendKind::cpu;
};

struct TaskEvalResult {
  double accuracy = 0;                        // classify
  ClassifyScore scores;                       // classify
  std::optional<RegressionScore> regression;  // classify with a regression model
  std::string glue_task, metric;              // classify: as FinetuneResult's
  data::SquadScore squad;                     // squad (%)
  int64_t examples = 0, sequences = 0;        // questions/examples and the windows they became
};

// Evaluates a fine-tuned model on a dev file (packed, dropout off): classification accuracy or
// SQuAD exact match / F1. A model without the task's head is an InputError.
TaskEvalResult evaluate_task(const TaskEvalOptions& options);

}  // namespace packbert::train
