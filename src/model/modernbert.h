// ModernBERT's layer recipe (transformers' modeling_modernbert.py) over the step's workspace, each
// forward next to its backward, as model/encoder_layer.h does for BERT:
//   embeddings   x = norm(word[ids])                                   (no positions, no types)
//   layer l      a = attn_norm(x) (layer 0: x itself); q | k | v = a . Wqkv^T;
//                q, k rotated by each token's position inside its own sequence (theta: global or
//                local); x += attention(q, k, v; layer l's window) . Wo^T;
//                x += GeGLU(mlp_norm(x) . Wi^T) . Wo^T
//   encoder top  final_norm(x), which the heads read.
// Norms and linears carry a bias only where the config says (norm_bias, attention_bias,
// mlp_bias). Backward functions accumulate (+=) into parameter gradients and write the input's
// gradient over.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"
#include "model/encoder_layer.h"
#include "model/heads.h"

namespace packbert::model {

// out = norm(word[ids]) [T, C] in the step's scalar; keeps the gathered rows and the norm's
// statistics (Rec::emb_*).
void modernbert_embeddings_forward(const StepContext& s, const ParamView& p, const int32_t* ids,
                                   kernels::View out);
// dword, when given, takes the word table's gradient in place of g.word (ids then index it).
void modernbert_embeddings_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                                    const int32_t* ids, kernels::View dout,
                                    kernels::View dword = {});

// One pre-LN layer: in, out [T, C] as held (16 bits under a 16-bit precision); fills the record
// (LayerRecord's ModernBERT fields).
void modernbert_layer_forward(const StepContext& s, int layer, const LayerView& w,
                              const LayerRecord& a, kernels::View in, kernels::View out);
// dinp = d loss / d in (written over) from dout = d loss / d out, rebuilding what the policy did
// not keep (the norms' outputs, the GeGLU's output, the first residual sum, the probabilities).
void modernbert_layer_backward(const StepContext& s, int layer, const LayerView& w,
                               const LayerView& g, const LayerRecord& a, kernels::View in,
                               kernels::View dout, kernels::View dinp);

// The final norm of the encoder's output x [T, C] as held into Rec::final_out (the scalar) and,
// under a 16-bit precision, Rec::final16. Returns what the MLM head reads (the GEMM operand).
kernels::View final_norm_forward(const StepContext& s, const ParamView& p, kernels::View x);
// dx = d loss / d x (written over) from dtop = d loss / d final_out.
void final_norm_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                         kernels::View x, kernels::View dtop, kernels::View dx);

// The task heads on the final norm's output `top` [T, C] (the scalar): a sequence classifier
// (each sequence's first token, or the mean of its tokens, as classifier_pooling says, through
// the prediction head's dense, GELU and norm, then the classifier: model/heads.h's) and the span
// head (the prediction head on every token, then the two-output classifier). Backward adds the
// gradient of top into dtop.
void modernbert_classifier_forward(const StepContext& s, const ParamView& p, kernels::View top,
                                   const ClassTargets& targets, Outputs& out);
void modernbert_classifier_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                                    const ClassTargets& targets, const Outputs& out,
                                    kernels::View dtop);
void modernbert_span_forward(const StepContext& s, const ParamView& p, kernels::View top,
                             const int32_t* targets, Outputs& out);
void modernbert_span_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                              kernels::View top, const int32_t* targets, const Outputs& out,
                              kernels::View dtop);

}  // namespace packbert::model
