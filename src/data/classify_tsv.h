// Classification examples from TSV, CSV or JSONL: a label and one or two text columns, tokenised
// and truncated like Google BERT's classifier data.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace packbert::data {

// Which columns hold the text (one, or two for a pair) and the label. Empty: recognised from the
// header, the GLUE tasks' own layouts included (classify_tsv.cpp).
struct TsvColumns {
  std::vector<std::string> text;
  std::string label;
  // run_glue's --task_name (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli): the GLUE task
  // whose metric leads the scores (glue_task). Empty: what the header shows.
  std::string task_name;
  // false (predict): the label column is not read, and a file need not have one; every example's
  // label is -1 (no target).
  bool read_labels = true;
};

struct ClassifyExample {
  std::vector<int32_t> tokens;  // [CLS] a [SEP] (b [SEP])
  int32_t b_start = 0;          // first token of segment 1 (= size when there is no b)
  int32_t label = 0;
  std::optional<float> target;  // a regression task's value (set_targets), in place of label
};

// Reads a TSV (or, by extension, a CSV or JSONL file) whose header names the columns: the text
// (one, or a pair) and the label, recognised by name (the GLUE layouts) or named by `columns`;
// any other column must be one known to be ignorable. Labels are strings mapped
// to ids by `labels`; with grow_labels a label it lacks is added with the next id (the order of
// first appearance: sorted_label_ids and relabel then give the ids a classifier is trained
// with). Texts are truncated to max_seq_len like Google BERT (longer segment first). Throws
// InputError with file:line for a missing column, a short row or an unknown label.
std::vector<ClassifyExample> read_classification_tsv(const std::string& path, const Tokenizer& tok,
                                                     int max_seq_len,
                                                     std::map<std::string, int32_t>& labels,
                                                     bool grow_labels,
                                                     const TsvColumns& columns = {});

// The GLUE task of a classification file: columns.task_name when given (InputError for a name
// run_glue does not know), else the task its header shows unambiguously: "mrpc" (Quality,
// #1 String), "qqp" (is_duplicate), "stsb" (score), "mnli" (gold_label), "qnli" (question,
// sentence); "" for a layout tasks share (SST-2's and CoLA's sentence + label, RTE's and WNLI's
// pair) or none of GLUE's.
std::string glue_task(const std::string& path, const TsvColumns& columns);
// The metric GLUE scores a task by: "mcc" (cola), "f1" (mrpc, qqp), "pearson" (stsb), else
// (other tasks, or "") "accuracy".
std::string glue_metric(const std::string& task);

// The ids of the labels in `seen` when no model says them: the labels sorted, numerically when
// every one is a number ("2" before "10"), as Hugging Face's run_glue sorts them. The order the
// data names them in never matters.
std::map<std::string, int32_t> sorted_label_ids(const std::map<std::string, int32_t>& seen);

// Whether the labels are a regression target, as Hugging Face's datasets infer a float column
// (run_glue's is_regression): every label a finite number and at least one written with a
// decimal point or an exponent ("3.800", "1e-2"); integers ("0", "1") are classes.
bool decimal_labels(const std::map<std::string, int32_t>& seen);
// Gives each example the number its label names (`seen` gave it its id) as its regression
// target. Throws InputError naming `source` and a label that is not a finite number.
void set_targets(std::vector<ClassifyExample>& examples, const std::map<std::string, int32_t>& seen,
                 const std::string& source);

// Gives each example the id `to` has for the label that `from` gave it its id by. Throws
// InputError naming `source` and the label when `to` lacks one.
void relabel(std::vector<ClassifyExample>& examples, const std::map<std::string, int32_t>& from,
             const std::map<std::string, int32_t>& to, const std::string& source);

}  // namespace packbert::data
