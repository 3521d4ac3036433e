// The heads on top of the encoder, each forward next to its backward: the pooler on each
// sequence's [CLS], MLM (transform, GELU, LayerNorm, decoder tied to the word embeddings) on the
// masked tokens, NSP and sequence classification on the pooled [CLS], span start/end logits per
// token. Forwards add their loss terms to Outputs (conventions in model/bert.h); backwards
// accumulate into parameter gradients and into dtop [T, C] / dpooled [n_seq, C].
#pragma once

#include "model/encoder_layer.h"
#include "model/step.h"

namespace packbert::model {

template <typename T, typename H>
void pooler_forward(const StepContext<T, H>& s, const ParamView<T>& p, const T* top);
template <typename T, typename H>
void pooler_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                     T* dtop);

template <typename T, typename H>
// top16: the 16-bit twin of top under a 16-bit precision (null under fp32).
void mlm_forward(const StepContext<T, H>& s, const ParamView<T>& p, const T* top, const H* top16,
                 Outputs& out);
template <typename T, typename H>
void mlm_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                  const Outputs& out, T* dtop);

// targets: [n_seq] NSP labels (< 0 = none).
template <typename T, typename H>
void nsp_forward(const StepContext<T, H>& s, const ParamView<T>& p, const int32_t* targets,
                 Outputs& out);
template <typename T, typename H>
void nsp_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                  const int32_t* targets, const Outputs& out);

// The classifier's targets: class labels [n_seq] (< 0 = none), or under a regression head
// (config.regression(): one output, squared error) the values [n_seq] it is trained towards.
template <typename T>
struct ClassTargets {
  const int32_t* labels = nullptr;
  const T* values = nullptr;
};
template <typename T, typename H>
void classifier_forward(const StepContext<T, H>& s, const ParamView<T>& p,
                        const ClassTargets<T>& targets, Outputs& out);
template <typename T, typename H>
void classifier_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                         const ClassTargets<T>& targets, const Outputs& out);

// targets: [n_seq, 2] (start, end) within each sequence (< 0 = none; checked < length).
template <typename T, typename H>
void span_forward(const StepContext<T, H>& s, const ParamView<T>& p, const T* top,
                  const int32_t* targets, Outputs& out);
template <typename T, typename H>
void span_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                   const T* top, const int32_t* targets, const Outputs& out, T* dtop);

}  // namespace packbert::model
