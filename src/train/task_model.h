// What fine-tuning and task evaluation share: examples batched into rows (packed or one per row),
// the model run over them without dropout (predictions, regression values, SQuAD answers), the
// labels a classifier is trained or read with, the checks of a model against the vocabulary, and
// the lines they say on rank 0.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/casing.h"
#include "dist/comm.h"
#include "kernels/ops.h"
#include "model/bert.h"
#include "stopwatch.h"
#include "train/finetune.h"
#include "train/model_files.h"
#include "train/progress.h"

namespace packbert::train {

// Packs (or, unpacked, one per row) of sequence indices.
std::vector<std::vector<int64_t>> make_rows(const std::vector<int>& lengths, int max_len,
                                            bool packed, uint64_t seed);

template <typename Seq>
std::vector<int> lengths_of(const std::vector<Seq>& seqs) {
  std::vector<int> out;
  for (const Seq& e : seqs) out.push_back(static_cast<int>(e.tokens.size()));
  return out;
}

// Where segment B (token type 1) starts, and the labels each kind of sequence carries.
inline int32_t segment_b(const data::ClassifyExample& e) {
  return e.b_start;
}
inline int32_t segment_b(const data::SquadFeature& f) {
  return f.doc_offset;
}
inline void add_labels(model::PackedBatch& b, const data::ClassifyExample& e) {
  if (e.target)
    b.class_targets.push_back(*e.target);
  else
    b.class_labels.push_back(e.label);
}
inline void add_labels(model::PackedBatch& b, const data::SquadFeature& f) {
  b.span_starts.push_back(f.start);
  b.span_ends.push_back(f.end);
}

template <typename Seq>
model::PackedBatch make_batch(const std::vector<Seq>& seqs,
                              const std::vector<std::vector<int64_t>>& rows, int S) {
  int K = 1;
  for (const auto& r : rows) K = std::max(K, static_cast<int>(r.size()));
  model::BatchBuilder b(static_cast<int>(rows.size()), S, K);
  for (int p = 0; p < b.batch().B; ++p)
    for (const int64_t s : rows[p]) {
      const Seq& e = seqs[static_cast<size_t>(s)];
      b.add(p, e.tokens, segment_b(e));
      add_labels(b.batch(), e);
    }
  return b.take();
}

// Runs the model over rows of sequences without dropout, `rows_per_batch` rows at a time, and
// hands each forward's outputs with its rows to `visit`.
template <typename Seq, typename Visit>
void for_each_batch(model::BertModel& m, const std::vector<Seq>& seqs,
                    const std::vector<std::vector<int64_t>>& rows, int rows_per_batch, int S,
                    model::Precision precision, Visit visit) {
  // A progress line (rank 0, on stderr) over evaluations of more than a few batches: about 20
  // lines without a terminal, however large the set.
  const int64_t batches =
      static_cast<int64_t>((rows.size() + static_cast<size_t>(rows_per_batch) - 1) /
                           static_cast<size_t>(rows_per_batch));
  const bool show = batches > 4 && dist::Comm::world().root();
  ProgressLine progress("evaluate", "batch", 0, batches, "seq", std::max<int64_t>(1, batches / 20));
  int64_t done = 0;
  for (size_t b = 0; b < rows.size(); b += static_cast<size_t>(rows_per_batch)) {
    std::vector<std::vector<int64_t>> batch_rows(
        rows.begin() + static_cast<long>(b),
        rows.begin() + static_cast<long>(std::min(rows.size(), b + rows_per_batch)));
    model::StepOptions so;
    so.precision = precision;
    const double t0 = now_seconds();
    model::Outputs out = m.forward(make_batch(seqs, batch_rows, S), so);
    visit(out, batch_rows);
    if (show) {
      double sequences = 0;
      for (const auto& r : batch_rows) sequences += static_cast<double>(r.size());
      progress.update(++done, sequences, now_seconds() - t0, "");
    }
  }
  if (show) progress.finish();
}

// The classifier's prediction (argmax of its logits) for every example, by index; with
// `logits`, each example's logits too. An example's label -1 (unlabelled) is no target.
std::vector<int32_t> predict(model::BertModel& m, const std::vector<data::ClassifyExample>& ex,
                             const std::vector<std::vector<int64_t>>& rows, int rows_per_batch,
                             int S, model::Precision precision,
                             std::vector<std::vector<float>>* logits = nullptr);
// A regression head's prediction (its one output) for every example, by index.
std::vector<double> predict_values(model::BertModel& m,
                                   const std::vector<data::ClassifyExample>& ex,
                                   const std::vector<std::vector<int64_t>>& rows,
                                   int rows_per_batch, int S, model::Precision precision);
// The examples' regression targets.
std::vector<double> targets_of(const std::vector<data::ClassifyExample>& ex);
// Classification scores of the model's predictions against the examples' labels.
ClassifyScore score_classifier(model::BertModel& m, const std::vector<data::ClassifyExample>& ex,
                               const std::vector<std::vector<int64_t>>& rows, int rows_per_batch,
                               int S, model::Precision precision);
// Each SQuAD example's predicted answer: span logits of every window, then n-best decoding
// (with `null_odds`, data::squad_predictions' null odds too).
std::vector<std::string> squad_answers(model::BertModel& m,
                                       const std::vector<data::SquadExample>& examples,
                                       const std::vector<data::SquadFeature>& features,
                                       const std::vector<std::vector<int64_t>>& rows,
                                       int rows_per_batch, int S, model::Precision precision,
                                       const data::Tokenizer& tok, const data::SquadOptions& so,
                                       std::vector<double>* null_odds = nullptr);
// {question id: answer} as the official evaluation script reads it, written atomically.
void write_predictions(const std::string& path, const std::vector<data::SquadExample>& examples,
                       const std::vector<std::string>& predictions);

// `line` to `to` (stderr when unset), on rank 0 only.
void say(const Say& to, const std::string& line);
// Says how the text was tokenised (data::decide_casing's note) and any contradiction, on rank 0,
// once the inputs are known good (a bad input's error stays the only line).
void say_casing(const data::Casing& c, const char* command, const Say& to);
// Warns (eval) that a model with non-finite weights will score NaN.
void warn_non_finite(const model::BertModel& m, const std::string& path, const Say& to);
// InputError when the model's vocab_size is not the vocabulary's, or max_seq_len exceeds its
// max_position_embeddings.
void check_model(const model::BertModel& m, const data::Vocab& vocab, const std::string& model_path,
                 const std::string& vocab_path, int max_seq_len);
// How `eval --task` and `predict` load a fine-tuned model: with `heads` (never the pre-training
// head) on `backend`; with `labels_path`, its classifier must have `labels` outputs (InputError
// naming the file otherwise); then warned about non-finite weights, checked against the
// vocabulary and max_seq_len, and the casing said once the inputs are known good.
struct TaskModelReader {
  const std::string& model;
  const data::Vocab& vocab;
  const std::string& vocab_path;
  int max_seq_len;
  kernels::BackendKind backend;
  const data::Casing& casing;
  const char* command;  // who says the casing: "eval", "predict"
  const Say& say;
  std::unique_ptr<model::BertModel> load(model::Heads heads, size_t labels = 0,
                                         const std::string& labels_path = "") const;
};

// The SQuAD options with max_seq_len set; InputError when a limit is not positive.
data::SquadOptions squad_options(data::SquadOptions so, int max_seq_len);

// The ids the classifier is trained with (docs/FINETUNE.md): a starting model with a classifier
// and named labels (config.json id2label) keeps its mapping, the data's labels matched by name;
// otherwise (no head, transformers' LABEL_i names, or new_head) the data's labels sorted.
struct ClassLabels {
  std::map<std::string, int32_t> ids;
  bool new_head = true;
  std::string note;  // the choice, in a line for the user
};

ClassLabels class_labels(const ModelLabels& model, const std::map<std::string, int32_t>& seen,
                         bool new_head, const std::string& data);
// Whether a classify task trains a regression head (FinetuneOptions::regression): as asked, else
// as a named GLUE task is (stsb), else as the model's head is, else as the labels read.
bool regression_task(const FinetuneOptions& o, const ModelLabels& model,
                     const std::map<std::string, int32_t>& seen, const std::string& task);
// A classifier's label names by id: its config.json id2label (any Hugging Face classifier, and
// packbert's fine-tuned models), or labels.json beside it (older packbert); `path` says which.
std::map<std::string, int32_t> labels_of_model(const std::string& model, const ModelLabels& named,
                                               std::string& path);

}  // namespace packbert::train
