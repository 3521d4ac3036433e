// BERT over packed batches: the encoder plus MLM/NSP (pre-training), classification and span
// heads. Forward keeps exactly the activations backward needs (per-layer records) and counts
// their bytes; backward accumulates into the gradient arena, whose layout matches the
// parameters'. Templated on the scalar so whole-model gradients can be checked in double.
#pragma once

#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "model/params.h"

namespace packbert::model {

struct StepOptions {
  bool training = false;  // dropout on (with config's probabilities) when true
  uint64_t seed = 0;      // dropout stream seed
  uint64_t step = 0;      // dropout stream step: masks differ per step, repeat per (seed, step)
};

// Loss conventions (docs/FORMATS.md): MLM = mean cross-entropy over the batch's masked tokens;
// NSP = mean over sequences with an NSP label; classification = mean over sequences; span =
// mean over sequences of (start CE + end CE) / 2. The total is the sum of the active ones. All
// are the same whether sequences arrive packed or one per row.
struct Outputs {
  double mlm_loss = 0, nsp_loss = 0, cls_loss = 0, span_loss = 0;
  int64_t mlm_count = 0, mlm_correct = 0, nsp_count = 0, nsp_correct = 0;
  int64_t cls_count = 0, cls_correct = 0, span_count = 0;
  double loss() const { return mlm_loss + nsp_loss + cls_loss + span_loss; }
};

template <typename T>
class BertModel {
 public:
  BertModel(const BertConfig& config, Heads heads);

  const ParamLayout& layout() const { return layout_; }
  const BertConfig& config() const { return layout_.config(); }
  std::vector<T>& params() { return params_; }
  std::vector<T>& grads() { return grads_; }
  const ParamView<T>& p() const { return p_; }

  void zero_grads();
  Outputs forward(const PackedBatch& batch, const StepOptions& options);
  // Gradients of the last forward's total loss, accumulated (+=) into grads().
  void backward();
  // Bytes of activations the last forward kept for backward.
  size_t activation_bytes() const;
  // Per-sequence classifier / span logits from the last forward ([n_seq, num_labels], [T, 2]).
  const std::vector<T>& class_logits() const { return cls_logits_; }
  const std::vector<T>& span_logits() const { return span_logits_; }
  const TokenLayout& tokens() const { return tl_; }

 private:
  struct LayerActs {
    std::vector<T> qkv, probs, att, r1, ln1_mean, ln1_rstd, h1, inter, gelu, r2, ln2_mean, ln2_rstd;
  };
  ParamLayout layout_;
  std::vector<T> params_, grads_;
  ParamView<T> p_, g_;

  // State of the last forward (everything backward needs is copied: the batch may be gone).
  StepOptions opt_;
  TokenLayout tl_;
  std::vector<int32_t> ids_, pos_, types_;
  std::vector<T> emb_sum_, emb_mean_, emb_rstd_, emb_ln_;
  std::vector<std::vector<T>> hidden_;  // [L+1][T*C]: embeddings output, then each layer's
  std::vector<LayerActs> acts_;
  std::vector<T> mlm_in_, mlm_t1_, mlm_t2_, mlm_mean_, mlm_rstd_, mlm_t3_, mlm_probs_;
  std::vector<T> cls_in_, pooled_, nsp_probs_, cls_drop_, cls_logits_, cls_probs_;
  std::vector<T> span_logits_, span_probs_;
  std::vector<int32_t> nsp_targets_, cls_targets_, span_targets_;  // span: (start, end) pairs
  Outputs out_;
};

}  // namespace packbert::model
