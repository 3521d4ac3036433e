#include "model/modernbert.h"

#include "kernels/ops.h"

namespace packbert::model {

using namespace kernels;

void modernbert_embeddings_forward(const StepContext& s, const ParamView& p, const int32_t* ids,
                                   View out) {
  const BertConfig& c = s.config;
  const int Tn = s.T_(), C = c.hidden_size;
  const View sum = s.ws.get(Rec::emb_sum).shaped(Tn, C);
  // (under 16-bit master weights the word table is kept in 16 bits only)
  s.be.gather_rows_forward(sum, (p.word ? p.word : s.p16->word).shaped(c.vocab_size, C), ids);
  ln_forward(s, out.shaped(Tn, C), s.ws.get(Rec::emb_mean), s.ws.get(Rec::emb_rstd), sum,
             p.emb_ln_w, p.emb_ln_b, Tn, C);
}

void modernbert_embeddings_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                                    const int32_t* ids, View dout, View dword) {
  const BertConfig& c = s.config;
  const int Tn = s.T_(), C = c.hidden_size;
  const View dsum = s.ws.get(Rec::dres).shaped(Tn, C);
  ln_backward(s, dsum, g.emb_ln_w, g.emb_ln_b, dout, s.ws.get(Rec::emb_sum), p.emb_ln_w,
              s.ws.get(Rec::emb_mean), s.ws.get(Rec::emb_rstd), Tn, C);
  s.be.gather_rows_backward(dword ? dword : g.word.shaped(c.vocab_size, C), dsum, ids);
}

namespace {

// q | k inside q | k | v [T, 3C]: the rows' first 2C columns, strided.
View queries_and_keys(View qkv, int Tn, int C) {
  View qk = qkv.shaped(Tn, 3 * C);
  qk.cols = 2 * C;
  return qk;
}

View probs_of(const StepContext& s, int layer, const LayerRecord& a) {
  return a.probs.shaped(1, s.offsets(layer)[s.n_seq()]);
}

// The attention block's residual sum r1 = in + attention(...) . Wo^T (+ b), from the attention
// output as held.
void attention_residual(const StepContext& s, int layer, const LayerView& w, const LayerRecord& a,
                        View in) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  const View tmp = s.ws.get(Rec::tmp).shaped(Tn, C);
  linear(s, nullptr, tmp, a.att, w.attn_out_w, weight16(s, layer, &LayerView::attn_out_w),
         w.attn_out_b, Tn, C, C);
  s.be.residual_forward(a.r1.shaped(Tn, C), tmp, in.shaped(Tn, C));
}

}  // namespace

void modernbert_layer_forward(const StepContext& s, int layer, const LayerView& w,
                              const LayerRecord& a, View in, View out) {
  const BertConfig& c = s.config;
  const int Tn = s.T_(), C = c.hidden_size, I = c.intermediate_size, NH = c.num_attention_heads;
  auto W16 = [&](View LayerView::*field) { return weight16(s, layer, field); };
  const View tmp = s.ws.get(Rec::tmp).shaped(Tn, C);

  View x = in;  // the attention's input: layer 0's is the embeddings' norm itself
  if (w.ln1_w) {
    ln_forward(s, a.attn_in, a.ln1_mean, a.ln1_rstd, in, w.ln1_w, w.ln1_b, Tn, C);
    x = a.attn_in;
  }
  const View qkv = a.qkv.shaped(Tn, 3 * C);
  linear(s, nullptr, qkv, x, w.qkv_w, W16(&LayerView::qkv_w), w.qkv_b, Tn, C, 3 * C);
  const View qk = queries_and_keys(qkv, Tn, C);
  s.be.rotary_forward(qk, qk, s.positions, 2 * NH, c.modern.rope_theta(layer));
  s.tick();
  s.be.attention_forward(a.att.shaped(Tn, C), probs_of(s, layer, a), qkv,
                         s.tokens.cu_seqlens.data(), s.n_seq(), NH, s.window(layer),
                         attention_dropout(s, layer), s.offsets(layer), s.ws.get(Rec::attn_work));
  s.tick();
  attention_residual(s, layer, w, a, in);
  ln_forward(s, a.h1, a.ln2_mean, a.ln2_rstd, a.r1, w.ln2_w, w.ln2_b, Tn, C);
  linear(s, nullptr, a.inter.shaped(Tn, 2 * I), a.h1, w.inter_w, W16(&LayerView::inter_w),
         w.inter_b, Tn, C, 2 * I);
  s.tick();
  s.be.geglu_forward(a.gelu.shaped(Tn, I), a.inter.shaped(Tn, 2 * I));
  linear(s, nullptr, tmp, a.gelu, w.out_w, W16(&LayerView::out_w), w.out_b, Tn, I, C);
  s.be.residual_forward(out.shaped(Tn, C), tmp, a.r1.shaped(Tn, C));
  s.tick();
}

void modernbert_layer_backward(const StepContext& s, int layer, const LayerView& w,
                               const LayerView& g, const LayerRecord& a, View in, View dout,
                               View dinp) {
  const BertConfig& c = s.config;
  const int Tn = s.T_(), C = c.hidden_size, I = c.intermediate_size, NH = c.num_attention_heads;
  const Workspace& ws = s.ws;
  auto W16 = [&](View LayerView::*field) { return weight16(s, layer, field); };
  constexpr GradWrite over = GradWrite::overwrite;

  // Rebuild what the policy did not keep (the same kernels on the same inputs: bit for bit).
  if (s.policy.ln && w.ln1_w)
    ln_apply(s, a.attn_in, in, a.ln1_mean, a.ln1_rstd, w.ln1_w, w.ln1_b, Tn, C);
  if (s.policy.residual) attention_residual(s, layer, w, a, in);
  if (s.policy.ln) ln_apply(s, a.h1, a.r1, a.ln2_mean, a.ln2_rstd, w.ln2_w, w.ln2_b, Tn, C);
  if (s.policy.gelu) s.be.geglu_forward(a.gelu.shaped(Tn, I), a.inter.shaped(Tn, 2 * I));

  const View dres = ws.get(Rec::dres).shaped(Tn, C), dh1 = ws.get(Rec::dh1).shaped(Tn, C),
             dtmp = ws.get(Rec::dtmp).shaped(Tn, C), datt = ws.get(Rec::datt).shaped(Tn, C),
             dqkv = ws.get(Rec::dqkv).shaped(Tn, 3 * C), dgelu = ws.get(Rec::dgelu).shaped(Tn, I),
             dglu = ws.get(Rec::dglu).shaped(Tn, 2 * I);
  const View dy = dout.shaped(Tn, C), dx = dinp.shaped(Tn, C);

  // out = r1 + GeGLU(mlp_norm(r1) . Wi^T) . Wo^T
  linear_grad(s, nullptr, dgelu, g.out_w, g.out_b, dy, a.gelu, w.out_w, W16(&LayerView::out_w), Tn,
              I, C, nullptr, over);
  s.tick();
  s.be.geglu_backward(dglu, a.inter.shaped(Tn, 2 * I), dgelu, over);
  linear_grad(s, nullptr, dh1, g.inter_w, g.inter_b, dglu, a.h1, w.inter_w,
              W16(&LayerView::inter_w), Tn, C, 2 * I, nullptr, over);
  s.tick();
  ln_backward(s, dres, g.ln2_w, g.ln2_b, dh1, a.r1, w.ln2_w, a.ln2_mean, a.ln2_rstd, Tn, C);
  s.be.residual_forward(dres, dres, dy);  // d r1: through the norm and the residual branch

  // r1 = in + attention(rotary(attn_norm(in) . Wqkv^T)) . Wo^T
  linear_grad(s, nullptr, datt, g.attn_out_w, g.attn_out_b, dres, a.att, w.attn_out_w,
              W16(&LayerView::attn_out_w), Tn, C, C, nullptr, over);
  s.tick();
  s.be.attention_backward(dqkv, datt, a.qkv.shaped(Tn, 3 * C), probs_of(s, layer, a),
                          s.tokens.cu_seqlens.data(), s.n_seq(), NH, s.window(layer),
                          attention_dropout(s, layer), s.offsets(layer), ws.get(Rec::attn_work),
                          over);
  const View dqk = queries_and_keys(dqkv, Tn, C);
  s.be.rotary_backward(dqk, dqk, s.positions, 2 * NH, c.modern.rope_theta(layer), over);
  s.tick();
  if (w.ln1_w) {
    linear_grad(s, nullptr, dtmp, g.qkv_w, g.qkv_b, dqkv, a.attn_in, w.qkv_w,
                W16(&LayerView::qkv_w), Tn, C, 3 * C, nullptr, over);
    ln_backward(s, dx, g.ln1_w, g.ln1_b, dtmp, in, w.ln1_w, a.ln1_mean, a.ln1_rstd, Tn, C);
  } else {
    linear_grad(s, nullptr, dx, g.qkv_w, g.qkv_b, dqkv, in, w.qkv_w, W16(&LayerView::qkv_w), Tn, C,
                3 * C, nullptr, over);
  }
  s.be.residual_forward(dx, dx, dres);
  s.tick();
}

View final_norm_forward(const StepContext& s, const ParamView& p, View x) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  const View wide = s.ws.get(Rec::final_out), narrow = s.ws.get(Rec::final16);
  ln_forward(s, narrow ? narrow : wide, s.ws.get(Rec::final_mean), s.ws.get(Rec::final_rstd), x,
             p.final_ln_w, p.final_ln_b, Tn, C, narrow ? wide : View());
  return (narrow ? narrow : wide).shaped(Tn, C);
}

void final_norm_backward(const StepContext& s, const ParamView& p, const ParamView& g, View x,
                         View dtop, View dx) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  ln_backward(s, dx, g.final_ln_w, g.final_ln_b, dtop, x, p.final_ln_w, s.ws.get(Rec::final_mean),
              s.ws.get(Rec::final_rstd), Tn, C);
}

namespace {

// The prediction head's transform on N rows of `in` [N, C]: task_t3 = norm(GELU(in . W^T + b)).
View head_transform_forward(const StepContext& s, const ParamView& p, View in, int N) {
  const Workspace& ws = s.ws;
  const int C = s.config.hidden_size;
  const View t1 = ws.get(Rec::task_t1).shaped(N, C), t2 = ws.get(Rec::task_t2).shaped(N, C),
             t3 = ws.get(Rec::task_t3).shaped(N, C);
  s.be.linear_forward(t1, in.shaped(N, C), p.mlm_w.shaped(C, C), p.mlm_b.shaped(1, C), nullptr,
                      View());
  s.be.gelu_forward(t2, t1);
  s.be.layernorm_forward(t3, ws.get(Rec::task_mean).shaped(1, N),
                         ws.get(Rec::task_rstd).shaped(1, N), t2, p.mlm_ln_w.shaped(1, C),
                         p.mlm_ln_b.shaped(1, C), s.config.layer_norm_eps, View());
  return t3;
}
// din += the input gradient, from d3 = d loss / d task_t3 ([N, C]; scratch dh1 and dtmp used).
void head_transform_backward(const StepContext& s, const ParamView& p, const ParamView& g, View in,
                             int N, View d3, View din) {
  const Workspace& ws = s.ws;
  const int C = s.config.hidden_size;
  constexpr GradWrite over = GradWrite::overwrite;
  const View d2 = ws.get(Rec::dh1).shaped(N, C), d1 = ws.get(Rec::dtmp).shaped(N, C);
  s.be.layernorm_backward(d2, g.mlm_ln_w.shaped(1, C), g.mlm_ln_b.shaped(1, C), d3.shaped(N, C),
                          ws.get(Rec::task_t2).shaped(N, C), p.mlm_ln_w.shaped(1, C),
                          ws.get(Rec::task_mean).shaped(1, N), ws.get(Rec::task_rstd).shaped(1, N),
                          over);
  s.be.gelu_backward(d1, View(), ws.get(Rec::task_t1).shaped(N, C), d2, over);
  s.be.linear_backward(din.shaped(N, C), g.mlm_w.shaped(C, C), g.mlm_b.shaped(1, C), d1,
                       in.shaped(N, C), p.mlm_w.shaped(C, C), nullptr, GradWrite::accumulate,
                       View());
}

}  // namespace

void modernbert_classifier_forward(const StepContext& s, const ParamView& p, View top,
                                   const ClassTargets& targets, Outputs& out) {
  const int n = s.n_seq(), Tn = s.T_(), C = s.config.hidden_size;
  const View pooled = s.ws.get(Rec::task_in).shaped(n, C);
  // Mean pooling: each sequence's tokens summed into its row, then divided by its length.
  if (s.config.modern.mean_pooling()) {
    s.be.zero(pooled);
    s.be.gather_rows_backward(pooled, top.shaped(Tn, C), s.token_sequence);
    for (int i = 0; i < n; ++i)
      s.be.scale(pooled.slice(static_cast<int64_t>(i) * C, C),
                 1.0f / static_cast<float>(s.tokens.cu_seqlens[i + 1] - s.tokens.cu_seqlens[i]));
  } else {  // each sequence's first token
    s.be.gather_rows_forward(pooled, top.shaped(Tn, C), s.tokens.cu_seqlens.data());
  }
  classifier_forward(s, p, head_transform_forward(s, p, pooled, n), targets, out);
}

void modernbert_classifier_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                                    const ClassTargets& targets, const Outputs& out, View dtop) {
  const int n = s.n_seq(), Tn = s.T_(), C = s.config.hidden_size;
  const View d3 = s.ws.get(Rec::datt).shaped(n, C), dpooled = s.ws.get(Rec::dqkv).shaped(n, C);
  s.be.zero(d3);
  s.be.zero(dpooled);
  classifier_backward(s, p, g, targets, out, d3);
  head_transform_backward(s, p, g, s.ws.get(Rec::task_in), n, d3, dpooled);
  if (!s.config.modern.mean_pooling())
    return s.be.gather_rows_backward(dtop.shaped(Tn, C), dpooled, s.tokens.cu_seqlens.data());
  for (int i = 0; i < n; ++i)  // each token's share: its sequence's gradient over its length
    s.be.scale(dpooled.slice(static_cast<int64_t>(i) * C, C),
               1.0f / static_cast<float>(s.tokens.cu_seqlens[i + 1] - s.tokens.cu_seqlens[i]));
  const View spread = s.ws.get(Rec::dtmp).shaped(Tn, C);
  s.be.gather_rows_forward(spread, dpooled, s.token_sequence);
  s.be.residual_forward(dtop.shaped(Tn, C), dtop.shaped(Tn, C), spread);
}

void modernbert_span_forward(const StepContext& s, const ParamView& p, View top,
                             const int32_t* targets, Outputs& out) {
  span_forward(s, p, head_transform_forward(s, p, top, s.T_()), targets, out);
}

void modernbert_span_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                              View top, const int32_t* targets, const Outputs& out, View dtop) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  const View d3 = s.ws.get(Rec::datt).shaped(Tn, C);
  s.be.zero(d3);
  span_backward(s, p, g, s.ws.get(Rec::task_t3).shaped(Tn, C), targets, out, d3);
  head_transform_backward(s, p, g, top, Tn, d3, dtop);
}

}  // namespace packbert::model
