// A fine-tuned model's predictions on new text (`packbert predict`): classification (each
// example's label and every label's probability), regression (each example's value) and SQuAD
// (each question's answer; for v2.0 the null odds too), from files with or without labels or
// answers, packed, dropout off: the same batches and numbers `eval --predictions` gives.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/classify_tsv.h"
#include "data/squad.h"
#include "kernels/ops.h"
#include "model/precision.h"
#include "train/finetune.h"

namespace packbert::train {

struct PredictOptions {
  FinetuneTask task = FinetuneTask::classify;
  Say say;
  std::string model, data, vocab;
  // classify: a TSV "index, prediction, then one probability column per label" (a regression:
  // "index, prediction"), run_glue's predict_results with the probabilities added; squad:
  // {question id: answer} as predictions.json, and for v2.0 the null odds beside it
  // (null_odds_path).
  std::string out;
  std::optional<bool> lower_case;  // as FinetuneOptions::lower_case
  data::TsvColumns columns;        // as FinetuneOptions::columns (a label column is not read)
  int max_seq_len = 128;
  int rows_per_batch = 8;
  data::SquadOptions squad;
  // squad: whether questions may have no answer (SQuAD v2.0; run_qa's
  // --version_2_with_negative). Unset: as the file shows (is_impossible, or empty answers).
  std::optional<bool> v2;
  model::Precision precision = model::Precision::fp32;
  kernels::BackendKind backend = kernels::BackendKind::cpu;
};

struct PredictResult {
  int64_t examples = 0, sequences = 0;  // questions/examples and the windows they became
  bool regression = false, v2 = false;
  std::vector<std::string> written;  // the files written
};

// Where the null odds of SQuAD v2.0 predictions written to `out` go: "…predictions.json" becomes
// "…null_odds.json" (run_qa's names), any other name gets ".null_odds.json" appended.
std::string null_odds_path(const std::string& out);

PredictResult predict_file(const PredictOptions& options);

}  // namespace packbert::train
