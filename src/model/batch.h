// A packed batch (docs/FORMATS.md, "packed batch"): B packs of S token slots. Per slot: input
// id, token type, position (reset to 0 at each sequence start), sequence id (0 = padding slot,
// 1..k = which sequence of the pack; Graphcore's convention) and MLM label (-100 = not masked).
// Per pack and sequence: NSP label [B, K] (-100 = no such sequence). The padded baseline is the
// same structure with one sequence per pack. Sequence id -1 (kComputedPadding) marks padding
// that a framework-style baseline computes: those slots follow the pack's sequences, form one
// unlabelled sequence of their own, and are laid out after every real token of the batch, so the
// real tokens keep the indices (and dropout draws) they have when packed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"

namespace packbert::model {

constexpr int32_t kComputedPadding = -1;

// Where a row sits in the whole batch of a step that is split across processes: the index of its
// first real token, of its first sequence, and of its first attention probability per head (the
// sum of L * L over the sequences before it). Dropout draws are keyed by these places, so a token
// is dropped the same way whichever process computes it.
struct RowPlace {
  int64_t token = 0, sequence = 0, attention = 0;
  bool operator==(const RowPlace&) const = default;
};

// A batch that is one share of a whole batch: its rows' places in the whole, and the whole
// batch's counts that each loss mean divides by, so that the shares' gradients sum to the
// whole batch's. Empty places (and counts 0): the batch is whole.
struct BatchShare {
  std::vector<RowPlace> places;  // [B]
  int64_t mlm = 0, nsp = 0, cls = 0, span = 0;
};

struct PackedBatch {
  int B = 0, S = 0, K = 0;
  std::vector<int32_t> input_ids, token_type_ids, position_ids, sequence_ids, mlm_labels;  // [B*S]
  std::vector<int32_t> nsp_labels;                                                         // [B*K]
  std::vector<int32_t> class_labels;            // [n_seq] for the classifier head (optional)
  std::vector<float> class_targets;             // [n_seq] for a regression head (num_labels 1)
  std::vector<int32_t> span_starts, span_ends;  // [n_seq] token index in sequence (optional)
  BatchShare share;                             // set by take_rows
};

// The places of every row of a whole batch and its loss counts (masked tokens, NSP labels,
// class labels, answerable spans). Computed padding (kComputedPadding) cannot be shared: it is
// laid out after every real token of the batch. Throws InputError for such a batch.
BatchShare share_of_whole(const PackedBatch& whole);
// The rows `rows` (ascending indices) of a whole batch as a batch of their own that carries its
// share: their places and the whole's counts.
PackedBatch take_rows(const PackedBatch& whole, const BatchShare& share,
                      const std::vector<int>& rows);
// Real tokens of each row.
std::vector<int64_t> row_tokens(const PackedBatch& b);

// One sequence of a batch, in batch order: its row, its first slot in the row, its tokens and
// its masked tokens.
struct SequenceSpan {
  int row = 0, start = 0, length = 0, masked = 0;
};
std::vector<SequenceSpan> sequences_of(const PackedBatch& b);
// The sequences `seqs` (ascending indices into sequences_of(whole)) of a whole batch as a batch of
// their own, one sequence a row, each row carrying its sequence's place and the batch the whole's
// counts: a finer share than take_rows', for balancing processes by their work.
PackedBatch take_sequences(const PackedBatch& whole, const BatchShare& share,
                           const std::vector<SequenceSpan>& spans, const std::vector<int>& seqs);

// B rows of S padding slots (ids 0, no labels) with room for K sequences per row: the start
// every producer of batches fills in.
PackedBatch empty_batch(int B, int S, int K, int32_t pad_id = 0);

// Lays sequences into a batch row by row: the one writer of the packed encoding (in each row,
// sequence ids 1, 2, ... in order, positions from 0 at each sequence start, token type 1 from
// where segment B starts). Producers then write each sequence's labels at the slot add()
// returned (MLM labels and masked inputs) or push them (class labels, spans).
class BatchBuilder {
 public:
  BatchBuilder(int B, int S, int K, int32_t pad_id = 0);
  // Appends a sequence to row `row` (it must fit the row's S slots and K sequences); tokens from
  // `b_start` on are segment B. Returns the index of its first slot in the batch's B * S.
  size_t add(int row, std::span<const int32_t> tokens, int b_start, int32_t nsp_label = -100);
  // The rest of `row` as padding the model computes (kComputedPadding, positions continuing).
  void compute_padding(int row);
  PackedBatch& batch() { return b_; }
  PackedBatch take() { return std::move(b_); }

 private:
  PackedBatch b_;
  std::vector<int> used_, sequences_;  // per row: slots and sequences filled
};

// Where the real tokens are: the engine computes on these T tokens only, never on padding.
struct TokenLayout {
  std::vector<int32_t> slot;        // [T] index into the B*S slots
  std::vector<int32_t> cu_seqlens;  // [n_seq + 1] offsets of sequence starts in the T tokens
  std::vector<int32_t> nsp_label;   // [n_seq] NSP label of each sequence (-100 = none)
  std::vector<int32_t> mlm_token;   // [M] token index (into T) of each masked position
  std::vector<int32_t> mlm_label;   // [M]
  int tokens() const { return static_cast<int>(slot.size()); }
  int sequences() const { return static_cast<int>(cu_seqlens.size()) - 1; }
};

// Validates the batch against the config and derives its token layout. Throws InputError
// naming the pack and slot of the first problem: sequence ids must run 1, 2, ... in contiguous
// blocks with padding (0) only at the end of a pack; ids, types and positions must be in range.
TokenLayout token_layout(const PackedBatch& batch, const BertConfig& config);
// The same into an existing layout, reusing its capacity (a steady-state step allocates nothing).
void token_layout(const PackedBatch& batch, const BertConfig& config, TokenLayout& out);

}  // namespace packbert::model
