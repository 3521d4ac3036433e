// BERT over packed batches: the encoder plus MLM/NSP (pre-training), classification and span
// heads, as a loop over the paired layer functions (model/encoder_layer.h, model/heads.h).
// Forward fills the step's workspace (model/workspace.h) with what backward needs, as the step's
// recompute policy decides; backward accumulates into the gradient arena, whose layout matches
// the parameters'. Templated on the scalar so whole-model gradients can be checked in double.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/batch.h"
#include "model/encoder_layer.h"
#include "model/heads.h"
#include "model/params.h"
#include "model/sparse.h"
#include "model/step.h"
#include "model/workspace.h"

namespace packbert::model {

template <typename T>
class BertModel {
 public:
  // With sparsity on, the encoder's linear weights are block-sparse (model/sparse.h), on
  // uniformly random patterns until init_patterns or a load sets them.
  BertModel(const BertConfig& config, Heads heads, Sparsity sparsity = {});

  const ParamLayout& layout() const { return layout_; }
  const BertConfig& config() const { return layout_.config(); }
  // Handing out the weights for writing marks their bf16 copy stale; read through the const
  // overload to keep it.
  std::vector<T>& params() {
    ++params_version_;
    return params_;
  }
  const std::vector<T>& params() const { return params_; }
  std::vector<T>& grads() { return grads_; }
  // The bf16 copy of the weights that Precision::bf16 steps multiply with (allocated on first
  // use, same layout as params()). A forward under bf16 refreshes it when params() has been
  // handed out since it was last written; an optimizer that rewrites it in its own pass calls
  // weights16_written() afterwards instead.
  kernels::bf16* weights16();
  void weights16_written() { params16_version_ = params_version_; }
  // Master weights in bf16 (`--master-weights bf16`; T = float, Precision::bf16 steps only): the
  // bf16 copy, rounded to nearest from params() now, becomes the weights themselves, and params()
  // shrinks to the tensors kernels also read in fp32 (read_only_in_bf16 in model/params.h: about
  // 1% of BERT's), widened from the masters after each update. The weights then take 2 bytes per
  // parameter instead of 6. For good: call it after the weights are loaded.
  void keep_masters_in_bf16();
  bool masters_in_bf16() const { return masters16_; }
  // After the optimizer rewrote the bf16 masters (weights16()): widens them into params().
  void masters16_written();
  // The whole weight arena in fp32 (params()' layout): params() itself, or under bf16 masters
  // their values widened into `scratch`.
  const T* weights_fp32(std::vector<T>& scratch) const;
  const ParamView<T>& p() const { return p_; }
  // The block-sparse patterns, one set per layer (empty when dense). Whoever moves slots
  // (prune and regrow, a checkpoint load) calls index_patterns on them afterwards.
  std::vector<LayerPatterns>& patterns() { return patterns_; }
  const std::vector<LayerPatterns>& patterns() const { return patterns_; }
  std::vector<SparseTensor> sparse_tensors() { return model::sparse_tensors(layout_, patterns_); }
  // Draws new uniformly random patterns from seed (a new run's start).
  void init_patterns(uint64_t seed) { patterns_ = random_patterns(layout_, seed); }
  // Gradient regrow: while on, backward also adds the block L1 norms of each sparse layer's dense
  // weight gradient into block_grads() (zeroed when turned on; an extra dense GEMM per layer).
  void collect_block_grads(bool on);
  const std::vector<LayerBlockGrads>& block_grads() const { return block_grads_; }

  // The backend every op of a step runs on (kernels/ops.h): cpu, or ref, the reference loops the
  // tests hold cpu to (orders of magnitude slower). A model's weights would live where its
  // backend computes, so it is the model's, not a step's.
  void set_backend(kernels::BackendKind kind) { backend_ = &kernels::backend(kind); }
  // One build of a backend (kernels::cpu_backends(): the tests run each build of cpu).
  void set_backend(const kernels::Backend& b) { backend_ = &b; }
  kernels::BackendKind backend() const { return backend_->kind; }

  void zero_grads();
  Outputs forward(const PackedBatch& batch, const StepOptions& options);
  // Gradients of the last forward's total loss, accumulated (+=) into grads(). `ready`, when
  // given, is called with each range [begin, end) of grads() as backward finishes it, heads
  // first, then layers from the top, then the embeddings (param_ranges below): what a
  // data-parallel step starts reducing while backward goes on.
  void backward(const std::function<void(size_t begin, size_t end)>& ready = {});
  // The ranges of the parameter arena that backward finishes one at a time, in that order; they
  // tile [0, layout().total()).
  const std::vector<std::pair<size_t, size_t>>& grad_ranges() const { return grad_ranges_; }
  // Bytes of activations the last forward kept for backward, and of its scratch.
  size_t activation_bytes() const { return ws_.activation_bytes(); }
  size_t scratch_bytes() const { return ws_.scratch_bytes(); }
  // Per-sequence classifier / span logits from the last forward ([n_seq, num_labels], [T, 2]).
  const T* class_logits() const { return ws_.get(Rec::cls_logits); }
  const T* span_logits() const { return ws_.get(Rec::span_logits); }
  const TokenLayout& tokens() const { return tl_; }

 private:
  template <typename H>
  StepContext<T, H> context();  // (non-const: backward writes block_grads_ through it)
  // forward and backward past their set-up, with H the step's 16-bit type (bf16 under fp32,
  // where no 16-bit tensor is held).
  template <typename H>
  void forward_with(const PackedBatch& batch);
  template <typename H>
  void backward_with(const std::function<void(size_t begin, size_t end)>& ready);
  bool kept(int l) const;  // is layer l's input a kept checkpoint (always, unless every:K)
  struct Slot {
    Rec rec;
    int64_t copy;
  };
  Slot input_slot(int l) const;   // the input of layer l (l = L: the encoder's output)
  Slot output_slot(int l) const;  // where layer l writes its output
  // The layer input / output in T, and in 16 bits (H). Under fp32 the 16-bit form is null; under
  // a 16-bit precision the T form is null but for the encoder's output (l = L), which the heads
  // also read in T.
  T* input_of(int l) const;
  T* output_of(int l) const;
  template <typename H>
  H* input16_of(int l) const;
  template <typename H>
  H* output16_of(int l) const;
  template <typename H>
  LayerRecord<T, H> record_of(int l) const;
  void place_rows(const PackedBatch& batch);
  ClassTargets<T> class_targets(const PackedBatch& batch);

  ParamLayout layout_;
  const kernels::Backend* backend_ = &kernels::backend(kernels::BackendKind::cpu);
  std::vector<LayerPatterns> patterns_;
  std::vector<LayerBlockGrads> block_grads_;  // empty unless collecting
  std::vector<T> dense_grad_scratch_;
  std::vector<T> params_, grads_;
  ParamView<T> p_, g_;
  std::vector<kernels::bf16> params16_;
  std::unique_ptr<ParamView<kernels::bf16>> p16_;
  uint64_t params_version_ = 0, params16_version_ = ~uint64_t{0};
  // Under fp16: the weights rounded to fp16, refreshed by the forward after params() changed.
  std::vector<kernels::f16> params_f16_;
  std::unique_ptr<ParamView<kernels::f16>> p_f16_;
  uint64_t params_f16_version_ = ~uint64_t{0};
  bool masters16_ = false;
  std::vector<KeptPlace> kept_fp32_;  // under bf16 masters: what params() keeps, and where

  // State of the last forward (everything backward needs is copied: the batch may be gone).
  // Vectors keep their capacity, and the workspace its arena, so steady-state steps allocate
  // nothing.
  StepOptions opt_;
  TokenLayout tl_;
  std::vector<int32_t> ids_, pos_, types_;
  std::vector<int64_t> probs_offsets_;
  DropoutPlaces places_;  // of a batch that is a share of a whole (empty otherwise)
  BatchShare share_;
  std::vector<std::pair<size_t, size_t>> grad_ranges_;
  std::vector<int32_t> cls_targets_, span_targets_;  // span: (start, end) pairs
  std::vector<T> cls_values_;                        // a regression head's targets
  Workspace<T> ws_;
  Outputs out_;
};

}  // namespace packbert::model
