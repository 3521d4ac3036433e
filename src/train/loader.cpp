#include "train/loader.h"

#include <algorithm>

#include "error.h"
#include "rng.h"

namespace packbert::train {

BatchLoader::BatchLoader(const data::SequencesFile& seqs, uint64_t seqs_checksum,
                         const data::PacksFile* packs, const data::Vocab* vocab,
                         LoaderOptions options, Cursor start)
    : seqs_(seqs), packs_(packs), vocab_(vocab), opt_(options), cursor_(start), produce_at_(start) {
  if (opt_.rows_per_batch < 1) throw InputError("rows per batch must be at least 1");
  if (packs_) {
    if (packs_->sequences_checksum != seqs_checksum || packs_->n_sequences != seqs_.size())
      throw InputError(
          "the packs file was built for another sequences file (checksum differs); "
          "re-run packbert pack on this sequences file");
    if (packs_->max_seq_len < seqs_.max_seq_len)
      throw InputError("the packs file's max length " + std::to_string(packs_->max_seq_len) +
                       " is below the sequences' " + std::to_string(seqs_.max_seq_len));
    for (uint64_t id : packs_->ids)
      if (id >= seqs_.size())
        throw InputError("the packs file names sequence " + std::to_string(id) +
                         ", beyond the file");
    rows_ = packs_->packs();
    slots_ = opt_.one_per_row ? seqs_.max_seq_len : packs_->max_seq_len;
  } else {
    rows_ = seqs_.size();
    slots_ = seqs_.max_seq_len;
  }
  const uint64_t all = rows_;
  if (all == 0) throw InputError("the sequences file holds no sequence");
  if (opt_.row_end == 0) opt_.row_end = all;
  if (opt_.row_begin >= opt_.row_end || opt_.row_end > all)
    throw InputError("row range [" + std::to_string(opt_.row_begin) + ", " +
                     std::to_string(opt_.row_end) + ") is empty or beyond the " +
                     std::to_string(all) + " rows");
  rows_ = opt_.row_end - opt_.row_begin;
  if (!opt_.row_list.empty()) {
    for (uint64_t r : opt_.row_list)
      if (r >= all)
        throw InputError("row " + std::to_string(r) + " is beyond the " + std::to_string(all) +
                         " rows");
    rows_ = opt_.row_list.size();
  }
  if (opt_.dynamic_masking && !vocab_) throw InputError("dynamic masking needs the vocabulary");
  if (opt_.compute_padding && packs_ && !opt_.one_per_row)
    throw InputError("`compute_padding` applies to the padded baseline only");
  if (opt_.one_per_row && !packs_) throw InputError("one sequence per row of packs needs packs");
  if (vocab_ && !seqs_.made_with(*vocab_))
    throw InputError("the vocabulary differs from the one the sequences file was made with");
  if (cursor_.row > rows_) throw InputError("cursor row beyond the epoch");
  worker_ = std::thread([this] { produce(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

std::vector<uint64_t> BatchLoader::epoch_order(uint64_t epoch) const {
  std::vector<uint64_t> order(rows_);
  if (!opt_.row_list.empty())
    order = opt_.row_list;
  else
    for (uint64_t i = 0; i < rows_; ++i) order[i] = opt_.row_begin + i;
  if (!opt_.shuffle) return order;
  SplitMix64 rng(opt_.seed * kGolden64 + epoch);
  shuffle(order, rng);
  return order;
}

model::PackedBatch BatchLoader::build(Cursor at, Cursor* after) const {
  if (at.row >= rows_) at = {at.epoch + 1, 0};
  std::vector<uint64_t> order = epoch_order(at.epoch);
  uint64_t end = std::min<uint64_t>(rows_, at.row + static_cast<uint64_t>(opt_.rows_per_batch));
  *after = end == rows_ ? Cursor{at.epoch + 1, 0} : Cursor{at.epoch, end};

  // The sequences of each row.
  std::vector<std::vector<uint64_t>> rows;
  int K = 1;
  for (uint64_t r = at.row; r < end; ++r) {
    uint64_t row = order[r];
    if (packs_ && opt_.one_per_row)
      for (uint64_t k = packs_->offsets[row]; k < packs_->offsets[row + 1]; ++k)
        rows.push_back({packs_->ids[k]});
    else if (packs_)
      rows.emplace_back(packs_->ids.begin() + static_cast<long>(packs_->offsets[row]),
                        packs_->ids.begin() + static_cast<long>(packs_->offsets[row + 1]));
    else
      rows.push_back({row});
    K = std::max(K, static_cast<int>(rows.back().size()));
  }
  const bool pad_compute = opt_.compute_padding && (!packs_ || opt_.one_per_row);
  model::BatchBuilder builder(static_cast<int>(rows.size()), slots_, K, vocab_ ? vocab_->pad() : 0);
  model::PackedBatch& b = builder.batch();
  for (int p = 0; p < b.B; ++p) {
    for (const uint64_t s : rows[p]) {
      const int L = seqs_.length(s);
      const int32_t* tok = seqs_.tokens.data() + seqs_.token_offsets[s];
      const size_t base =
          builder.add(p, {tok, static_cast<size_t>(L)}, seqs_.b_start[s], seqs_.nsp_label[s]);
      if (opt_.dynamic_masking) {
        data::Example e;
        e.tokens.assign(tok, tok + L);
        data::Rng rng(opt_.seed ^ (at.epoch * 0xc2b2ae3d27d4eb4fULL) ^ (s * kGolden64));
        data::mask_example(e, *vocab_, opt_.masking, rng);
        for (size_t m = 0; m < e.mlm_positions.size(); ++m) {
          b.input_ids[base + e.mlm_positions[m]] = e.mlm_inputs[m];
          b.mlm_labels[base + e.mlm_positions[m]] = tok[e.mlm_positions[m]];
        }
      } else {
        for (uint64_t m = seqs_.mlm_offsets[s]; m < seqs_.mlm_offsets[s + 1]; ++m) {
          b.input_ids[base + seqs_.mlm_positions[m]] = seqs_.mlm_inputs[m];
          b.mlm_labels[base + seqs_.mlm_positions[m]] = tok[seqs_.mlm_positions[m]];
        }
      }
    }
    if (pad_compute) builder.compute_padding(p);
  }
  return builder.take();
}

void BatchLoader::produce() {
  try {
    io::AllocationScope scope("the batches the loader prefetches");
    Cursor at = produce_at_;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || static_cast<int>(queue_.size()) < opt_.prefetch; });
        if (stop_) return;
      }
      Item item;
      item.batch = build(at, &item.after);
      at = item.after;
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(item));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    try {
      failed_ = io::last_failed_allocation();
    } catch (...) {  // (no memory even for its name: the report says less)
    }
    cv_.notify_all();
  }
}

model::PackedBatch BatchLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || error_; });
  if (queue_.empty()) {
    io::set_failed_allocation(failed_);  // (the report of a bad_alloc is per thread)
    std::rethrow_exception(error_);
  }
  Item item = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  cv_.notify_all();
  cursor_ = item.after;
  return std::move(item.batch);
}

}  // namespace packbert::train
