#include "model/heads.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace packbert::model {

using namespace kernels;

namespace {

// The mean of the first n losses over the `count` rows that have a target.
double mean_loss(View losses, int n, int64_t count) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += losses.at(i);
  return count ? sum / static_cast<double>(count) : 0.0;
}

int64_t count_targets(const int32_t* targets, int n) {
  return std::count_if(targets, targets + n, [](int32_t y) { return y >= 0; });
}

// d loss_i = 1 / count for each row: the gradient of a mean (times the step's loss scale), as
// a vector of n.
View mean_dloss(const StepContext& s, int n, int64_t count) {
  const View d = s.ws.get(Rec::head_dloss).slice(0, n);
  for (int i = 0; i < n; ++i) d.put(i, s.loss_scale / static_cast<double>(count));
  return d;
}

// The first n of scratch.losses (sized for the longest of the heads' rows), as a vector: a head's
// per-row losses.
View head_losses(const StepContext& s, int n) {
  return s.ws.get(Rec::head_losses).slice(0, n);
}

}  // namespace

void pooler_forward(const StepContext& s, const ParamView& p, View top) {
  const View cls = s.ws.get(Rec::cls_in), pooled = s.ws.get(Rec::pooled);
  // each sequence's first token
  s.be.gather_rows_forward(cls, top, s.tokens.cu_seqlens.data());
  s.be.linear_forward(pooled, cls, p.pool_w, p.pool_b, nullptr, View());
  s.be.tanh_forward(pooled, pooled);
}

void pooler_backward(const StepContext& s, const ParamView& p, const ParamView& g, View dtop) {
  const View dpre = s.ws.get(Rec::dpre), dcls = s.ws.get(Rec::dcls);
  s.be.zero(dpre);
  s.be.tanh_backward(dpre, s.ws.get(Rec::pooled), s.ws.get(Rec::dpooled));
  s.be.zero(dcls);
  s.be.linear_backward(dcls, g.pool_w, g.pool_b, dpre, s.ws.get(Rec::cls_in), p.pool_w, nullptr,
                       GradWrite::accumulate, View());
  s.be.gather_rows_backward(dtop, dcls, s.tokens.cu_seqlens.data());
}

// The transform's input and the decoder's input are read only by GEMMs: held as the layers hold
// their records (16 bits under a 16-bit precision, with the LayerNorm's scalar output in
// scratch), multiplied with the weights in that form.
void mlm_forward(const StepContext& s, const ParamView& p, View top_held, Outputs& out) {
  const Workspace& ws = s.ws;
  const Backend& be = s.be;
  const int M = static_cast<int>(s.tokens.mlm_token.size());
  const View t1 = ws.get(Rec::mlm_t1), t2 = ws.get(Rec::mlm_t2), logits = ws.get(Rec::mlm_logits),
             losses = head_losses(s, M), mean = ws.get(Rec::mlm_mean), rstd = ws.get(Rec::mlm_rstd);
  const View in = ws.get(Rec::mlm_in), t3 = ws.get(Rec::mlm_t3);
  const ParamView& w = s.p16 ? *s.p16 : p;  // the GEMMs' weights
  be.gather_rows_forward(in, top_held, s.tokens.mlm_token.data());
  be.linear_forward(t1, in, w.mlm_w, p.mlm_b, nullptr, View());
  s.tick();
  be.gelu_forward(t2, t1);
  // (under 16 bits the LayerNorm's scalar output in scratch.linear_out, [T, C] room for [M, C])
  const auto [wide, t3_16] = wide_and_16(t3, scratch_as(s, Rec::tmp, t3));
  be.layernorm_forward(wide, mean, rstd, t2, p.mlm_ln_w, p.mlm_ln_b, s.config.layer_norm_eps,
                       t3_16);
  be.linear_forward(logits, t3, w.word, p.mlm_bias, nullptr, View());
  s.tick();
  // The logits stay (no probability matrix): the backward forms the gradient from them.
  out.mlm_correct =
      be.cross_entropy_forward(losses, ws.get(Rec::mlm_lse), logits, s.tokens.mlm_label.data());
  out.mlm_count = M;
  out.mlm_loss = mean_loss(losses, M, s.mlm_total ? s.mlm_total : M);
}

void mlm_backward(const StepContext& s, const ParamView& p, const ParamView& g, const Outputs& out,
                  View dtop) {
  const Workspace& ws = s.ws;
  const Backend& be = s.be;
  const int M = static_cast<int>(out.mlm_count);
  if (M == 0) return;
  const View d3 = ws.get(Rec::mlm_d3), d2 = ws.get(Rec::mlm_d2), d1 = ws.get(Rec::mlm_d1),
             din = ws.get(Rec::mlm_din);
  const View dloss = mean_dloss(s, M, s.mlm_total ? s.mlm_total : M);
  const View logits = ws.get(Rec::mlm_logits), lse = ws.get(Rec::mlm_lse);
  const View in = ws.get(Rec::mlm_in), t3 = ws.get(Rec::mlm_t3);
  const int32_t* labels = s.tokens.mlm_label.data();
  // (the word table's gradient: on a pipeline's last stage, the first stage's to form)
  const View decoder_dW = s.decoder_elsewhere ? View() : g.word;
  constexpr GradWrite over = GradWrite::overwrite;  // dlogits, d3, d2, d1, din written over
  // Under 16 bits the logits' gradient goes straight to its 16-bit form (the decoder's GEMM
  // operand) with the bias gradient in the same pass: no fp32 [M, V] gradient.
  if (s.p16) {
    const View dlogits16 = scratch_as(s, Rec::dout16, logits);
    be.cross_entropy_backward(dlogits16, g.mlm_bias, logits, lse, labels, dloss, over);
    be.linear_backward(d3, decoder_dW, View(), dlogits16, t3, s.p16->word, nullptr, over, View());
    s.tick();
  } else {
    const View dlogits = ws.get(Rec::mlm_dlogits);
    be.cross_entropy_backward(dlogits, View(), logits, lse, labels, dloss, over);
    be.linear_backward(d3, decoder_dW, g.mlm_bias, dlogits, t3, p.word, nullptr, over, View());
    s.tick();
  }
  be.layernorm_backward(d2, g.mlm_ln_w, g.mlm_ln_b, d3, ws.get(Rec::mlm_t2), p.mlm_ln_w,
                        ws.get(Rec::mlm_mean), ws.get(Rec::mlm_rstd), over);
  be.gelu_backward(d1, View(), ws.get(Rec::mlm_t1), d2, over);
  const View dW = g.mlm_w, db = g.mlm_b;
  if (s.p16)
    be.linear_backward(din, dW, db, d1, in, s.p16->mlm_w, nullptr, over, ws.get(Rec::dout16));
  else
    be.linear_backward(din, dW, db, d1, in, p.mlm_w, nullptr, over, View());
  be.gather_rows_backward(dtop, din, s.tokens.mlm_token.data());
}

namespace {

// A linear layer on the rows of in (one per sequence), then softmax cross-entropy: NSP's and the
// classifier's head. Returns the rows whose target is their first maximum; losses in
// scratch.head_losses.
int64_t linear_cross_entropy_forward(const StepContext& s, View in, View W, View b, Rec logits,
                                     Rec lse, const int32_t* targets) {
  const View z = s.ws.get(logits);
  s.be.linear_forward(z, in, W, b, nullptr, View());
  return s.be.cross_entropy_forward(head_losses(s, static_cast<int>(z.rows)), s.ws.get(lse), z,
                                    targets);
}

// Its backward over the mean of the losses of `count` rows: dz in scratch dlogits (written
// over), din += the input gradient.
void linear_cross_entropy_backward(const StepContext& s, View in, View W, View dW, View db,
                                   Rec logits, Rec lse, Rec dlogits, const int32_t* targets,
                                   int64_t count, View din) {
  const View dz = s.ws.get(dlogits);
  s.be.cross_entropy_backward(dz, View(), s.ws.get(logits), s.ws.get(lse), targets,
                              mean_dloss(s, static_cast<int>(dz.rows), count),
                              GradWrite::overwrite);
  s.be.linear_backward(din, dW, db, dz, in, W, nullptr, GradWrite::accumulate, View());
}

}  // namespace

void mlm_decoder_weight_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                                 const DecoderInput& d) {
  const Workspace& ws = s.ws;
  const Backend& be = s.be;
  const int M = static_cast<int>(s.tokens.mlm_token.size());
  if (M == 0) return;
  const View logits = ws.get(Rec::mlm_logits), lse = ws.get(Rec::mlm_lse);
  const View t3 = d.input;
  const int32_t* labels = s.tokens.mlm_label.data();
  const ParamView& w = s.p16 ? *s.p16 : p;
  be.linear_forward(logits, t3, w.word, d.bias, nullptr, View());
  s.tick();
  be.cross_entropy_forward(head_losses(s, M), lse, logits, labels);
  const View dloss = mean_dloss(s, M, s.mlm_total ? s.mlm_total : M);
  const View dlogits = s.p16 ? scratch_as(s, Rec::dout16, logits) : ws.get(Rec::mlm_dlogits);
  be.cross_entropy_backward(dlogits, View(), logits, lse, labels, dloss, GradWrite::overwrite);
  be.linear_backward(View(), g.word, View(), dlogits, t3, w.word, nullptr, GradWrite::accumulate,
                     View());
}

void nsp_forward(const StepContext& s, const ParamView& p, const int32_t* targets, Outputs& out) {
  const int n = s.n_seq();
  out.nsp_correct = linear_cross_entropy_forward(s, s.ws.get(Rec::pooled), p.nsp_w, p.nsp_b,
                                                 Rec::nsp_logits, Rec::nsp_lse, targets);
  out.nsp_count = count_targets(targets, n);
  out.nsp_loss =
      mean_loss(s.ws.get(Rec::head_losses), n, s.nsp_total ? s.nsp_total : out.nsp_count);
}

void nsp_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                  const int32_t* targets, const Outputs& out) {
  if (out.nsp_count == 0) return;
  linear_cross_entropy_backward(s, s.ws.get(Rec::pooled), p.nsp_w, g.nsp_w, g.nsp_b,
                                Rec::nsp_logits, Rec::nsp_lse, Rec::nsp_dlogits, targets,
                                s.nsp_total ? s.nsp_total : out.nsp_count, s.ws.get(Rec::dpooled));
}

void classifier_forward(const StepContext& s, const ParamView& p, View pooled,
                        const ClassTargets& targets, Outputs& out) {
  const int n = s.n_seq();
  const View in = s.ws.get(Rec::cls_drop);
  dropout_site(s, in, pooled, kNoLayer, kPooled);
  const View losses = head_losses(s, n);
  if (s.config.regression()) {  // one output, squared error towards each sequence's value
    const View z = s.ws.get(Rec::cls_logits);  // [n, 1]
    s.be.linear_forward(z, in, p.cls_w, p.cls_b, nullptr, View());
    s.be.squared_error_forward(losses, z, targets.values);
    out.cls_count = n;
  } else {
    out.cls_correct = linear_cross_entropy_forward(s, in, p.cls_w, p.cls_b, Rec::cls_logits,
                                                   Rec::cls_lse, targets.labels);
    out.cls_count = count_targets(targets.labels, n);
  }
  out.cls_loss = mean_loss(losses, n, s.cls_total ? s.cls_total : out.cls_count);
}

void classifier_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                         const ClassTargets& targets, const Outputs& out, View dpooled) {
  const int n = s.n_seq();
  if (out.cls_count == 0) return;
  const int64_t count = s.cls_total ? s.cls_total : out.cls_count;
  const View din = s.ws.get(Rec::cls_ddrop);
  const View in = s.ws.get(Rec::cls_drop);
  s.be.zero(din);
  if (s.config.regression()) {
    const View dz = s.ws.get(Rec::cls_dlogits);
    s.be.zero(dz);
    s.be.squared_error_backward(dz, View(), s.ws.get(Rec::cls_logits), targets.values,
                                mean_dloss(s, n, count));
    s.be.linear_backward(din, g.cls_w, g.cls_b, dz, in, p.cls_w, nullptr, GradWrite::accumulate,
                         View());
  } else {
    linear_cross_entropy_backward(s, in, p.cls_w, g.cls_w, g.cls_b, Rec::cls_logits, Rec::cls_lse,
                                  Rec::cls_dlogits, targets.labels, count, din);
  }
  if (s.p_hidden > 0)
    dropout_site_backward(s, dpooled, din, kNoLayer, kPooled);
  else  // dpooled += din
    s.be.residual_forward(dpooled, dpooled, din);
}

void span_forward(const StepContext& s, const ParamView& p, View top, const int32_t* targets,
                  Outputs& out) {
  const int n = s.n_seq();
  const View logits = s.ws.get(Rec::span_logits);
  const View losses = head_losses(s, n);
  s.be.linear_forward(logits, top, p.span_w, p.span_b, nullptr, View());
  s.be.span_cross_entropy_forward(losses, s.ws.get(Rec::span_probs), logits,
                                  s.tokens.cu_seqlens.data(), targets, n);
  out.span_count = 0;
  for (int i = 0; i < n; ++i) out.span_count += targets[2 * i] >= 0;
  out.span_loss = mean_loss(losses, n, s.span_total ? s.span_total : out.span_count);
}

void span_backward(const StepContext& s, const ParamView& p, const ParamView& g, View top,
                   const int32_t* targets, const Outputs& out, View dtop) {
  const int n = s.n_seq();
  if (out.span_count == 0) return;
  const View dlogits = s.ws.get(Rec::span_dlogits);
  s.be.zero(dlogits);
  s.be.span_cross_entropy_backward(
      dlogits, s.ws.get(Rec::span_probs), s.tokens.cu_seqlens.data(), targets,
      mean_dloss(s, n, s.span_total ? s.span_total : out.span_count), n);
  s.be.linear_backward(dtop, g.span_w, g.span_b, dlogits, top, p.span_w, nullptr,
                       GradWrite::accumulate, View());
}

}  // namespace packbert::model
