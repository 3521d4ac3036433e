// Task evaluation (`packbert eval --task classify|squad`): a fine-tuned model scored on a labelled
// file, its predictions written in run_glue's and the SQuAD script's formats.
#include <map>
#include <string>
#include <vector>

#include "data/casing.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/paths.h"
#include "text.h"
#include "train/finetune.h"
#include "train/model_files.h"
#include "train/task_model.h"

namespace packbert::train {

namespace {

// run_glue's predict_results for a regression task: index and the predicted value (3 decimals,
// as run_glue writes them), written atomically.
void write_value_predictions(const std::string& path, const std::vector<double>& pred) {
  std::string out = "index\tprediction\n";
  for (size_t i = 0; i < pred.size(); ++i)
    out += std::to_string(i) + "\t" + fixed(pred[i], 3) + "\n";
  io::write_file_atomic(path, out);
}

// run_glue's predict_results: index and the predicted label's name, written atomically.
void write_label_predictions(const std::string& path, const std::map<std::string, int32_t>& labels,
                             const std::vector<int32_t>& pred, int num_labels) {
  std::vector<std::string> name(static_cast<size_t>(num_labels));
  for (const auto& [label, id] : labels)
    if (id >= 0 && static_cast<size_t>(id) < name.size()) name[static_cast<size_t>(id)] = label;
  std::string out = "index\tprediction\n";
  for (size_t i = 0; i < pred.size(); ++i)
    out += std::to_string(i) + "\t" + name[static_cast<size_t>(pred[i])] + "\n";
  io::write_file_atomic(path, out);
}

}  // namespace

TaskEvalResult evaluate_task(const TaskEvalOptions& o) {
  if (o.max_seq_len < 8) throw OptionError("max_seq_len", "must be at least 8");
  if (o.rows_per_batch < 1) throw OptionError("rows_per_batch", "must be at least 1");
  io::refuse_outputs_over_inputs(
      {{o.predictions, "`predictions`"}},
      {{o.model, "`model`"}, {o.data, "`sequences`"}, {o.vocab, "`vocab`"}});
  data::Vocab vocab = data::Vocab::load(o.vocab);
  const data::Casing casing = data::decide_casing(o.lower_case, o.model, vocab, o.vocab);
  data::Tokenizer tok(vocab, casing.lower_case);
  TaskEvalResult r;
  const TaskModelReader reader{o.model,   vocab,  o.vocab, o.max_seq_len,
                               o.backend, casing, "eval",  o.say};
  if (o.task == FinetuneTask::squad) {
    data::SquadOptions so = squad_options(o.squad, o.max_seq_len);
    std::vector<data::SquadExample> ex = data::read_squad(o.data);
    so.v2 = data::squad_has_unanswerable(ex);
    data::SquadFeatures f = data::squad_features(ex, tok, so, false);
    auto m = reader.load({.pretraining = false, .span = true});
    const auto rows = make_rows(lengths_of(f.features), o.max_seq_len, true, 1);
    std::vector<std::string> pred = squad_answers(*m, ex, f.features, rows, o.rows_per_batch,
                                                  o.max_seq_len, o.precision, tok, so);
    r.squad = data::squad_score(ex, pred);
    r.examples = static_cast<int64_t>(ex.size());
    r.sequences = static_cast<int64_t>(f.features.size());
    if (!o.predictions.empty()) write_predictions(o.predictions, ex, pred);
    return r;
  }
  r.glue_task = data::glue_task(o.data, o.columns);
  const ModelLabels named = model_labels(o.model);
  if (named.regression()) {  // a regression head: the labels are its targets
    r.metric = "pearson";
    std::map<std::string, int32_t> seen;
    std::vector<data::ClassifyExample> ex =
        data::read_classification_tsv(o.data, tok, o.max_seq_len, seen, true, o.columns);
    data::set_targets(ex, seen, o.data);
    auto m = reader.load({.pretraining = false, .classifier = true});
    const auto rows = make_rows(lengths_of(ex), o.max_seq_len, true, 1);
    const std::vector<double> pred =
        predict_values(*m, ex, rows, o.rows_per_batch, o.max_seq_len, o.precision);
    r.regression = regression_score(targets_of(ex), pred);
    r.examples = r.sequences = static_cast<int64_t>(ex.size());
    if (!o.predictions.empty()) write_value_predictions(o.predictions, pred);
    return r;
  }
  // Classification: the label names are the model's (config.json id2label, or labels.json).
  std::string labels_path;
  std::map<std::string, int32_t> labels = labels_of_model(o.model, named, labels_path);
  std::vector<data::ClassifyExample> ex =
      data::read_classification_tsv(o.data, tok, o.max_seq_len, labels, false, o.columns);
  auto m = reader.load({.pretraining = false, .classifier = true}, labels.size(), labels_path);
  const auto rows = make_rows(lengths_of(ex), o.max_seq_len, true, 1);
  const std::vector<int32_t> pred =
      predict(*m, ex, rows, o.rows_per_batch, o.max_seq_len, o.precision);
  std::vector<int32_t> truth;
  for (const auto& e : ex) truth.push_back(e.label);
  r.scores = classify_score(truth, pred, m->config().num_labels);
  r.metric = headline_metric(r.glue_task, m->config().num_labels);
  r.accuracy = r.scores.accuracy;
  r.examples = r.sequences = static_cast<int64_t>(ex.size());
  if (!o.predictions.empty())
    write_label_predictions(o.predictions, labels, pred, m->config().num_labels);
  return r;
}

}  // namespace packbert::train
