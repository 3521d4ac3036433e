// Pre-training examples with Google BERT's create_pretraining_data semantics: sentence pairs
// (A, B) up to max_seq_len, B the true continuation or (50%) a random span of another document,
// short_seq_prob for shorter targets, masking of 15% with 80/10/10 (optionally whole words),
// max_predictions_per_seq, dupe_factor. As Google, a chunk of a single sentence always gets a
// random B; `split_single_sentence` instead splits such a sentence when its coin says "real
// next", which keeps NSP labels 50/50 on corpora of short documents (Google's rule gives about
// two random B in three on GCIDE) at the price of B halves that start mid-sentence.
// A held-out split is by document, before duplication: held-out documents give one round of
// examples, placed at the end of the file, and random B sentences never cross the split.
// Deterministic for a seed whatever the thread count: every (dupe, document) pair draws from
// its own counter-seeded generator.
#pragma once

#include <cstdint>
#include <vector>

#include "data/sequences.h"
#include "data/vocab.h"
#include "rng.h"

namespace packbert::data {

struct PretrainingOptions {
  int max_seq_len = 128;
  double short_seq_prob = 0.1;
  double masked_lm_prob = 0.15;
  int max_predictions_per_seq = 20;
  int dupe_factor = 1;
  bool whole_word_mask = false;
  bool split_single_sentence = false;
  double heldout_fraction = 0;  // share of documents held out for evaluation
  uint64_t seed = 12345;
};

using Sentence = std::vector<int32_t>;
using Document = std::vector<Sentence>;

// Deterministic uniform draws for example creation.
struct Rng {
  SplitMix64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  double uniform() { return static_cast<double>(g.next() >> 11) * 0x1.0p-53; }
  int64_t randint(int64_t lo, int64_t hi) {  // inclusive, as Python's random.randint
    return lo + static_cast<int64_t>(g.below(static_cast<uint64_t>(hi - lo + 1)));
  }
};

// Masks e in place (replaces any previous masking). The number of predictions is
// masked_lm_prob × (tokens other than [CLS]/[SEP]), rounded at random so its expectation is
// exact (Google rounds masked_lm_prob × all tokens), capped at max_predictions_per_seq.
// Google's truncate_seq_pair: while a and b hold more than max_tokens, drops the first or last
// token (a coin each) of the longer one. Linear in their length (one line of a million words is
// one pair); returns the tokens it moved, at most what is kept.
size_t truncate_seq_pair(std::vector<int32_t>& a, std::vector<int32_t>& b, size_t max_tokens,
                         Rng& rng);

void mask_example(Example& e, const Vocab& vocab, const PretrainingOptions& o, Rng& rng);

// All examples of one document for one dupe round. Random B sentences come from the documents
// listed in `pool` (all documents when it is empty).
std::vector<Example> document_examples(const std::vector<Document>& docs, size_t doc, int dupe,
                                       const Vocab& vocab, const PretrainingOptions& o,
                                       const std::vector<size_t>& pool = {});

// The whole corpus, parallel over documents, shuffled by seed. Throws InputError for a corpus
// without any non-empty document.
SequencesFile create_pretraining_data(const std::vector<Document>& docs, const Vocab& vocab,
                                      const PretrainingOptions& o);

}  // namespace packbert::data
