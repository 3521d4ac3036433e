// Fine-tuning for sequence (or sentence-pair) classification from TSV, with packing: examples
// are packed into rows like pre-training sequences, and the classifier reads each sequence's
// pooled [CLS], so packing changes nothing but the cost.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/bert.h"

namespace packbert::train {

struct ClassifyExample {
  std::vector<int32_t> tokens;  // [CLS] a [SEP] (b [SEP])
  int32_t b_start = 0;          // first token of segment 1 (= size when there is no b)
  int32_t label = 0;
};

// Reads a TSV whose first line is a header naming the columns: `label`, and `sentence` (or
// `sentence1`/`text`/`text_a`), optionally `sentence2` (or `text_b`). Labels are strings mapped
// to ids in order of first appearance unless `labels` already holds them (dev/test sets reuse
// the training set's map). Texts are truncated to max_seq_len like Google BERT (longer segment
// first). Throws InputError with file:line for a missing column, a short row or an unknown label.
std::vector<ClassifyExample> read_classification_tsv(const std::string& path,
                                                     const data::Tokenizer& tok, int max_seq_len,
                                                     std::map<std::string, int32_t>& labels,
                                                     bool grow_labels);

struct FinetuneOptions {
  std::string train, dev, init, out_dir, vocab;
  int max_seq_len = 128;
  int rows_per_batch = 8;  // packs per step
  int epochs = 3;
  double lr = 5e-5;
  int64_t warmup_steps = 10;
  uint64_t seed = 1;
  bool packed = true;
};

struct FinetuneResult {
  std::vector<double> dev_accuracy;  // after each epoch
  double majority_baseline = 0;      // accuracy of always predicting the most frequent train label
  int64_t steps = 0;
  int num_labels = 0;
};

// Fine-tunes the model at `init` (HF directory or checkpoint; a missing classifier head is
// initialised fresh), evaluating dev accuracy after every epoch, and exports the result to
// out_dir (HF layout, with the classifier). Appends JSONL metrics to out_dir/metrics.jsonl.
FinetuneResult finetune_classifier(const FinetuneOptions& options);

}  // namespace packbert::train
