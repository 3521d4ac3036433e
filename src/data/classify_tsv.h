// Classification examples from TSV: `label` and one or two text columns, tokenised and
// truncated like Google BERT's classifier data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace packbert::data {

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
std::vector<ClassifyExample> read_classification_tsv(const std::string& path, const Tokenizer& tok,
                                                     int max_seq_len,
                                                     std::map<std::string, int32_t>& labels,
                                                     bool grow_labels);

}  // namespace packbert::data
