#include "train/scores.h"

#include <algorithm>
#include <cmath>

#include "data/classify_tsv.h"
#include "text.h"
#include "train/finetune.h"

namespace packbert::train {

ClassifyScore classify_score(const std::vector<int32_t>& truth, const std::vector<int32_t>& pred,
                             int num_labels) {
  ClassifyScore s;
  const size_t K = static_cast<size_t>(std::max(num_labels, 2));
  std::vector<double> c(K * K, 0);  // confusion: c[truth * K + pred]
  for (size_t i = 0; i < truth.size(); ++i)
    c[static_cast<size_t>(truth[i]) * K + static_cast<size_t>(pred[i])] += 1;
  const double n = static_cast<double>(truth.size());
  if (n == 0) return s;
  double correct = 0;
  std::vector<double> t(K, 0), p(K, 0);  // per-label counts in truth and predictions
  for (size_t a = 0; a < K; ++a)
    for (size_t b = 0; b < K; ++b) t[a] += c[a * K + b], p[b] += c[a * K + b];
  for (size_t a = 0; a < K; ++a) correct += c[a * K + a];
  s.accuracy = correct / n;
  // Matthews correlation, the multi-class form (Gorodkin 2004); sklearn's matthews_corrcoef.
  double tp = 0, pp = 0, tt = 0;
  for (size_t a = 0; a < K; ++a) tp += t[a] * p[a], pp += p[a] * p[a], tt += t[a] * t[a];
  const double den = std::sqrt((n * n - pp) * (n * n - tt));
  s.mcc = den > 0 ? (correct * n - tp) / den : 0;
  // F1 of label 1 (the positive class of GLUE's binary tasks), sklearn's f1_score.
  if (num_labels == 2) {
    const double tp1 = c[1 * K + 1], fp = c[0 * K + 1], fn = c[1 * K + 0];
    s.f1 = tp1 + fp + fn > 0 ? 2 * tp1 / (2 * tp1 + fp + fn) : 0;
  }
  return s;
}

namespace {

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / n, my += y[i] / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0) : std::nan("");
}

// Ranks 1..n, tied values sharing the mean of the ranks they span.
std::vector<double> ranks(const std::vector<double>& x) {
  std::vector<size_t> order(x.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> r(x.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[order[k]] = (static_cast<double>(i + j) / 2) + 1;
    i = j + 1;
  }
  return r;
}

}  // namespace

RegressionScore regression_score(const std::vector<double>& truth,
                                 const std::vector<double>& pred) {
  RegressionScore s;
  if (truth.empty()) return s;
  for (size_t i = 0; i < truth.size(); ++i)
    s.mse += (pred[i] - truth[i]) * (pred[i] - truth[i]) / static_cast<double>(truth.size());
  s.pearson = pearson(truth, pred);
  s.spearman = pearson(ranks(truth), ranks(pred));
  return s;
}

double dev_metric(const FinetuneResult& r, const std::string& name, size_t evaluation) {
  if (!r.dev_regression.empty())
    return name == "pearson" ? r.dev_regression[evaluation].pearson
                             : r.dev_regression[evaluation].spearman;
  if (!r.dev_squad.empty()) {
    const data::SquadScore& s = r.dev_squad[evaluation];
    return name == "exact_match" ? s.exact_match : s.f1;
  }
  const ClassifyScore& s = r.dev_scores[evaluation];
  if (name == "accuracy") return s.accuracy;
  if (name == "mcc") return s.mcc;
  return s.f1 ? *s.f1 : std::nan("");
}

std::string latest_dev_scores(const FinetuneResult& r) {
  if (!r.dev_regression.empty()) {
    const RegressionScore& s = r.dev_regression.back();
    return "Pearson " + fixed(s.pearson, 4) + ", Spearman " + fixed(s.spearman, 4) + ", MSE " +
           fixed(s.mse, 4);
  }
  if (!r.dev_squad.empty()) {
    const data::SquadScore& s = r.dev_squad.back();
    std::string t = "exact match " + fixed(s.exact_match, 2) + "%, F1 " + fixed(s.f1, 2) + "%";
    if (s.v2)
      t += " (HasAns EM " + fixed(s.has_exact, 2) + "%, NoAns EM " + fixed(s.no_exact, 2) + "%)";
    return t;
  }
  if (r.dev_scores.empty()) return "";
  const ClassifyScore& s = r.dev_scores.back();
  std::string t = "accuracy " + fixed(s.accuracy, 4) + ", MCC " + fixed(s.mcc, 4);
  if (s.f1) t += ", F1 " + fixed(*s.f1, 4);
  return t;
}

std::string headline_metric(const std::string& task, int num_labels) {
  const std::string m = data::glue_metric(task);
  return m == "f1" && num_labels != 2 ? "accuracy" : m;
}

bool regression_metric(const std::string& name) {
  return name == "pearson" || name == "spearman";
}

}  // namespace packbert::train
