// Streams packs (or one sequence per row, for the padded baseline) from a sequences file into
// the engine's PackedBatch, with a prefetch thread. Row order is shuffled per epoch by seed;
// a Cursor (epoch, row) says where the stream is, and a loader started at a cursor continues
// exactly where another stopped. Optional dynamic masking draws new masks every epoch
// (RoBERTa style) instead of the masks stored in the file.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "data/pretraining.h"
#include "data/sequences.h"
#include "io/memory.h"
#include "model/batch.h"

namespace packbert::train {

struct Cursor {
  uint64_t epoch = 0;
  uint64_t row = 0;  // next row of that epoch's shuffled order
  bool operator==(const Cursor&) const = default;
};

struct LoaderOptions {
  int rows_per_batch = 8;  // packs (or padded rows) per batch
  uint64_t seed = 1;
  bool dynamic_masking = false;
  data::PretrainingOptions masking;  // masking parameters when dynamic_masking is on
  int prefetch = 2;                  // batches built ahead
  // The rows this loader serves: [row_begin, row_end) of the file's row order (end 0 = all),
  // or, when row_list is not empty, exactly those rows; training and a held-out evaluation
  // split take disjoint sets.
  uint64_t row_begin = 0, row_end = 0;
  std::vector<uint64_t> row_list;
  bool shuffle = true;  // evaluation reads its rows in file order
  // Padded baseline only: fill each row's padding slots with [PAD] tokens that are computed
  // like real ones (as frameworks do) but form their own unlabelled sequence (kComputedPadding),
  // so results are unchanged and only the cost of padding is reproduced.
  bool compute_padding = false;
  // With packs: serve each pack's sequences one per row (padded), the same sequences in the same
  // order as the packed loader with the same seed; the padded side of a paired comparison.
  // rows_per_batch still counts packs.
  bool one_per_row = false;
};

class BatchLoader {
 public:
  // `packs` null: the padded baseline, one sequence per row of max_seq_len slots. With packs,
  // the packs file must belong to this sequences file (checksum), else InputError. `vocab` is
  // needed only for dynamic masking. The referenced objects must outlive the loader.
  BatchLoader(const data::SequencesFile& seqs, uint64_t seqs_checksum, const data::PacksFile* packs,
              const data::Vocab* vocab, LoaderOptions options, Cursor start);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch (blocks until the prefetch thread has it). Batches do not cross epochs; the
  // last one of an epoch may have fewer rows.
  model::PackedBatch next();
  // Where the stream stands after the batches returned so far.
  Cursor cursor() const { return cursor_; }
  uint64_t rows_per_epoch() const { return rows_; }
  int slots_per_row() const { return slots_; }

  // Builds one batch synchronously (what the prefetch thread runs); public for tests.
  model::PackedBatch build(Cursor at, Cursor* after) const;

 private:
  void produce();
  std::vector<uint64_t> epoch_order(uint64_t epoch) const;

  const data::SequencesFile& seqs_;
  const data::PacksFile* packs_;
  const data::Vocab* vocab_;
  LoaderOptions opt_;
  uint64_t rows_;
  int slots_;
  Cursor cursor_, produce_at_;

  struct Item {
    model::PackedBatch batch;
    Cursor after;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::exception_ptr error_;
  io::FailedAllocation failed_;  // what the worker could not allocate (error_ a bad_alloc)
  std::thread worker_;
};

}  // namespace packbert::train
