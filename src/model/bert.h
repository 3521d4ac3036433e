// BERT over packed batches: the encoder plus MLM/NSP (pre-training), classification and span
// heads, as a loop over the paired layer functions (model/encoder_layer.h, model/heads.h).
// Forward fills the step's workspace (model/workspace.h) with what backward needs, as the step's
// recompute policy decides; backward accumulates into the gradient arena, whose layout matches
// the parameters'. The scalar is a DType (f32, or f64 so whole-model gradients can be checked in
// double).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/batch.h"
#include "model/encoder_layer.h"
#include "model/heads.h"
#include "model/params.h"
#include "model/sparse.h"
#include "model/step.h"
#include "model/workspace.h"

namespace packbert::model {

class BertModel {
 public:
  // With sparsity on, the encoder's linear weights are block-sparse (model/sparse.h), on
  // uniformly random patterns until init_patterns or a load sets them. dtype: the scalar of the
  // weights, gradients and steps, f32 (training) or f64 (the finite-difference tests). stage:
  // the pipeline stage this model is (ParamLayout's Stage; the whole model by default), which
  // holds that stage's parameters only, takes the stage below's output as its input and gives
  // its input's gradient back (forward and backward below). Dense models only.
  BertModel(const BertConfig& config, Heads heads, Sparsity sparsity = {},
            kernels::DType dtype = kernels::DType::f32, Stage stage = {});

  const ParamLayout& layout() const { return layout_; }
  const BertConfig& config() const { return layout_.config(); }
  kernels::DType dtype() const { return params_.dtype(); }
  // The weight and gradient arenas (layout()'s layout) as the model's scalar T (std::logic_error
  // when T is not dtype()). Handing out the weights for writing marks their 16-bit copy stale;
  // read through the const overload to keep it.
  template <typename T = float>
  std::span<T> params() {
    ++params_version_;
    return params_.span<T>();
  }
  template <typename T = float>
  std::span<const T> params() const {
    return params_.span<const T>();
  }
  template <typename T = float>
  std::span<T> grads() {
    return grads_.span<T>();
  }
  template <typename T = float>
  std::span<const T> grads() const {
    return grads_.span<const T>();
  }
  // The weights as an optimizer updates them (the whole arena): params(), or under 16-bit master
  // weights the masters themselves. Handing them out marks the weights' 16-bit copy stale, as
  // params() does (that copy, which 16-bit steps multiply with, is rounded afresh by the next
  // forward); the optimizer then calls masters_written().
  kernels::View masters();
  // The 16-bit copy that an optimizer pass over fp32 weights rewrites for steps of precision p
  // (model::optimizer_writes_copy), or an empty View when p's forward rounds its own; after the
  // pass, weights16_written().
  kernels::View copy16_for_optimizer(Precision p);
  void weights16_written() { copy16_version_ = params_version_; }
  // Master weights in 16 bits (`--master-weights`; an f32 model, steps of the masters' own
  // precision only): the 16-bit copy, rounded to nearest from params() now, becomes the weights
  // themselves, and params() shrinks to the tensors kernels also read in fp32
  // (read_only_in_16bit in model/params.h: about 1% of BERT's), widened from the masters after
  // each update. The weights then take 2 bytes per parameter instead of 6. For good: call it
  // after the weights are loaded.
  void keep_masters16(Masters masters);
  bool masters16() const { return masters16_; }
  // After the optimizer rewrote masters(): under 16-bit masters widens them into params().
  void masters_written();
  // The whole weight arena in fp32 (params()' layout) of an f32 model: params() itself, or under
  // 16-bit masters their values widened into `scratch`.
  const float* weights_fp32(std::vector<float>& scratch) const;
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
  // Its tensors stay where they are: the new backend must compute in the same Device's memory
  // (std::logic_error otherwise; cpu and ref share the host's).
  void set_backend(kernels::BackendKind kind) { set_backend(kernels::backend(kind)); }
  // One build of a backend (kernels::cpu_backends(): the tests run each build of cpu).
  void set_backend(const kernels::Backend& b);
  kernels::BackendKind backend() const { return backend_->kind; }

  void zero_grads();
  // Forwards in flight (a pipeline stage's 1F1B schedule keeps several): a pass holds one
  // forward's state (its workspace, token layout, targets and outputs). forward fills the pass
  // selected here and backward runs on the selected pass, which must hold a forward. Pass 0 is
  // selected at first; the others are made on first use (each with a workspace of its own).
  void use_pass(int k);
  // `input`: a stage after the first's input, the stage below's stage_output() of the same
  // batch ([T, C] as the layers hold it: 16 bits under a 16-bit precision); empty for a first
  // stage (or the whole model), which computes the embeddings. A stage before the last returns
  // no losses (its Outputs are zero) and leaves its output in stage_output().
  // `progress`, when given, is called between the ops of each layer (as backward's below).
  Outputs forward(const PackedBatch& batch, const StepOptions& options, kernels::View input = {},
                  const std::function<void()>& progress = {});
  kernels::View stage_output() const { return input_of(layout_.stage_config().num_hidden_layers); }
  // Gradients of the last forward's total loss, accumulated (+=) into grads(). `ready`, when
  // given, is called with each range [begin, end) of grads() as backward finishes it, heads
  // first, then layers from the top, then the embeddings (param_ranges below): what a
  // data-parallel step starts reducing while backward goes on.
  // `progress`, when given, is called between the ops of each layer's backward (a data-parallel
  // step moves its in-flight reductions along there).
  // `output_grad`: a stage before the last's d loss / d stage_output() ([T, C] in the model's
  // scalar, from the stage above), empty for a last stage (or the whole model), which starts
  // from its losses. A stage after the first leaves d loss / d input in input_grad() (workspace
  // memory, valid until the next forward).
  void backward(const std::function<void(size_t begin, size_t end)>& ready = {},
                const std::function<void()>& progress = {}, kernels::View output_grad = {});
  kernels::View input_grad() const { return cur_->input_grad; }
  // The tied word table across pipeline stages. On a last stage that is not the first, the word
  // table's gradient is the MLM decoder's share, and the first stage's the embeddings'; after
  // hand_decoder_to_first_stage() the last stage's backward leaves its table's gradient alone,
  // and the first stage forms the decoder's share itself: before each micro-batch's backward it
  // takes that micro-batch's decoder_input() from the last stage (after its forward) and calls
  // add_decoder_grad, so the table's whole gradient sums on the first stage in the whole model's
  // order (the decoder's share, then the embeddings', micro-batch by micro-batch) and costs each
  // stage one decoder product of the head's three.
  void hand_decoder_to_first_stage();
  // The selected pass's MLM decoder input and the decoder's bias (a last stage, after forward;
  // valid until the pass's next forward).
  DecoderInput decoder_input() const;
  // A first stage below the MLM head: adds the decoder's share of the word table's gradient
  // (model/heads.h, mlm_decoder_weight_backward) for the selected pass's micro-batch.
  void add_decoder_grad(const DecoderInput& d, const std::function<void()>& progress = {});
  // The ranges of the parameter arena that the next backward finishes one at a time, in that
  // order; they tile [0, layout().total()).
  const std::vector<std::pair<size_t, size_t>>& grad_ranges() const {
    return word_rows_.empty() ? grad_ranges_ : deferred_ranges_;
  }
  // Data parallelism that hides its reduction (train/loop.cpp): the word table is the largest
  // tensor, and its gradient (the MLM decoder's share and the embeddings') is final only at the
  // end of backward, where nothing is left to overlap its all-reduce with. With `rows` set (the
  // word-table rows the next backward can touch, sorted and unique: the ids of the whole batch),
  // that backward reports the word table finished right after the heads, and the embeddings'
  // share goes to word_rows_grads() ([rows, C], zeroed here) instead, for the caller to sum over
  // processes and then add with add_word_rows(), which ends the deferral.
  void defer_word_rows(const std::vector<int32_t>& rows);
  kernels::View word_rows_grads() const;
  void add_word_rows();
  // Bytes of activations the last forward kept for backward, and of its scratch.
  size_t activation_bytes() const { return cur_->ws.activation_bytes(); }
  size_t scratch_bytes() const { return cur_->ws.scratch_bytes(); }
  // Per-sequence classifier / span logits from the last forward ([n_seq, num_labels], [T, 2]),
  // in the model's scalar T.
  template <typename T = float>
  const T* class_logits() const {
    return cur_->ws.get(Rec::cls_logits).as<const T>();
  }
  template <typename T = float>
  const T* span_logits() const {
    return cur_->ws.get(Rec::span_logits).as<const T>();
  }
  const TokenLayout& tokens() const { return cur_->tl; }

 private:
  StepContext context();  // (non-const: backward writes block_grads_ through it)
  // The 16-bit copy as `t`: reallocated and marked stale when it holds another type.
  void hold_copy16(kernels::DType t);
  bool kept(int l) const;  // is layer l's input a kept checkpoint (always, unless every:K)
  struct Slot {
    Rec rec;
    int64_t copy;
  };
  Slot input_slot(int l) const;  // the input of layer l (l = L: the encoder's output)
  // The input / output of layer l as the layers hold it (16 bits under a 16-bit precision).
  kernels::View input_of(int l) const;
  kernels::View output_of(int l) const;
  // The encoder's output in the step's scalar, which the heads read (under a 16-bit precision a
  // wide copy beside the layers' 16-bit one).
  kernels::View top() const;
  LayerRecord record_of(int l) const;
  void place_rows(const PackedBatch& batch);
  ClassTargets class_targets(const PackedBatch& batch);
  // The span head's (start, end) pairs from the batch, checked against the sequences.
  const int32_t* span_targets(const PackedBatch& batch);
  // Forward's parts: the weights' 16-bit copy current for a step of `precision`; the selected
  // pass filled from the batch (token layout, ids, dropout places) and its workspace laid out.
  void refresh_copy16(Precision precision);
  void prepare_pass(const PackedBatch& batch, const StepOptions& options);
  // Backward's parts: the heads (pooler included) into dh, which starts zeroed; the embeddings
  // from dh (the word table's share deferred when defer_word_rows is on).
  void heads_backward(const StepContext& s, kernels::View dh);
  // The family's embeddings into out ([T, C] in the scalar), and layer l's forward (the stage's
  // index) into out (default: output_of(l)).
  void embeddings_of(const StepContext& s, kernels::View out);
  void layer_forward(const StepContext& s, int l, kernels::View out_wide, kernels::View out = {});
  // What a ModernBERT step cannot run yet, refused in one line (InputError).
  void refuse_unbuilt_modernbert(const StepOptions& options) const;
  void embeddings_backward_of(const StepContext& s, kernels::View dh);

  ParamLayout layout_;
  const kernels::Backend* backend_ = &kernels::backend(kernels::BackendKind::cpu);
  std::vector<LayerPatterns> patterns_;
  std::vector<LayerBlockGrads> block_grads_;  // empty unless collecting
  kernels::Buffer dense_grad_scratch_;
  kernels::Buffer params_, grads_;
  ParamView p_, g_;
  kernels::Buffer copy16_;  // the 16-bit copy of the weights, or the 16-bit masters
  ParamView p16_;
  uint64_t params_version_ = 0, copy16_version_ = ~uint64_t{0};
  bool masters16_ = false;
  std::vector<KeptPlace> kept_fp32_;  // under 16-bit masters: what params() keeps, and where

  // The state of one forward (everything backward needs is copied: the batch may be gone).
  // Vectors keep their capacity, and the workspace its arena, so steady-state steps allocate
  // nothing.
  struct Pass {
    StepOptions opt;
    TokenLayout tl;
    std::vector<int32_t> ids, pos, types;
    std::vector<int64_t> probs_offsets, probs_offsets_local;  // (local: ModernBERT's window)
    std::vector<int32_t> token_sequence;  // each token's sequence (ModernBERT's mean pooling)
    DropoutPlaces places;                 // of a batch that is a share of a whole (empty otherwise)
    BatchShare share;
    std::vector<int32_t> word_ids;                   // deferral: the batch's ids among the rows
    std::vector<int32_t> cls_targets, span_targets;  // span: (start, end) pairs
    kernels::Buffer cls_values;                      // a regression head's targets
    Workspace ws;
    Outputs out;
    kernels::View input_grad;
    bool forwarded = false;  // holds a forward that no backward has used yet
  };
  std::vector<std::unique_ptr<Pass>> passes_;
  Pass* cur_ = nullptr;  // the pass use_pass() selected
  std::vector<std::pair<size_t, size_t>> grad_ranges_, deferred_ranges_;
  std::vector<int32_t> word_rows_;  // deferral: the rows
  kernels::Buffer word_rows_grads_;
  bool word_with_heads_ = false;    // a last stage's word table: finished with the heads
  bool decoder_elsewhere_ = false;  // hand_decoder_to_first_stage()
};

}  // namespace packbert::model
