// How a step's gradients become the sum over every process, and the weights every process's
// again after the update, in one object (Megatron's and DeepSpeed's "grad sync" seam):
// - none: one process; nothing to do.
// - allreduce: each range of the gradient arena is all-reduced as backward finishes it on the
//   last micro-batch (overlapping communication with backward); every process updates all.
// - zero1 (ZeRO stage 1): each range is reduce-scattered as backward finishes it (each process
//   receiving the sum of its shard's part), each process updates its shard (holding that
//   shard's optimizer moments only), and the weights are all-gathered.
// Under all-reduce the word table's embeddings share is reduced on its own (start()), so the
// table's range goes early (model::BertModel::defer_word_rows). A pipeline's first and last
// stages each hold the tied word table; the first forms its whole gradient and hands it to the
// last after this sum (train::StageLinks::share_tied): on the first stage that range is
// all-reduced whole even under ZeRO-1 (keep_whole), on the last it is not summed at all (skip).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "dist/comm.h"

namespace packbert::dist {

class GradientSync {
 public:
  enum class Kind { none, allreduce, zero1 };
  // `zero` (the zero_stage option: 0 or 1) chooses between all-reduce and ZeRO-1 when the run has
  // several processes; `total`: the parameter arena's size.
  GradientSync(Comm& comm, int zero, size_t total);

  Kind kind() const { return kind_; }
  bool sharded() const { return kind_ == Kind::zero1; }
  // [begin, end) of the arena this process updates (all of it unless sharded), and every
  // process's bounds ([ranks + 1]; {0, total} unless sharded).
  std::pair<size_t, size_t> shard() const;
  const std::vector<size_t>& bounds() const { return bounds_; }

  // What backward calls with each range [a, e) of `grads` it finishes on the step's last
  // micro-batch: starts the range's all-reduce, or its reduce-scatter (empty in one process).
  std::function<void(size_t, size_t)> on_ready(float* grads);
  // A range [a, e) that every process needs whole after the sum: all-reduced even under ZeRO-1.
  void keep_whole(size_t a, size_t e) { whole_ = {a, e}; }
  // A range [a, e) this process does not sum: its gradient comes whole from elsewhere after the
  // sum (a pipeline's last stage's word table).
  void skip(size_t a, size_t e) { skip_ = {a, e}; }
  // Whether ranges are reduced as backward finishes them (several processes), so that backward
  // should finish the largest early (BertModel::defer_word_rows) and let MPI progress between
  // its ops.
  bool overlaps() const { return kind_ != Kind::none; }
  // Starts the sum over processes of a gradient buffer outside the arena, n floats in place
  // (the whole of it on every process); finish() completes it with the ranges.
  void start(float* x, size_t n);
  // Lets started reductions move on (between backward's ops).
  void progress() { comm_.progress(); }
  // After the last backward: the sums complete in the gradients (this process's shard under
  // ZeRO-1).
  void finish(float* grads);
  // Adds up n partial sums that each process computed over its shard (ZeRO-1: a gradient norm,
  // LAMB's per-tensor norms); empty when every process holds the whole arena.
  std::function<void(double*, size_t)> shard_sum();
  // After this process's shard moved: the whole weights on every process (ZeRO-1 only; fp32 or
  // bf16 masters, 16 bits each).
  void gather(float* weights);
  void gather(uint16_t* weights16);

 private:
  Comm& comm_;
  Kind kind_ = Kind::none;
  std::vector<size_t> bounds_;
  std::pair<size_t, size_t> whole_{0, 0}, skip_{0, 0};
};

}  // namespace packbert::dist
