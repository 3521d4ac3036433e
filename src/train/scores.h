// Scores of a fine-tuned model over a dev set: classification (accuracy, MCC, F1), regression
// (Pearson, Spearman, MSE), which metric leads a task's scores, and the dev scores of a run as
// its lines and its --save-best metric read them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace packbert::train {

// Classification metrics over a dev set: accuracy, Matthews correlation (GLUE's CoLA metric;
// multi-class as sklearn computes it) and, with two labels, F1 of label 1 (MRPC's and QQP's).
struct ClassifyScore {
  double accuracy = 0, mcc = 0;
  std::optional<double> f1;  // two labels only
};
ClassifyScore classify_score(const std::vector<int32_t>& truth, const std::vector<int32_t>& pred,
                             int num_labels);

// Regression metrics over a dev set (GLUE's STS-B): Pearson's and Spearman's correlation (as
// scipy's pearsonr and spearmanr, tied values ranked by their mean rank) and the mean squared
// error. A correlation with a constant side is NaN, as scipy's.
struct RegressionScore {
  double pearson = 0, spearman = 0, mse = 0;
};
RegressionScore regression_score(const std::vector<double>& truth, const std::vector<double>& pred);

struct FinetuneResult;

// The value of the dev metric `name` (FinetuneOptions::save_best) after an evaluation; NaN when
// its scores lack it.
double dev_metric(const FinetuneResult& r, const std::string& name, size_t evaluation);
// The dev scores of the latest evaluation, as the end-of-run table names them.
std::string latest_dev_scores(const FinetuneResult& r);
// The metric that leads a classifier's scores: its GLUE task's (F1 only where it is defined, for
// two labels), else accuracy.
std::string headline_metric(const std::string& task, int num_labels);
// Whether a --save-best metric is a regression head's (pearson, spearman).
bool regression_metric(const std::string& name);

}  // namespace packbert::train
