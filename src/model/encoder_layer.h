// The encoder as paired functions over the step's workspace (llm.c style): embeddings and one
// post-LN BERT layer, each forward next to its backward. Backward functions accumulate (+=) into
// parameter gradients; the layer's backward writes the gradient of its input over its buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
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

// What a pipeline's first stage needs to form the MLM decoder's weight gradient: the decoder is
// the word table, which the first and the last stage both hold, and the first forms the
// decoder's share of the table's gradient (BertModel::add_decoder_grad) from the decoder's input
// [masked, hidden] (as the layers hold activations: 16 bits under a 16-bit precision) and bias
// [vocab] (f32) on the last stage, which a [masked, vocab] logits' gradient would outweigh 40
// times on the wire.
struct DecoderInput {
  kernels::View input, bias;
};

// What every function of one step shares: shapes, the batch's sequence boundaries, the dropout
// stream, the workspace (whose scratch records they use) and the backend its ops run on. Tensors
// are Views: the step's scalar (f32, or f64 in the finite-difference tests) or, under a 16-bit
// precision, the records and weight copy it holds in 16 bits; each op reads the DTypes it is
// handed.
struct StepContext {
  const BertConfig& config;
  const TokenLayout& tokens;
  const int64_t* probs_offsets;  // attention_probs_offsets of the batch, [n_seq + 1]
  const Workspace& ws;
  Recompute policy;
  const kernels::Backend& be;  // every op of the step runs on it
  // The 16-bit copy of the weights under a 16-bit precision, null under fp32: GEMMs then take
  // 16-bit operands, and the kept records are held in 16 bits.
  const ParamView* p16 = nullptr;
  // The block-sparse patterns, one per layer (null when the model is dense): the encoder's
  // linear weights then hold the kept blocks' values (model/sparse.h).
  const LayerPatterns* patterns = nullptr;
  // When set (gradient regrow), backward also forms each sparse layer's dense weight gradient in
  // dense_scratch ([rows, cols] of the largest) and adds its block L1 norms here, one per layer.
  LayerBlockGrads* block_grads = nullptr;
  kernels::View dense_scratch;
  double p_hidden = 0, p_attn = 0;  // dropout probabilities (0 when not training)
  uint64_t seed = 0, step = 0;      // dropout stream
  const DropoutPlaces* places = nullptr;
  // The counts the loss means divide by: the whole batch's when this one is a share (0: own).
  int64_t mlm_total = 0, nsp_total = 0, cls_total = 0, span_total = 0;
  double loss_scale = 1;  // the factor backward's loss gradients start from (StepOptions)
  // Called between the ops of a layer's forward and backward when set (BertModel's `progress`).
  const std::function<void()>* progress = nullptr;
  // A pipeline's last stage: the MLM backward leaves the word table's gradient to the first
  // stage (BertModel::hand_decoder_to_first_stage).
  bool decoder_elsewhere = false;
  // Each token's position inside its own sequence ([T]: rotary's angles, ModernBERT).
  const int32_t* positions = nullptr;
  // attention_probs_offsets of the batch for the local layers' window (ModernBERT).
  const int64_t* probs_offsets_local = nullptr;
  // Each token's sequence ([T]: ModernBERT's mean pooling).
  const int32_t* token_sequence = nullptr;
  // Layer l's attention window (0: global) and its probabilities' offsets.
  int window(int l) const {
    return config.family == Family::modernbert ? config.modern.window(l) : 0;
  }
  const int64_t* offsets(int l) const { return window(l) ? probs_offsets_local : probs_offsets; }
  void tick() const {
    if (progress) (*progress)();
  }
  int T_() const { return tokens.tokens(); }
  int n_seq() const { return tokens.sequences(); }
};

// An output written as held, for the ops that take a scalar output and its 16-bit form as two
// Views (LayerNorm's): (the scalar one, the 16-bit one), either empty. `wide`: the scalar View to
// fill as well when out is 16-bit.
inline std::pair<kernels::View, kernels::View> wide_and_16(kernels::View out,
                                                           kernels::View wide = {}) {
  return out.is_16bit() ? std::pair{wide, out} : std::pair{out, kernels::View()};
}

// Dropout sites: (layer, site) name every dropout so masks are reproducible per step.
enum Site : uint32_t { kAttnProbs = 0, kAttnOut = 1, kFfnOut = 2, kEmbeddings = 3, kPooled = 4 };
constexpr uint32_t kNoLayer = 0xffffffffu;

// out = dropout(inp) with the hidden dropout probability at (layer, site), two contiguous Views
// of the same size ([T, C], or [n_seq, C] for the pooled site); a copy when dropout is off (not
// training).
void dropout_site(const StepContext& s, kernels::View out, kernels::View inp, uint32_t layer,
                  uint32_t site);
// dinp += the gradient through that site's mask (dropout on).
void dropout_site_backward(const StepContext& s, kernels::View dinp, kernels::View dout,
                           uint32_t layer, uint32_t site);

// out = dropout(LayerNorm(word[ids] + position[pos] + type[types])), out: [T, C] in the step's
// scalar; keeps the sum and its LayerNorm statistics (Rec::emb_*).
void embeddings_forward(const StepContext& s, const ParamView& p, const int32_t* ids,
                        const int32_t* pos, const int32_t* types, kernels::View out);
// dword, when given, takes the word table's gradient in place of g.word (ids then index it).
void embeddings_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                         const int32_t* ids, const int32_t* pos, const int32_t* types,
                         kernels::View dout, kernels::View dword = {});

// LayerNorm's output [N, C] rebuilt from its input as held (the step's scalar, or 16 bits) and
// the saved statistics (recompute policy `ln`), into out as held.
void ln_apply(const StepContext& s, kernels::View out, kernels::View inp, kernels::View mean,
              kernels::View rstd, kernels::View w, kernels::View b);

// The parts every family's layers are made of (model/encoder_layer.cpp).
// One of a layer's linear layers as a step multiplies it: its weight W (a block-sparse layer's:
// the kept blocks' values), the weight's 16-bit copy W16 under a 16-bit precision (empty under
// fp32), its bias b (empty: none), its block pattern (null: dense), and for backward the weight's
// and bias's gradients and, under gradient regrow, where the dense gradient's block norms go.
struct Linear {
  kernels::View W, W16, b;
  const kernels::BlockPattern* pattern = nullptr;
  kernels::View dW, db;
  std::vector<float>* block_l1 = nullptr;
};
// Which of a layer's linear layers: q | k | v, the attention output, the MLP's up- and
// down-projections.
enum class LayerLinear { qkv, attn_out, inter, out };
// Layer `layer`'s linear layer `which` from its weights w and, for backward, its gradients g.
Linear layer_linear(const StepContext& s, int layer, LayerLinear which, const LayerView& w,
                    const LayerView* g = nullptr);
// out = in . W^T + b, [N, OC] from [N, C] (the shapes of out and in), out as held: dense (16-bit
// operands under a 16-bit precision) or block-sparse.
void linear(const StepContext& s, const Linear& lin, kernels::View out, kernels::View in);
// Its backward: dinp written as `mode` says, dW and db (either may be empty) accumulated, and the
// block norms added where lin asks for them.
void linear_grad(const StepContext& s, const Linear& lin, kernels::View dinp, kernels::View dout,
                 kernels::View in, kernels::GradWrite mode);
// LayerNorm of [N, C] (b may be empty: no bias): out as held, out_wide as ln_apply's; backward
// writes dinp over.
void ln_forward(const StepContext& s, kernels::View out, kernels::View mean, kernels::View rstd,
                kernels::View inp, kernels::View w, kernels::View b, kernels::View out_wide = {});
void ln_backward(const StepContext& s, kernels::View dinp, kernels::View dw, kernels::View db,
                 kernels::View dout, kernels::View inp, kernels::View w, kernels::View mean,
                 kernels::View rstd);
// A scratch record sized for several uses (scratch.grad16, scratch.sparse_output,
// scratch.linear_out) as a matrix of `like`'s shape, from its first elements.
kernels::View scratch_as(const StepContext& s, Rec r, kernels::View like);
// Layer l's attention probability dropout.
kernels::AttentionDropout attention_dropout(const StepContext& s, int layer);

// One layer: in, out: [T, C] as held (16 bits under a 16-bit precision); fills the record a (all
// fields; those the policy does not keep point to shared slots). out_wide, when given (the
// encoder's output under a 16-bit precision, which the heads read in the step's scalar), also
// receives the output in the scalar.
void encoder_layer_forward(const StepContext& s, int layer, const LayerView& w,
                           const LayerRecord& a, kernels::View in, kernels::View out,
                           kernels::View out_wide = {});
// dinp = d loss / d in (written over), given dout = d loss / d out and the record of the forward
// (rebuilding what the policy did not keep: GELU's output, LN1's output, the attention
// probabilities).
void encoder_layer_backward(const StepContext& s, int layer, const LayerView& w, const LayerView& g,
                            const LayerRecord& a, kernels::View in, kernels::View dout,
                            kernels::View dinp);

}  // namespace packbert::model
