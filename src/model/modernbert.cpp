#include "model/modernbert.h"

#include "kernels/ops.h"

namespace packbert::model {

using namespace kernels;

void modernbert_embeddings_forward(const StepContext& s, const ParamView& p, const int32_t* ids,
                                   View out) {
  const View sum = s.ws.get(Rec::emb_sum);
  // (under 16-bit master weights the word table is kept in 16 bits only)
  s.be.gather_rows_forward(sum, p.word ? p.word : s.p16->word, ids);
  ln_forward(s, out, s.ws.get(Rec::emb_mean), s.ws.get(Rec::emb_rstd), sum, p.emb_ln_w, p.emb_ln_b);
}

void modernbert_embeddings_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                                    const int32_t* ids, View dout, View dword) {
  const View dsum = s.ws.get(Rec::dres);
  ln_backward(s, dsum, g.emb_ln_w, g.emb_ln_b, dout, s.ws.get(Rec::emb_sum), p.emb_ln_w,
              s.ws.get(Rec::emb_mean), s.ws.get(Rec::emb_rstd));
  s.be.gather_rows_backward(dword ? dword : g.word, dsum, ids);
}

namespace {

// q | k inside q | k | v [T, 3C]: the rows' first 2C columns, strided.
View queries_and_keys(View qkv) {
  View qk = qkv;
  qk.cols = qkv.cols / 3 * 2;
  return qk;
}

// The attention block's residual sum r1 = in + attention(...) . Wo^T (+ b), from the attention
// output as held.
void attention_residual(const StepContext& s, int layer, const LayerView& w, const LayerRecord& a,
                        View in) {
  const View tmp = s.ws.get(Rec::tmp);
  linear(s, layer_linear(s, layer, LayerLinear::attn_out, w), tmp, a.att);
  s.be.residual_forward(a.r1, tmp, in);
}

}  // namespace

void modernbert_layer_forward(const StepContext& s, int layer, const LayerView& w,
                              const LayerRecord& a, View in, View out) {
  const BertConfig& c = s.config;
  const int NH = c.num_attention_heads;
  auto lin = [&](LayerLinear which) { return layer_linear(s, layer, which, w); };
  const View tmp = s.ws.get(Rec::tmp);

  View x = in;  // the attention's input: layer 0's is the embeddings' norm itself
  if (w.ln1_w) {
    ln_forward(s, a.attn_in, a.ln1_mean, a.ln1_rstd, in, w.ln1_w, w.ln1_b);
    x = a.attn_in;
  }
  linear(s, lin(LayerLinear::qkv), a.qkv, x);
  const View qk = queries_and_keys(a.qkv);
  s.be.rotary_forward(qk, qk, s.positions, 2 * NH, c.modern.rope_theta(layer));
  s.tick();
  s.be.attention_forward(a.att, a.probs, a.qkv, s.tokens.cu_seqlens.data(), s.n_seq(), NH,
                         s.window(layer), attention_dropout(s, layer), s.offsets(layer),
                         s.ws.get(Rec::attn_work));
  s.tick();
  attention_residual(s, layer, w, a, in);
  ln_forward(s, a.h1, a.ln2_mean, a.ln2_rstd, a.r1, w.ln2_w, w.ln2_b);
  linear(s, lin(LayerLinear::inter), a.inter, a.h1);
  s.tick();
  s.be.geglu_forward(a.gelu, a.inter);
  linear(s, lin(LayerLinear::out), tmp, a.gelu);
  s.be.residual_forward(out, tmp, a.r1);
  s.tick();
}

void modernbert_layer_backward(const StepContext& s, int layer, const LayerView& w,
                               const LayerView& g, const LayerRecord& a, View in, View dout,
                               View dinp) {
  const BertConfig& c = s.config;
  const int NH = c.num_attention_heads;
  const Workspace& ws = s.ws;
  auto lin = [&](LayerLinear which) { return layer_linear(s, layer, which, w, &g); };
  constexpr GradWrite over = GradWrite::overwrite;

  // Rebuild what the policy did not keep (the same kernels on the same inputs: bit for bit).
  if (s.policy.ln && w.ln1_w) ln_apply(s, a.attn_in, in, a.ln1_mean, a.ln1_rstd, w.ln1_w, w.ln1_b);
  if (s.policy.residual) attention_residual(s, layer, w, a, in);
  if (s.policy.ln) ln_apply(s, a.h1, a.r1, a.ln2_mean, a.ln2_rstd, w.ln2_w, w.ln2_b);
  if (s.policy.gelu) s.be.geglu_forward(a.gelu, a.inter);

  const View dres = ws.get(Rec::dres), dh1 = ws.get(Rec::dh1), dtmp = ws.get(Rec::dtmp),
             datt = ws.get(Rec::datt), dqkv = ws.get(Rec::dqkv), dgelu = ws.get(Rec::dgelu),
             dglu = ws.get(Rec::dglu);
  const View dy = dout, dx = dinp;

  // out = r1 + GeGLU(mlp_norm(r1) . Wi^T) . Wo^T
  linear_grad(s, lin(LayerLinear::out), dgelu, dy, a.gelu, over);
  s.tick();
  s.be.geglu_backward(dglu, a.inter, dgelu, over);
  linear_grad(s, lin(LayerLinear::inter), dh1, dglu, a.h1, over);
  s.tick();
  ln_backward(s, dres, g.ln2_w, g.ln2_b, dh1, a.r1, w.ln2_w, a.ln2_mean, a.ln2_rstd);
  s.be.residual_forward(dres, dres, dy);  // d r1: through the norm and the residual branch

  // r1 = in + attention(rotary(attn_norm(in) . Wqkv^T)) . Wo^T
  linear_grad(s, lin(LayerLinear::attn_out), datt, dres, a.att, over);
  s.tick();
  s.be.attention_backward(dqkv, datt, a.qkv, a.probs, s.tokens.cu_seqlens.data(), s.n_seq(), NH,
                          s.window(layer), attention_dropout(s, layer), s.offsets(layer),
                          ws.get(Rec::attn_work), over);
  const View dqk = queries_and_keys(dqkv);
  s.be.rotary_backward(dqk, dqk, s.positions, 2 * NH, c.modern.rope_theta(layer), over);
  s.tick();
  if (w.ln1_w) {
    linear_grad(s, lin(LayerLinear::qkv), dtmp, dqkv, a.attn_in, over);
    ln_backward(s, dx, g.ln1_w, g.ln1_b, dtmp, in, w.ln1_w, a.ln1_mean, a.ln1_rstd);
  } else {
    linear_grad(s, lin(LayerLinear::qkv), dx, dqkv, in, over);
  }
  s.be.residual_forward(dx, dx, dres);
  s.tick();
}

View final_norm_forward(const StepContext& s, const ParamView& p, View x) {
  const View wide = s.ws.get(Rec::final_out), narrow = s.ws.get(Rec::final16);
  ln_forward(s, narrow ? narrow : wide, s.ws.get(Rec::final_mean), s.ws.get(Rec::final_rstd), x,
             p.final_ln_w, p.final_ln_b, narrow ? wide : View());
  return narrow ? narrow : wide;
}

void final_norm_backward(const StepContext& s, const ParamView& p, const ParamView& g, View x,
                         View dtop, View dx) {
  ln_backward(s, dx, g.final_ln_w, g.final_ln_b, dtop, x, p.final_ln_w, s.ws.get(Rec::final_mean),
              s.ws.get(Rec::final_rstd));
}

namespace {

// The prediction head's transform on the rows of `in` ([n_seq, C] pooled, or [T, C]): task_t3 =
// norm(GELU(in . W^T + b)).
View head_transform_forward(const StepContext& s, const ParamView& p, View in) {
  const Workspace& ws = s.ws;
  const View t1 = ws.get(Rec::task_t1), t2 = ws.get(Rec::task_t2), t3 = ws.get(Rec::task_t3);
  s.be.linear_forward(t1, in, p.mlm_w, p.mlm_b, nullptr, View());
  s.be.gelu_forward(t2, t1);
  s.be.layernorm_forward(t3, ws.get(Rec::task_mean), ws.get(Rec::task_rstd), t2, p.mlm_ln_w,
                         p.mlm_ln_b, s.config.layer_norm_eps, View());
  return t3;
}
// din += the input gradient, from d3 = d loss / d task_t3.
void head_transform_backward(const StepContext& s, const ParamView& p, const ParamView& g, View in,
                             View d3, View din) {
  const Workspace& ws = s.ws;
  constexpr GradWrite over = GradWrite::overwrite;
  const View d2 = ws.get(Rec::task_d2), d1 = ws.get(Rec::task_d1);
  s.be.layernorm_backward(d2, g.mlm_ln_w, g.mlm_ln_b, d3, ws.get(Rec::task_t2), p.mlm_ln_w,
                          ws.get(Rec::task_mean), ws.get(Rec::task_rstd), over);
  s.be.gelu_backward(d1, View(), ws.get(Rec::task_t1), d2, over);
  s.be.linear_backward(din, g.mlm_w, g.mlm_b, d1, in, p.mlm_w, nullptr, GradWrite::accumulate,
                       View());
}

}  // namespace

void modernbert_classifier_forward(const StepContext& s, const ParamView& p, View top,
                                   const ClassTargets& targets, Outputs& out) {
  const int n = s.n_seq(), C = s.config.hidden_size;
  const View pooled = s.ws.get(Rec::task_in);
  // Mean pooling: each sequence's tokens summed into its row, then divided by its length.
  if (s.config.modern.mean_pooling()) {
    s.be.zero(pooled);
    s.be.gather_rows_backward(pooled, top, s.token_sequence);
    for (int i = 0; i < n; ++i)
      s.be.scale(pooled.slice(static_cast<int64_t>(i) * C, C),
                 1.0f / static_cast<float>(s.tokens.cu_seqlens[i + 1] - s.tokens.cu_seqlens[i]));
  } else {  // each sequence's first token
    s.be.gather_rows_forward(pooled, top, s.tokens.cu_seqlens.data());
  }
  classifier_forward(s, p, head_transform_forward(s, p, pooled), targets, out);
}

void modernbert_classifier_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                                    const ClassTargets& targets, const Outputs& out, View dtop) {
  const int n = s.n_seq(), C = s.config.hidden_size;
  // the task head's output and input gradients, [n_seq, C]
  const View d3 = s.ws.get(Rec::dpre), dpooled = s.ws.get(Rec::dpooled);
  s.be.zero(d3);
  s.be.zero(dpooled);
  classifier_backward(s, p, g, targets, out, d3);
  head_transform_backward(s, p, g, s.ws.get(Rec::task_in), d3, dpooled);
  if (!s.config.modern.mean_pooling())
    return s.be.gather_rows_backward(dtop, dpooled, s.tokens.cu_seqlens.data());
  for (int i = 0; i < n; ++i)  // each token's share: its sequence's gradient over its length
    s.be.scale(dpooled.slice(static_cast<int64_t>(i) * C, C),
               1.0f / static_cast<float>(s.tokens.cu_seqlens[i + 1] - s.tokens.cu_seqlens[i]));
  const View spread = s.ws.get(Rec::dtmp);
  s.be.gather_rows_forward(spread, dpooled, s.token_sequence);
  s.be.residual_forward(dtop, dtop, spread);
}

void modernbert_span_forward(const StepContext& s, const ParamView& p, View top,
                             const int32_t* targets, Outputs& out) {
  span_forward(s, p, head_transform_forward(s, p, top), targets, out);
}

void modernbert_span_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                              View top, const int32_t* targets, const Outputs& out, View dtop) {
  const View d3 = s.ws.get(Rec::datt);
  s.be.zero(d3);
  span_backward(s, p, g, s.ws.get(Rec::task_t3), targets, out, d3);
  head_transform_backward(s, p, g, top, d3, dtop);
}

}  // namespace packbert::model
