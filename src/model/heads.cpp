#include "model/heads.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

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
  const View cls(s.ws.get(Rec::cls_in), n, C), pooled(s.ws.get(Rec::pooled), n, C);
  // each sequence's first token
  s.be.gather_rows_forward(cls, View(top, s.T_(), C), s.tokens.cu_seqlens.data());
  s.be.linear_forward(pooled, cls, View(p.pool_w, C, C), View::vector(p.pool_b, C), nullptr,
                      View());
  s.be.tanh_forward(pooled, pooled);
}

template <typename T, typename H>
void pooler_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                     T* dtop) {
  const int n = s.n_seq(), C = s.config.hidden_size;
  const View dpre(s.ws.get(Rec::dpre), n, C), dcls(s.ws.get(Rec::dcls), n, C);
  s.be.zero(dpre);
  s.be.tanh_backward(dpre, View(s.ws.get(Rec::pooled), n, C), View(s.ws.get(Rec::dpooled), n, C));
  s.be.zero(dcls);
  s.be.linear_backward(dcls, View(g.pool_w, C, C), View::vector(g.pool_b, C), dpre,
                       View(s.ws.get(Rec::cls_in), n, C), View(p.pool_w, C, C), nullptr,
                       GradWrite::accumulate, View());
  s.be.gather_rows_backward(View(dtop, s.T_(), C), dcls, s.tokens.cu_seqlens.data());
}

template <typename T, typename H>
void mlm_forward(const StepContext<T, H>& s, const ParamView<T>& p, const T* top, const H* top16,
                 Outputs& out) {
  const Workspace<T>& ws = s.ws;
  const Backend& be = s.be;
  const int M = static_cast<int>(s.tokens.mlm_token.size()), C = s.config.hidden_size,
            V = s.config.vocab_size, Tn = s.T_();
  const View t1(ws.get(Rec::mlm_t1), M, C), t2(ws.get(Rec::mlm_t2), M, C),
      logits(ws.get(Rec::mlm_logits), M, V), losses = View::vector(ws.get(Rec::head_losses), M),
                                             mean = View::vector(ws.get(Rec::mlm_mean), M),
                                             rstd = View::vector(ws.get(Rec::mlm_rstd), M);
  const View bias = View::vector(p.mlm_b, C), ln_w = View::vector(p.mlm_ln_w, C),
             ln_b = View::vector(p.mlm_ln_b, C);
  const double eps = s.config.layer_norm_eps;
  // The transform's input and the decoder's input are read only by GEMMs: 16-bit under a 16-bit
  // precision, with the LayerNorm's fp32 output in scratch.
  if (s.p16) {
    const View in16(ws.template get16<H>(Rec::mlm_in), M, C),
        t3_16(ws.template get16<H>(Rec::mlm_t3), M, C);
    be.gather_rows_forward(in16, View(top16, Tn, C), s.tokens.mlm_token.data());
    be.linear_forward(t1, in16, View(s.p16->mlm_w, C, C), bias, nullptr, View());
    be.gelu_forward(t2, t1);
    be.layernorm_forward(View(ws.get(Rec::tmp), M, C), mean, rstd, t2, ln_w, ln_b, eps, t3_16);
    be.linear_forward(logits, t3_16, View(s.p16->word, V, C), View::vector(p.mlm_bias, V), nullptr,
                      View());
  } else {
    const View in(ws.get(Rec::mlm_in), M, C), t3(ws.get(Rec::mlm_t3), M, C);
    be.gather_rows_forward(in, View(top, Tn, C), s.tokens.mlm_token.data());
    be.linear_forward(t1, in, View(p.mlm_w, C, C), bias, nullptr, View());
    be.gelu_forward(t2, t1);
    be.layernorm_forward(t3, mean, rstd, t2, ln_w, ln_b, eps, View());
    be.linear_forward(logits, t3, View(p.word, V, C), View::vector(p.mlm_bias, V), nullptr, View());
  }
  // The logits stay (no probability matrix): the backward forms the gradient from them.
  out.mlm_correct = be.cross_entropy_forward(losses, View::vector(ws.get(Rec::mlm_lse), M), logits,
                                             s.tokens.mlm_label.data());
  out.mlm_count = M;
  out.mlm_loss = mean_loss(losses.template as<const T>(), M, s.mlm_total ? s.mlm_total : M);
}

template <typename T, typename H>
void mlm_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                  const Outputs& out, T* dtop) {
  const Workspace<T>& ws = s.ws;
  const Backend& be = s.be;
  const int M = static_cast<int>(out.mlm_count), C = s.config.hidden_size, V = s.config.vocab_size;
  if (M == 0) return;
  const View d3(ws.get(Rec::mlm_d3), M, C), d2(ws.get(Rec::mlm_d2), M, C),
      d1(ws.get(Rec::mlm_d1), M, C), din(ws.get(Rec::mlm_din), M, C);
  const View dloss = View::vector(mean_dloss(s, M, s.mlm_total ? s.mlm_total : M), M);
  const View logits(ws.get(Rec::mlm_logits), M, V), lse = View::vector(ws.get(Rec::mlm_lse), M);
  const int32_t* labels = s.tokens.mlm_label.data();
  constexpr GradWrite over = GradWrite::overwrite;  // dlogits, d3, d2, d1, din written over
  // Under 16 bits the logits' gradient goes straight to its H form (the decoder's GEMM operand)
  // with the bias gradient in the same pass: no fp32 [M, V] gradient.
  if (s.p16) {
    const View dlogits16(ws.template get16<H>(Rec::dout16), M, V);
    be.cross_entropy_backward(dlogits16, View::vector(g.mlm_bias, V), logits, lse, labels, dloss,
                              over);
    be.linear_backward(d3, View(g.word, V, C), View(), dlogits16,
                       View(ws.template get16<H>(Rec::mlm_t3), M, C), View(s.p16->word, V, C),
                       nullptr, over, View());
  } else {
    const View dlogits(ws.get(Rec::mlm_dlogits), M, V);
    be.cross_entropy_backward(dlogits, View(), logits, lse, labels, dloss, over);
    be.linear_backward(d3, View(g.word, V, C), View::vector(g.mlm_bias, V), dlogits,
                       View(ws.get(Rec::mlm_t3), M, C), View(p.word, V, C), nullptr, over, View());
  }
  be.layernorm_backward(d2, View::vector(g.mlm_ln_w, C), View::vector(g.mlm_ln_b, C), d3,
                        View(ws.get(Rec::mlm_t2), M, C), View::vector(p.mlm_ln_w, C),
                        View::vector(ws.get(Rec::mlm_mean), M),
                        View::vector(ws.get(Rec::mlm_rstd), M), over);
  be.gelu_backward(d1, View(), View(ws.get(Rec::mlm_t1), M, C), d2, over);
  const View dW = View(g.mlm_w, C, C), db = View::vector(g.mlm_b, C);
  if (s.p16)
    be.linear_backward(din, dW, db, d1, View(ws.template get16<H>(Rec::mlm_in), M, C),
                       View(s.p16->mlm_w, C, C), nullptr, over,
                       View::vector(ws.template get16<H>(Rec::dout16), 0));
  else
    be.linear_backward(din, dW, db, d1, View(ws.get(Rec::mlm_in), M, C), View(p.mlm_w, C, C),
                       nullptr, over, View());
  be.gather_rows_backward(View(dtop, s.T_(), C), din, s.tokens.mlm_token.data());
}

namespace {

// A linear layer on n rows of C inputs with out outputs, then softmax cross-entropy: NSP's and
// the classifier's head. Returns the rows whose target is their first maximum; losses in
// scratch.head_losses.
template <typename T, typename H>
int64_t linear_cross_entropy_forward(const StepContext<T, H>& s, const T* in, const T* W,
                                     const T* b, Rec logits, Rec lse, const int32_t* targets, int n,
                                     int out) {
  const int C = s.config.hidden_size;
  const View z(s.ws.get(logits), n, out);
  s.be.linear_forward(z, View(in, n, C), View(W, out, C), View::vector(b, out), nullptr, View());
  return s.be.cross_entropy_forward(View::vector(s.ws.get(Rec::head_losses), n),
                                    View::vector(s.ws.get(lse), n), z, targets);
}

// Its backward over the mean of the losses of `count` rows: dz in scratch dlogits (written
// over), din += the input gradient.
template <typename T, typename H>
void linear_cross_entropy_backward(const StepContext<T, H>& s, const T* in, const T* W, T* dW,
                                   T* db, Rec logits, Rec lse, Rec dlogits, const int32_t* targets,
                                   int n, int out, int64_t count, T* din) {
  const int C = s.config.hidden_size;
  const View dz(s.ws.get(dlogits), n, out);
  s.be.cross_entropy_backward(dz, View(), View(s.ws.get(logits), n, out),
                              View::vector(s.ws.get(lse), n), targets,
                              View::vector(mean_dloss(s, n, count), n), GradWrite::overwrite);
  s.be.linear_backward(View(din, n, C), View(dW, out, C), View::vector(db, out), dz, View(in, n, C),
                       View(W, out, C), nullptr, GradWrite::accumulate, View());
}

}  // namespace

template <typename T, typename H>
void nsp_forward(const StepContext<T, H>& s, const ParamView<T>& p, const int32_t* targets,
                 Outputs& out) {
  const int n = s.n_seq();
  out.nsp_correct = linear_cross_entropy_forward(s, s.ws.get(Rec::pooled), p.nsp_w, p.nsp_b,
                                                 Rec::nsp_logits, Rec::nsp_lse, targets, n, 2);
  out.nsp_count = count_targets(targets, n);
  out.nsp_loss =
      mean_loss(s.ws.get(Rec::head_losses), n, s.nsp_total ? s.nsp_total : out.nsp_count);
}

template <typename T, typename H>
void nsp_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                  const int32_t* targets, const Outputs& out) {
  if (out.nsp_count == 0) return;
  linear_cross_entropy_backward(s, s.ws.get(Rec::pooled), p.nsp_w, g.nsp_w, g.nsp_b,
                                Rec::nsp_logits, Rec::nsp_lse, Rec::nsp_dlogits, targets, s.n_seq(),
                                2, s.nsp_total ? s.nsp_total : out.nsp_count,
                                s.ws.get(Rec::dpooled));
}

template <typename T, typename H>
void classifier_forward(const StepContext<T, H>& s, const ParamView<T>& p,
                        const ClassTargets<T>& targets, Outputs& out) {
  const int n = s.n_seq(), C = s.config.hidden_size;
  T* in = s.ws.get(Rec::cls_drop);
  dropout_site(s, in, s.ws.get(Rec::pooled), static_cast<int64_t>(n) * C, kNoLayer, kPooled);
  T* losses = s.ws.get(Rec::head_losses);
  if (s.config.regression()) {  // one output, squared error towards each sequence's value
    const View z(s.ws.get(Rec::cls_logits), n, 1);
    s.be.linear_forward(z, View(in, n, C), View(p.cls_w, 1, C), View::vector(p.cls_b, 1), nullptr,
                        View());
    s.be.squared_error_forward(View::vector(losses, n), View::vector(z.as<T>(), n),
                               View::vector(targets.values, n));
    out.cls_count = n;
  } else {
    out.cls_correct =
        linear_cross_entropy_forward(s, in, p.cls_w, p.cls_b, Rec::cls_logits, Rec::cls_lse,
                                     targets.labels, n, s.config.num_labels);
    out.cls_count = count_targets(targets.labels, n);
  }
  out.cls_loss = mean_loss(losses, n, s.cls_total ? s.cls_total : out.cls_count);
}

template <typename T, typename H>
void classifier_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                         const ClassTargets<T>& targets, const Outputs& out) {
  const int n = s.n_seq(), C = s.config.hidden_size;
  if (out.cls_count == 0) return;
  const int64_t nC = static_cast<int64_t>(n) * C;
  const int64_t count = s.cls_total ? s.cls_total : out.cls_count;
  T *din = s.ws.get(Rec::cls_ddrop), *dpooled = s.ws.get(Rec::dpooled);
  const T* in = s.ws.get(Rec::cls_drop);
  s.be.zero(View(din, n, C));
  if (s.config.regression()) {
    const View dz(s.ws.get(Rec::cls_dlogits), n, 1);
    s.be.zero(dz);
    s.be.squared_error_backward(
        View::vector(dz.as<T>(), n), View(), View::vector(s.ws.get(Rec::cls_logits), n),
        View::vector(targets.values, n), View::vector(mean_dloss(s, n, count), n));
    s.be.linear_backward(View(din, n, C), View(g.cls_w, 1, C), View::vector(g.cls_b, 1), dz,
                         View(in, n, C), View(p.cls_w, 1, C), nullptr, GradWrite::accumulate,
                         View());
  } else {
    linear_cross_entropy_backward(s, in, p.cls_w, g.cls_w, g.cls_b, Rec::cls_logits, Rec::cls_lse,
                                  Rec::cls_dlogits, targets.labels, n, s.config.num_labels, count,
                                  din);
  }
  if (s.p_hidden > 0)
    dropout_site_backward(s, dpooled, din, nC, kNoLayer, kPooled);
  else
    for (int64_t i = 0; i < nC; ++i) dpooled[i] += din[i];
}

template <typename T, typename H>
void span_forward(const StepContext<T, H>& s, const ParamView<T>& p, const T* top,
                  const int32_t* targets, Outputs& out) {
  const int n = s.n_seq(), Tn = s.T_(), C = s.config.hidden_size;
  const View logits(s.ws.get(Rec::span_logits), Tn, 2);
  T* losses = s.ws.get(Rec::head_losses);
  s.be.linear_forward(logits, View(top, Tn, C), View(p.span_w, 2, C), View::vector(p.span_b, 2),
                      nullptr, View());
  s.be.span_cross_entropy_forward(View::vector(losses, n), View(s.ws.get(Rec::span_probs), Tn, 2),
                                  logits, s.tokens.cu_seqlens.data(), targets, n);
  out.span_count = 0;
  for (int i = 0; i < n; ++i) out.span_count += targets[2 * i] >= 0;
  out.span_loss = mean_loss(losses, n, s.span_total ? s.span_total : out.span_count);
}

template <typename T, typename H>
void span_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                   const T* top, const int32_t* targets, const Outputs& out, T* dtop) {
  const int n = s.n_seq(), Tn = s.T_(), C = s.config.hidden_size;
  if (out.span_count == 0) return;
  const View dlogits(s.ws.get(Rec::span_dlogits), Tn, 2);
  s.be.zero(dlogits);
  s.be.span_cross_entropy_backward(
      dlogits, View(s.ws.get(Rec::span_probs), Tn, 2), s.tokens.cu_seqlens.data(), targets,
      View::vector(mean_dloss(s, n, s.span_total ? s.span_total : out.span_count), n), n);
  s.be.linear_backward(View(dtop, Tn, C), View(g.span_w, 2, C), View::vector(g.span_b, 2), dlogits,
                       View(top, Tn, C), View(p.span_w, 2, C), nullptr, GradWrite::accumulate,
                       View());
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
                                         const ClassTargets<T>&, Outputs&);                        \
  template void classifier_backward<T, H>(const StepContext<T, H>&, const ParamView<T>&,           \
                                          const ParamView<T>&, const ClassTargets<T>&,             \
                                          const Outputs&);                                         \
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
