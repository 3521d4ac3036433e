// The encoder as paired functions over the step's workspace (llm.c style): embeddings and one
// post-LN BERT layer, each forward next to its backward. Backward functions accumulate (+=) into
// parameter gradients; the layer's backward writes the gradient of its input over its buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/batch.h"
#include "model/params.h"
#include "model/sparse.h"
#include "model/workspace.h"

namespace packbert::model {

// Where a batch's tokens and sequences sit in the dropout streams (model/batch.h, RowPlace):
// runs of consecutive tokens [token_local[i], token_local[i + 1]) start at the whole batch's
// token token_global[i], and the same for sequences; attention holds each sequence's first
// probability index (head 0) in the whole batch, and is empty when the batch is whole.
struct DropoutPlaces {
  std::vector<int64_t> token_local, token_global, seq_local, seq_global, attention;
};

// What every function of one step shares: shapes, the batch's sequence boundaries, the dropout
// stream, the workspace (whose scratch records they use) and the backend its ops run on.
template <typename T, typename H = kernels::bf16>
struct StepContext {
  const BertConfig& config;
  const TokenLayout& tokens;
  const int64_t* probs_offsets;  // attention_probs_offsets of the batch, [n_seq + 1]
  const Workspace<T>& ws;
  Recompute policy;
  const kernels::Backend& be;  // every op of the step runs on it
  // The 16-bit copy of the weights under Precision::bf16 (H = bf16) or fp16 (H = f16), null
  // under fp32: GEMMs then take H operands, and the kept records are held in H (LayerRecord's
  // *16 fields).
  const ParamView<H>* p16 = nullptr;
  // The block-sparse patterns, one per layer (null when the model is dense): the encoder's
  // linear weights then hold the kept blocks' values (model/sparse.h).
  const LayerPatterns* patterns = nullptr;
  // When set (gradient regrow), backward also forms each sparse layer's dense weight gradient in
  // dense_scratch ([rows, cols] of the largest) and adds its block L1 norms here, one per layer.
  LayerBlockGrads* block_grads = nullptr;
  T* dense_scratch = nullptr;
  double p_hidden = 0, p_attn = 0;  // dropout probabilities (0 when not training)
  uint64_t seed = 0, step = 0;      // dropout stream
  const DropoutPlaces* places = nullptr;
  // The counts the loss means divide by: the whole batch's when this one is a share (0: own).
  int64_t mlm_total = 0, nsp_total = 0, cls_total = 0, span_total = 0;
  double loss_scale = 1;  // the factor backward's loss gradients start from (StepOptions)
  int T_() const { return tokens.tokens(); }
  int n_seq() const { return tokens.sequences(); }
};

// Dropout sites: (layer, site) name every dropout so masks are reproducible per step.
enum Site : uint32_t { kAttnProbs = 0, kAttnOut = 1, kFfnOut = 2, kEmbeddings = 3, kPooled = 4 };
constexpr uint32_t kNoLayer = 0xffffffffu;

// out = dropout(inp) with the hidden dropout probability at (layer, site); a copy when dropout is
// off (not training).
template <typename T, typename H>
void dropout_site(const StepContext<T, H>& s, T* out, const T* inp, int64_t n, uint32_t layer,
                  uint32_t site);
// dinp += the gradient through that site's mask (dropout on).
template <typename T, typename H>
void dropout_site_backward(const StepContext<T, H>& s, T* dinp, const T* dout, int64_t n,
                           uint32_t layer, uint32_t site);

// out = dropout(LayerNorm(word[ids] + position[pos] + type[types])), out: [T, C]; keeps the sum
// and its LayerNorm statistics (Rec::emb_*).
template <typename T, typename H>
void embeddings_forward(const StepContext<T, H>& s, const ParamView<T>& p, const int32_t* ids,
                        const int32_t* pos, const int32_t* types, T* out);
template <typename T, typename H>
void embeddings_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                         const int32_t* ids, const int32_t* pos, const int32_t* types,
                         const T* dout);

// LayerNorm's output rebuilt from its input stored in T (inp) or H (inp16, under a 16-bit
// precision), and the saved statistics (recompute policy `ln`); out16: the output's H twin, or
// null.
template <typename T, typename H>
void ln_apply(const StepContext<T, H>& s, T* out, const T* inp, const H* inp16, const T* mean,
              const T* rstd, const T* w, const T* b, int N, int C, H* out16);

// One layer: in, out: [T, C]; fills the record a (all fields; those the policy does not keep
// point to shared slots). Under a 16-bit precision (s.p16 set) the input is in16 (in is null) and
// the output goes to out16, and also to out in fp32 when out is not null (the encoder's output,
// which the heads read).
template <typename T, typename H>
void encoder_layer_forward(const StepContext<T, H>& s, int layer, const LayerView<T>& w,
                           const LayerRecord<T, H>& a, const T* in, T* out, const H* in16 = nullptr,
                           H* out16 = nullptr);
// dinp = d loss / d in (written over), given dout = d loss / d out and the record of the forward
// (rebuilding what the policy did not keep: GELU's output, LN1's output, the attention
// probabilities).
template <typename T, typename H>
void encoder_layer_backward(const StepContext<T, H>& s, int layer, const LayerView<T>& w,
                            const LayerView<T>& g, const LayerRecord<T, H>& a, const T* in,
                            const T* dout, T* dinp, const H* in16 = nullptr);

}  // namespace packbert::model
