#include "train/predict.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "data/casing.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/paths.h"
#include "text.h"
#include "train/model_files.h"
#include "train/task_model.h"

namespace packbert::train {

namespace {

// A label name as a TSV column header and cell: tabs and line breaks would break the row.
std::string tsv_safe(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return s;
}

// Each example's label (run_glue's predict_results: index and the label's name) followed by
// every label's probability (the softmax of its logits, in id order), written atomically.
void write_class_predictions(const std::string& path, const std::vector<std::string>& names,
                             const std::vector<int32_t>& pred,
                             const std::vector<std::vector<float>>& logits) {
  std::string out = "index\tprediction";
  auto cell = [&](const std::string& s) {
    out.push_back('\t');
    out.append(s);
  };
  for (const std::string& n : names) cell(tsv_safe(n));
  out.push_back('\n');
  for (size_t i = 0; i < pred.size(); ++i) {
    out.append(std::to_string(i));
    cell(tsv_safe(names[static_cast<size_t>(pred[i])]));
    const std::vector<float>& l = logits[i];
    const double top = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (const float x : l) sum += std::exp(static_cast<double>(x) - top);
    for (const float x : l) cell(fixed(std::exp(static_cast<double>(x) - top) / sum, 6));
    out.push_back('\n');
  }
  io::write_file_atomic(path, out);
}

}  // namespace

std::string null_odds_path(const std::string& out) {
  const std::string tail = "predictions.json";
  if (out.size() >= tail.size() && out.ends_with(tail))
    return out.substr(0, out.size() - tail.size()) + "null_odds.json";
  return out + ".null_odds.json";
}

PredictResult predict_file(const PredictOptions& o) {
  if (o.max_seq_len < 8) throw OptionError("max_seq_len", "must be at least 8");
  if (o.rows_per_batch < 1) throw OptionError("rows_per_batch", "must be at least 1");
  if (o.out.empty()) throw OptionError("out", "is needed: where the predictions go");
  const bool squad = o.task == FinetuneTask::squad;
  const std::string odds = squad ? null_odds_path(o.out) : std::string();
  io::refuse_outputs_over_inputs({{o.out, "`out`"}, {odds, "`out` (its null odds)"}},
                                 {{o.model, "`model`"}, {o.data, "`data`"}, {o.vocab, "`vocab`"}});
  data::Vocab vocab = data::Vocab::load(o.vocab);
  const data::Casing casing = data::decide_casing(o.lower_case, o.model, vocab, o.vocab);
  data::Tokenizer tok(vocab, casing.lower_case);
  PredictResult r;
  const TaskModelReader reader{o.model,   vocab,  o.vocab,   o.max_seq_len,
                               o.backend, casing, "predict", o.say};
  if (squad) {
    data::SquadOptions so = squad_options(o.squad, o.max_seq_len);
    std::vector<data::SquadExample> ex = data::read_squad(o.data, false);
    so.v2 = o.v2.value_or(data::squad_has_unanswerable(ex));
    data::SquadFeatures f = data::squad_features(ex, tok, so, false);
    auto m = reader.load({.pretraining = false, .span = true});
    const auto rows = make_rows(lengths_of(f.features), o.max_seq_len, true, 1);
    std::vector<double> null_odds;
    const std::vector<std::string> pred =
        squad_answers(*m, ex, f.features, rows, o.rows_per_batch, o.max_seq_len, o.precision, tok,
                      so, so.v2 ? &null_odds : nullptr);
    write_predictions(o.out, ex, pred);
    r.written.push_back(o.out);
    if (so.v2) {
      nlohmann::json j = nlohmann::json::object();
      for (size_t i = 0; i < ex.size(); ++i) j[ex[i].id] = null_odds[i];
      io::write_file_atomic(odds, j.dump(1) + "\n");
      r.written.push_back(odds);
    }
    r.v2 = so.v2;
    r.examples = static_cast<int64_t>(ex.size());
    r.sequences = static_cast<int64_t>(f.features.size());
    return r;
  }
  data::TsvColumns columns = o.columns;
  columns.read_labels = false;
  std::map<std::string, int32_t> none;
  std::vector<data::ClassifyExample> ex =
      data::read_classification_tsv(o.data, tok, o.max_seq_len, none, false, columns);
  const ModelLabels named = model_labels(o.model);
  r.examples = r.sequences = static_cast<int64_t>(ex.size());
  const auto rows = make_rows(lengths_of(ex), o.max_seq_len, true, 1);
  if (named.regression()) {  // one output: each example's value (no targets: 0, unused)
    r.regression = true;
    for (data::ClassifyExample& e : ex) e.target = 0.0f;
    auto m = reader.load({.pretraining = false, .classifier = true});
    const std::vector<double> pred =
        predict_values(*m, ex, rows, o.rows_per_batch, o.max_seq_len, o.precision);
    std::string out = "index\tprediction\n";  // (3 decimals, as run_glue writes them)
    for (size_t i = 0; i < pred.size(); ++i)
      out.append(std::to_string(i)).append("\t").append(fixed(pred[i], 3)).append("\n");
    io::write_file_atomic(o.out, out);
    r.written.push_back(o.out);
    return r;
  }
  std::string labels_path;
  const std::map<std::string, int32_t> labels = labels_of_model(o.model, named, labels_path);
  auto m = reader.load({.pretraining = false, .classifier = true}, labels.size(), labels_path);
  std::vector<std::string> names(labels.size());
  for (const auto& [name, id] : labels) names[static_cast<size_t>(id)] = name;
  std::vector<std::vector<float>> logits;
  const std::vector<int32_t> pred =
      predict(*m, ex, rows, o.rows_per_batch, o.max_seq_len, o.precision, &logits);
  write_class_predictions(o.out, names, pred, logits);
  r.written.push_back(o.out);
  return r;
}

}  // namespace packbert::train
