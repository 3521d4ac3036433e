#include "model/heads.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/dropout.h"
#include "kernels/layers.h"
#include "model/bert.h"

namespace packbert::model {

using namespace kernels;

namespace {

// The mean of the first n losses over the `count` rows that have a target.
template <typename T>
double mean_loss(const T* losses, int n, int64_t count) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += losses[i];
  return count ? sum / static_cast<double>(count) : 0.0;
}

int64_t count_targets(const int32_t* targets, int n) {
  return std::count_if(targets, targets + n, [](int32_t y) { return y >= 0; });
}

// d loss_i = 1 / count for each row: the gradient of a mean (times the step's loss scale).
template <typename T, typename H>
T* mean_dloss(const StepContext<T, H>& s, int n, int64_t count) {
  T* d = s.ws.get(Rec::head_dloss);
  std::fill(d, d + n, static_cast<T>(s.loss_scale / static_cast<double>(count)));
  return d;
}

}  // namespace

template <typename T, typename H>
void pooler_forward(const StepContext<T, H>& s, const ParamView<T>& p, const T* top) {
  const int n = s.n_seq(), C = s.config.hidden_size;
  T *cls = s.ws.get(Rec::cls_in), *pooled = s.ws.get(Rec::pooled);
  gather_rows_forward(cls, top, s.tokens.cu_seqlens.data(), n, C);  // each sequence's first token
  linear_forward(pooled, cls, p.pool_w, p.pool_b, n, C, C);
  tanh_forward(pooled, pooled, static_cast<int64_t>(n) * C);
}

template <typename T, typename H>
void pooler_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                     T* dtop) {
  const int n = s.n_seq(), C = s.config.hidden_size;
  const int64_t nC = static_cast<int64_t>(n) * C;
  T *dpre = s.ws.get(Rec::dpre), *dcls = s.ws.get(Rec::dcls);
  zero_fill(dpre, nC);
  tanh_backward(dpre, s.ws.get(Rec::pooled), s.ws.get(Rec::dpooled), nC);
  zero_fill(dcls, nC);
  linear_backward(dcls, g.pool_w, g.pool_b, dpre, s.ws.get(Rec::cls_in), p.pool_w, n, C, C);
  gather_rows_backward(dtop, dcls, s.tokens.cu_seqlens.data(), n, C);
}

template <typename T, typename H>
void mlm_forward(const StepContext<T, H>& s, const ParamView<T>& p, const T* top, const H* top16,
                 Outputs& out) {
  const Workspace<T>& ws = s.ws;
  const int M = static_cast<int>(s.tokens.mlm_token.size()), C = s.config.hidden_size,
            V = s.config.vocab_size;
  const int32_t* labels = s.tokens.mlm_label.data();
  T *t1 = ws.get(Rec::mlm_t1), *t2 = ws.get(Rec::mlm_t2), *logits = ws.get(Rec::mlm_logits),
    *losses = ws.get(Rec::head_losses);
  const T eps = static_cast<T>(s.config.layer_norm_eps);
  // The transform's input and the decoder's input are read only by GEMMs: 16-bit under a 16-bit
  // precision, with the LayerNorm's fp32 output in scratch.
  if constexpr (std::is_same_v<T, float>) {
    if (s.p16) {
      H *in16 = ws.template get16<H>(Rec::mlm_in), *t3_16 = ws.template get16<H>(Rec::mlm_t3);
      gather_rows_forward(in16, top16, s.tokens.mlm_token.data(), M, C);
      linear_forward(t1, in16, s.p16->mlm_w, p.mlm_b, M, C, C);
      gelu_forward(t2, t1, static_cast<int64_t>(M) * C);
      layernorm_forward(ws.get(Rec::tmp), ws.get(Rec::mlm_mean), ws.get(Rec::mlm_rstd), t2,
                        p.mlm_ln_w, p.mlm_ln_b, M, C, eps, t3_16);
      linear_forward(logits, t3_16, s.p16->word, p.mlm_bias, M, C, V);
    }
  }
  if (!s.p16) {
    T *in = ws.get(Rec::mlm_in), *t3 = ws.get(Rec::mlm_t3);
    gather_rows_forward(in, top, s.tokens.mlm_token.data(), M, C);
    linear_forward(t1, in, p.mlm_w, p.mlm_b, M, C, C);
    gelu_forward(t2, t1, static_cast<int64_t>(M) * C);
    layernorm_forward(t3, ws.get(Rec::mlm_mean), ws.get(Rec::mlm_rstd), t2, p.mlm_ln_w, p.mlm_ln_b,
                      M, C, eps);
    linear_forward(logits, t3, p.word, p.mlm_bias, M, C, V);
  }
  // The logits stay (no probability matrix): the backward forms the gradient from them.
  out.mlm_correct =
      cross_entropy_logits_forward(losses, ws.get(Rec::mlm_lse), logits, labels, M, V);
  out.mlm_count = M;
  out.mlm_loss = mean_loss(losses, M, s.mlm_total ? s.mlm_total : M);
}

template <typename T, typename H>
void mlm_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                  const Outputs& out, T* dtop) {
  const Workspace<T>& ws = s.ws;
  const int M = static_cast<int>(out.mlm_count), C = s.config.hidden_size, V = s.config.vocab_size;
  if (M == 0) return;
  const int64_t MC = static_cast<int64_t>(M) * C;
  T *d3 = ws.get(Rec::mlm_d3), *d2 = ws.get(Rec::mlm_d2), *d1 = ws.get(Rec::mlm_d1),
    *din = ws.get(Rec::mlm_din);
  const T* dloss = mean_dloss(s, M, s.mlm_total ? s.mlm_total : M);
  constexpr GradWrite over = GradWrite::overwrite;  // dlogits, d3, d2, d1, din written over
  // Under 16 bits the logits' gradient goes straight to its H form (the decoder's GEMM operand)
  // with the bias gradient in the same pass: no fp32 [M, V] gradient.
  if constexpr (std::is_same_v<T, float>) {
    if (s.p16) {
      H* dlogits16 = ws.template get16<H>(Rec::dout16);
      cross_entropy_logits_backward(dlogits16, g.mlm_bias, ws.get(Rec::mlm_logits),
                                    ws.get(Rec::mlm_lse), s.tokens.mlm_label.data(), dloss, M, V);
      linear_backward(d3, g.word, dlogits16, ws.template get16<H>(Rec::mlm_t3), s.p16->word, M, C,
                      V, over);
    }
  }
  if (!s.p16) {
    T* dlogits = ws.get(Rec::mlm_dlogits);
    cross_entropy_logits_backward(dlogits, ws.get(Rec::mlm_logits), ws.get(Rec::mlm_lse),
                                  s.tokens.mlm_label.data(), dloss, M, V, over);
    linear_backward(d3, g.word, g.mlm_bias, dlogits, ws.get(Rec::mlm_t3), p.word, M, C, V, over);
  }
  layernorm_backward(d2, g.mlm_ln_w, g.mlm_ln_b, d3, ws.get(Rec::mlm_t2), p.mlm_ln_w,
                     ws.get(Rec::mlm_mean), ws.get(Rec::mlm_rstd), M, C, over);
  gelu_backward(d1, ws.get(Rec::mlm_t1), d2, MC, over);
  if constexpr (std::is_same_v<T, float>) {
    if (s.p16)
      linear_backward(din, g.mlm_w, g.mlm_b, d1, ws.template get16<H>(Rec::dout16),
                      ws.template get16<H>(Rec::mlm_in), s.p16->mlm_w, M, C, C, over);
  }
  if (!s.p16)
    linear_backward(din, g.mlm_w, g.mlm_b, d1, ws.get(Rec::mlm_in), p.mlm_w, M, C, C, over);
  gather_rows_backward(dtop, din, s.tokens.mlm_token.data(), M, C);
}

template <typename T, typename H>
void nsp_forward(const StepContext<T, H>& s, const ParamView<T>& p, const int32_t* targets,
                 Outputs& out) {
  const int n = s.n_seq(), C = s.config.hidden_size;
  T *logits = s.ws.get(Rec::nsp_logits), *losses = s.ws.get(Rec::head_losses);
  linear_forward(logits, s.ws.get(Rec::pooled), p.nsp_w, p.nsp_b, n, C, 2);
  out.nsp_correct =
      cross_entropy_logits_forward(losses, s.ws.get(Rec::nsp_lse), logits, targets, n, 2);
  out.nsp_count = count_targets(targets, n);
  out.nsp_loss = mean_loss(losses, n, s.nsp_total ? s.nsp_total : out.nsp_count);
}

template <typename T, typename H>
void nsp_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                  const int32_t* targets, const Outputs& out) {
  const int n = s.n_seq(), C = s.config.hidden_size;
  if (out.nsp_count == 0) return;
  T* dlogits = s.ws.get(Rec::nsp_dlogits);
  cross_entropy_logits_backward(dlogits, s.ws.get(Rec::nsp_logits), s.ws.get(Rec::nsp_lse), targets,
                                mean_dloss(s, n, s.nsp_total ? s.nsp_total : out.nsp_count), n, 2,
                                GradWrite::overwrite);
  linear_backward(s.ws.get(Rec::dpooled), g.nsp_w, g.nsp_b, dlogits, s.ws.get(Rec::pooled), p.nsp_w,
                  n, C, 2);
}

template <typename T, typename H>
void classifier_forward(const StepContext<T, H>& s, const ParamView<T>& p, const int32_t* targets,
                        Outputs& out) {
  const int n = s.n_seq(), C = s.config.hidden_size, NL = s.config.num_labels;
  T *in = s.ws.get(Rec::cls_drop), *logits = s.ws.get(Rec::cls_logits),
    *losses = s.ws.get(Rec::head_losses);
  const T* pooled = s.ws.get(Rec::pooled);
  const int64_t nC = static_cast<int64_t>(n) * C;
  dropout_site(s, in, pooled, nC, kNoLayer, kPooled);
  linear_forward(logits, in, p.cls_w, p.cls_b, n, C, NL);
  out.cls_correct =
      cross_entropy_logits_forward(losses, s.ws.get(Rec::cls_lse), logits, targets, n, NL);
  out.cls_count = count_targets(targets, n);
  out.cls_loss = mean_loss(losses, n, s.cls_total ? s.cls_total : out.cls_count);
}

template <typename T, typename H>
void classifier_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                         const int32_t* targets, const Outputs& out) {
  const int n = s.n_seq(), C = s.config.hidden_size, NL = s.config.num_labels;
  if (out.cls_count == 0) return;
  const int64_t nC = static_cast<int64_t>(n) * C;
  T *dlogits = s.ws.get(Rec::cls_dlogits), *din = s.ws.get(Rec::cls_ddrop),
    *dpooled = s.ws.get(Rec::dpooled);
  cross_entropy_logits_backward(dlogits, s.ws.get(Rec::cls_logits), s.ws.get(Rec::cls_lse), targets,
                                mean_dloss(s, n, s.cls_total ? s.cls_total : out.cls_count), n, NL,
                                GradWrite::overwrite);
  zero_fill(din, nC);
  linear_backward(din, g.cls_w, g.cls_b, dlogits, s.ws.get(Rec::cls_drop), p.cls_w, n, C, NL);
  if (s.p_hidden > 0)
    dropout_site_backward(s, dpooled, din, nC, kNoLayer, kPooled);
  else
    for (int64_t i = 0; i < nC; ++i) dpooled[i] += din[i];
}

template <typename T, typename H>
void span_forward(const StepContext<T, H>& s, const ParamView<T>& p, const T* top,
                  const int32_t* targets, Outputs& out) {
  const int n = s.n_seq(), Tn = s.T_(), C = s.config.hidden_size;
  T *logits = s.ws.get(Rec::span_logits), *probs = s.ws.get(Rec::span_probs),
    *losses = s.ws.get(Rec::head_losses);
  linear_forward(logits, top, p.span_w, p.span_b, Tn, C, 2);
  span_cross_entropy_forward(losses, probs, logits, s.tokens.cu_seqlens.data(), targets, n);
  out.span_count = 0;
  for (int i = 0; i < n; ++i) out.span_count += targets[2 * i] >= 0;
  out.span_loss = mean_loss(losses, n, s.span_total ? s.span_total : out.span_count);
}

template <typename T, typename H>
void span_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                   const T* top, const int32_t* targets, const Outputs& out, T* dtop) {
  const int n = s.n_seq(), Tn = s.T_(), C = s.config.hidden_size;
  if (out.span_count == 0) return;
  T* dlogits = s.ws.get(Rec::span_dlogits);
  zero_fill(dlogits, 2 * static_cast<int64_t>(Tn));
  span_cross_entropy_backward(dlogits, s.ws.get(Rec::span_probs), s.tokens.cu_seqlens.data(),
                              targets,
                              mean_dloss(s, n, s.span_total ? s.span_total : out.span_count), n);
  linear_backward(dtop, g.span_w, g.span_b, dlogits, top, p.span_w, Tn, C, 2);
}

#define PACKBERT_INSTANTIATE(T, H)                                                                 \
  template void pooler_forward<T, H>(const StepContext<T, H>&, const ParamView<T>&, const T*);     \
  template void pooler_backward<T, H>(const StepContext<T, H>&, const ParamView<T>&,               \
                                      const ParamView<T>&, T*);                                    \
  template void mlm_forward<T, H>(const StepContext<T, H>&, const ParamView<T>&, const T*,         \
                                  const H*, Outputs&);                                             \
  template void mlm_backward<T, H>(const StepContext<T, H>&, const ParamView<T>&,                  \
                                   const ParamView<T>&, const Outputs&, T*);                       \
  template void nsp_forward<T, H>(const StepContext<T, H>&, const ParamView<T>&, const int32_t*,   \
                                  Outputs&);                                                       \
  template void nsp_backward<T, H>(const StepContext<T, H>&, const ParamView<T>&,                  \
                                   const ParamView<T>&, const int32_t*, const Outputs&);           \
  template void classifier_forward<T, H>(const StepContext<T, H>&, const ParamView<T>&,            \
                                         const int32_t*, Outputs&);                                \
  template void classifier_backward<T, H>(const StepContext<T, H>&, const ParamView<T>&,           \
                                          const ParamView<T>&, const int32_t*, const Outputs&);    \
  template void span_forward<T, H>(const StepContext<T, H>&, const ParamView<T>&, const T*,        \
                                   const int32_t*, Outputs&);                                      \
  template void span_backward<T, H>(const StepContext<T, H>&, const ParamView<T>&,                 \
                                    const ParamView<T>&, const T*, const int32_t*, const Outputs&, \
                                    T*);
PACKBERT_INSTANTIATE(float, bf16)
PACKBERT_INSTANTIATE(float, f16)
PACKBERT_INSTANTIATE(double, bf16)
#undef PACKBERT_INSTANTIATE

}  // namespace packbert::model
