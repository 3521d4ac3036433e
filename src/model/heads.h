// The heads on top of the encoder, each forward next to its backward: the pooler on each
// sequence's [CLS], MLM (transform, GELU, LayerNorm, decoder tied to the word embeddings) on the
// masked tokens, NSP and sequence classification on the pooled [CLS], span start/end logits per
// token. Forwards add their loss terms to Outputs (conventions in model/bert.h); backwards
// accumulate into parameter gradients and into dtop [T, C] / dpooled [n_seq, C].
#pragma once

#include "model/encoder_layer.h"
#include "model/step.h"

namespace packbert::model {

// top: the encoder's output [T, C] in the step's scalar; dtop [T, C] likewise.
void pooler_forward(const StepContext& s, const ParamView& p, kernels::View top);
void pooler_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                     kernels::View dtop);

// top_held: the encoder's output as the layers hold it (16 bits under a 16-bit precision: the
// transform's GEMM operand; the scalar top under fp32).
void mlm_forward(const StepContext& s, const ParamView& p, kernels::View top_held, Outputs& out);
void mlm_backward(const StepContext& s, const ParamView& p, const ParamView& g, const Outputs& out,
                  kernels::View dtop);

// A pipeline's first stage: the MLM decoder's share of the tied word table's gradient, added into
// g.word, from the last stage's decoder input and bias. The logits, their log-sum-exp and their
// gradient are formed again as mlm_forward and mlm_backward form them (the same kernels on the
// same operands, so the same bits), then the weight's product alone. Needs the MLM head's
// records in the workspace (ParamLayout::workspace_heads).
void mlm_decoder_weight_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                                 const DecoderInput& d);

// targets: [n_seq] NSP labels (< 0 = none).
void nsp_forward(const StepContext& s, const ParamView& p, const int32_t* targets, Outputs& out);
void nsp_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                  const int32_t* targets, const Outputs& out);

// The classifier's targets: class labels [n_seq] (< 0 = none), or under a regression head
// (config.regression(): one output, squared error) the values [n_seq] it is trained towards, in
// the step's scalar.
struct ClassTargets {
  const int32_t* labels = nullptr;
  kernels::View values;
};
// pooled: the classifier's input [n_seq, C] (BERT's pooler output, ModernBERT's head output);
// backward adds its gradient into dpooled.
void classifier_forward(const StepContext& s, const ParamView& p, kernels::View pooled,
                        const ClassTargets& targets, Outputs& out);
void classifier_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                         const ClassTargets& targets, const Outputs& out, kernels::View dpooled);

// targets: [n_seq, 2] (start, end) within each sequence (< 0 = none; checked < length).
void span_forward(const StepContext& s, const ParamView& p, kernels::View top,
                  const int32_t* targets, Outputs& out);
void span_backward(const StepContext& s, const ParamView& p, const ParamView& g, kernels::View top,
                   const int32_t* targets, const Outputs& out, kernels::View dtop);

}  // namespace packbert::model
