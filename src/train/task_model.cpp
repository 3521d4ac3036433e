#include "train/task_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "error.h"
#include "io/atomic_file.h"
#include "io/input_file.h"
#include "pack/assign.h"
#include "pack/plan.h"

namespace packbert::train {

std::vector<std::vector<int64_t>> make_rows(const std::vector<int>& lengths, int max_len,
                                            bool packed, uint64_t seed) {
  std::vector<std::vector<int64_t>> rows;
  if (!packed) {
    for (size_t i = 0; i < lengths.size(); ++i) rows.push_back({static_cast<int64_t>(i)});
    return rows;
  }
  pack::PackOptions po;
  po.max_len = max_len;
  pack::PackPlan plan =
      pack::run_packer(pack::Algo::lpfhp, pack::histogram_of(lengths, max_len), po);
  pack::PackAssignment a = pack::assign_sequences(plan, lengths, seed);
  for (int64_t p = 0; p < a.packs(); ++p)
    rows.emplace_back(a.ids.begin() + a.offsets[p], a.ids.begin() + a.offsets[p + 1]);
  return rows;
}

std::vector<int32_t> predict(model::BertModel& m, const std::vector<data::ClassifyExample>& ex,
                             const std::vector<std::vector<int64_t>>& rows, int rows_per_batch,
                             int S, model::Precision precision,
                             std::vector<std::vector<float>>* logits_out) {
  std::vector<int32_t> pred(ex.size(), -1);
  const int NL = m.config().num_labels;
  if (logits_out) logits_out->assign(ex.size(), {});
  for_each_batch(
      m, ex, rows, rows_per_batch, S, precision,
      [&](const model::Outputs& out, const std::vector<std::vector<int64_t>>& batch_rows) {
        const float* logits = m.class_logits();  // [sequences in row order, NL]
        int64_t k = 0, labelled = 0, correct = 0;
        for (const auto& row : batch_rows)
          for (const int64_t id : row) {
            const float* l = logits + k++ * NL;
            const auto p = static_cast<int32_t>(std::max_element(l, l + NL) - l);
            pred[static_cast<size_t>(id)] = p;
            if (logits_out) (*logits_out)[static_cast<size_t>(id)].assign(l, l + NL);
            const int32_t label = ex[static_cast<size_t>(id)].label;
            labelled += label >= 0;
            correct += p == label;
          }
        // (the head's own count, by the same argmax: the rows are read in order)
        if (labelled != out.cls_count || correct != out.cls_correct)
          throw std::logic_error("classifier predictions out of order with the batch");
      });
  return pred;
}

std::vector<double> predict_values(model::BertModel& m,
                                   const std::vector<data::ClassifyExample>& ex,
                                   const std::vector<std::vector<int64_t>>& rows,
                                   int rows_per_batch, int S, model::Precision precision) {
  std::vector<double> pred(ex.size(), std::nan(""));
  for_each_batch(m, ex, rows, rows_per_batch, S, precision,
                 [&](const model::Outputs&, const std::vector<std::vector<int64_t>>& batch_rows) {
                   const float* values = m.class_logits();  // [sequences in row order, 1]
                   int64_t k = 0;
                   for (const auto& row : batch_rows)
                     for (const int64_t id : row) pred[static_cast<size_t>(id)] = values[k++];
                 });
  return pred;
}

std::vector<double> targets_of(const std::vector<data::ClassifyExample>& ex) {
  std::vector<double> out;
  for (const auto& e : ex) out.push_back(e.target.value());
  return out;
}

ClassifyScore score_classifier(model::BertModel& m, const std::vector<data::ClassifyExample>& ex,
                               const std::vector<std::vector<int64_t>>& rows, int rows_per_batch,
                               int S, model::Precision precision) {
  std::vector<int32_t> truth;
  for (const auto& e : ex) truth.push_back(e.label);
  return classify_score(truth, predict(m, ex, rows, rows_per_batch, S, precision),
                        m.config().num_labels);
}

std::vector<std::string> squad_answers(model::BertModel& m,
                                       const std::vector<data::SquadExample>& examples,
                                       const std::vector<data::SquadFeature>& features,
                                       const std::vector<std::vector<int64_t>>& rows,
                                       int rows_per_batch, int S, model::Precision precision,
                                       const data::Tokenizer& tok, const data::SquadOptions& so,
                                       std::vector<double>* null_odds) {
  std::vector<std::vector<float>> logits(features.size());
  for_each_batch(m, features, rows, rows_per_batch, S, precision,
                 [&](const model::Outputs&, const std::vector<std::vector<int64_t>>& batch_rows) {
                   const float* lg = m.span_logits();
                   const std::vector<int32_t>& cu = m.tokens().cu_seqlens;
                   size_t s = 0;
                   for (const auto& row : batch_rows)
                     for (int64_t f : row) {
                       logits[f].assign(lg + 2 * cu[s], lg + 2 * cu[s + 1]);
                       ++s;
                     }
                 });
  return data::squad_predictions(examples, features, logits, tok, so, null_odds);
}

void write_predictions(const std::string& path, const std::vector<data::SquadExample>& examples,
                       const std::vector<std::string>& predictions) {
  nlohmann::json pj = nlohmann::json::object();
  for (size_t i = 0; i < examples.size(); ++i) pj[examples[i].id] = predictions[i];
  io::write_file_atomic(path, pj.dump(1) + "\n");
}

void say(const Say& to, const std::string& line) {
  if (!dist::Comm::world().root()) return;
  if (to)
    to(line);
  else
    std::cerr << line << '\n';
}

void say_casing(const data::Casing& c, const char* command, const Say& to) {
  if (!c.note.empty()) say(to, std::string(command) + ": tokenising " + c.note);
  if (!c.warning.empty()) say(to, std::string(command) + ": warning: " + c.warning);
}

void warn_non_finite(const model::BertModel& m, const std::string& path, const Say& to) {
  if (const std::string bad = non_finite_weights(m); !bad.empty())
    say(to, "eval: warning: " + path + ": " + bad + "; its metrics will be NaN");
}

void check_model(const model::BertModel& m, const data::Vocab& vocab, const std::string& model_path,
                 const std::string& vocab_path, int max_seq_len) {
  // (a tokenizer.json may hold up to 127 ids fewer than the model's rows: models pad their
  // vocabulary to a multiple of 64 or 128, and the tokenizer never makes the ids past its own;
  // any other difference is another tokenizer's)
  const int32_t V = m.config().vocab_size;
  if (vocab.json() ? vocab.size() > V || V - vocab.size() >= 128 : vocab.size() != V)
    throw InputError(model_path + ": vocab_size " + std::to_string(V) + " differs from the " +
                     std::to_string(vocab.size()) + " ids of " + vocab_path);
  if (m.config().max_position_embeddings < max_seq_len)
    throw InputError("`max_seq_len` " + std::to_string(max_seq_len) +
                     " exceeds the model's max_position_embeddings");
}

std::unique_ptr<model::BertModel> TaskModelReader::load(model::Heads heads, size_t labels,
                                                        const std::string& labels_path) const {
  heads.pretraining = false;
  auto m = load_model(model, heads);
  if (!labels_path.empty() && m->config().num_labels != static_cast<int>(labels))
    throw InputError(labels_path + ": " + std::to_string(labels) +
                     " labels, the model's classifier has " +
                     std::to_string(m->config().num_labels));
  m->set_backend(backend);
  warn_non_finite(*m, model, say);
  check_model(*m, vocab, model, vocab_path, max_seq_len);
  say_casing(casing, command, say);
  return m;
}

data::SquadOptions squad_options(data::SquadOptions so, int max_seq_len) {
  so.max_seq_len = max_seq_len;
  if (so.doc_stride < 1 || so.max_query_length < 1 || so.max_answer_length < 1)
    throw InputError("`doc_stride`, `max_query_length` and `max_answer_length` must be positive");
  return so;
}

ClassLabels class_labels(const ModelLabels& model, const std::map<std::string, int32_t>& seen,
                         bool new_head, const std::string& data) {
  ClassLabels out;
  auto listed = [](const std::map<std::string, int32_t>& ids) {
    std::vector<std::string> names(ids.size());
    for (const auto& [name, id] : ids) names[static_cast<size_t>(id)] = name;
    std::string s;
    for (size_t i = 0; i < names.size(); ++i)
      s += (i ? ", " : "") + std::to_string(i) + " " + names[i];
    return s;
  };
  if (model.heads.classifier && !new_head && !model.names.empty() && !model.generic()) {
    for (size_t i = 0; i < model.names.size(); ++i)
      out.ids.emplace(model.names[i], static_cast<int32_t>(i));
    for (const auto& [name, id] : seen)
      if (!out.ids.count(name))
        throw InputError(data + ": label '" + name + "' is not one of the model's labels (" +
                         listed(out.ids) + ", from " + model.source +
                         "); relabel the data, or give `new_head` to train a new classifier");
    out.new_head = false;
    out.note =
        "labels as the model's classifier has them (" + model.source + "): " + listed(out.ids);
    return out;
  }
  out.ids = data::sorted_label_ids(seen);
  if (model.heads.classifier &&
      !new_head) {  // a classifier whose outputs have no names: kept, in sorted order
    if (!model.names.empty() && model.names.size() != out.ids.size())
      throw InputError(data + ": " + std::to_string(out.ids.size()) + " labels, but the model's " +
                       "classifier has " + std::to_string(model.names.size()) +
                       " unnamed outputs (" + model.source +
                       "); give `new_head` to train a new "
                       "classifier");
    out.new_head = false;
    out.note = "the model's classifier names no labels; the data's, sorted, are its outputs: " +
               listed(out.ids);
    return out;
  }
  out.note = "a new classifier; the data's labels, sorted: " + listed(out.ids);
  return out;
}

bool regression_task(const FinetuneOptions& o, const ModelLabels& model,
                     const std::map<std::string, int32_t>& seen, const std::string& task) {
  if (o.regression) {
    if (!o.columns.task_name.empty() && *o.regression != (task == "stsb"))
      throw OptionError(
          "task_name",
          task + (task == "stsb" ? " is a regression task; `classification` contradicts it"
                                 : " is a classification task; `regression` contradicts it"));
    return *o.regression;
  }
  if (!o.columns.task_name.empty()) return task == "stsb";
  if (model.heads.classifier && !o.new_head) return model.regression();
  return data::decimal_labels(seen);
}

std::map<std::string, int32_t> labels_of_model(const std::string& model, const ModelLabels& named,
                                               std::string& path) {
  std::map<std::string, int32_t> labels;
  path = named.source;
  for (size_t i = 0; i < named.names.size(); ++i)
    labels.emplace(named.names[i], static_cast<int32_t>(i));
  if (labels.size() != named.names.size())
    throw InputError(named.source + ": id2label names a label twice");
  if (!labels.empty()) return labels;
  path =
      (std::filesystem::is_directory(model) ? model
                                            : std::filesystem::path(model).parent_path().string()) +
      "/labels.json";
  if (!std::filesystem::exists(path))
    throw InputError(model +
                     ": its config has no id2label (and there is no labels.json): "
                     "which output is which label is unknown");
  io::require_text_input(path);
  std::ifstream lf(path);
  if (!lf) throw InputError(path + ": cannot open (needed to map label names to ids)");
  nlohmann::json lj = nlohmann::json::parse(lf, nullptr, false);
  if (!lj.is_object() || lj.empty())
    throw InputError(path + ": expected a JSON object {label: id}");
  for (auto& [name, id] : lj.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= std::ssize(lj))
      throw InputError(path + ": label '" + name + "' has no valid id");
    labels[name] = id.get<int32_t>();
  }
  return labels;
}

}  // namespace packbert::train
