#include "model/encoder_layer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include "kernels/attention_layout.h"
#include "kernels/block_pattern.h"
#include "kernels/dropout.h"
#include "kernels/ops.h"

namespace packbert::model {

using namespace kernels;

namespace {

// Calls f(begin, end, first) for each run of the n elements of a site's tensor ([T, C], or
// [n_seq, C] for the pooled site) that is consecutive in the dropout stream: elements [begin,
// end) draw from index `first` on.
template <typename F>
void for_each_dropout_run(const StepContext& s, int64_t n, uint32_t site, F f) {
  const bool by_sequence = site == kPooled;
  const int64_t rows = by_sequence ? s.n_seq() : s.T_();
  if (!s.places || rows == 0) return f(int64_t{0}, n, uint64_t{0});
  const std::vector<int64_t>& local = by_sequence ? s.places->seq_local : s.places->token_local;
  const std::vector<int64_t>& global = by_sequence ? s.places->seq_global : s.places->token_global;
  const int64_t width = n / rows;
  for (size_t i = 0; i + 1 < local.size(); ++i)
    f(local[i] * width, local[i + 1] * width, static_cast<uint64_t>(global[i] * width));
}

// scratch.sparse_output at `like`'s shape: under a 16-bit precision, the fp32 output of a
// block-sparse layer that the step keeps in 16 bits, or GELU's fp32 input gradient for a sparse
// up-projection.
View sparse_output(const StepContext& s, View like) {
  if (!s.ws.get(Rec::sparse_out))
    throw std::logic_error("scratch.sparse_output is not held for this step");
  return scratch_as(s, Rec::sparse_out, like);
}

}  // namespace

View scratch_as(const StepContext& s, Rec r, View like) {
  return s.ws.get(r).shaped(like.rows, like.cols);
}

namespace {

// Where each of a layer's linear layers sits in its weights, patterns and block norms.
struct LinearFields {
  View LayerView::*W;
  View LayerView::*b;
  BlockPattern LayerPatterns::*pattern;
  std::vector<float> LayerBlockGrads::*block_l1;
};
constexpr LinearFields kLinearFields[] = {
    {&LayerView::qkv_w, &LayerView::qkv_b, &LayerPatterns::qkv, &LayerBlockGrads::qkv},
    {&LayerView::attn_out_w, &LayerView::attn_out_b, &LayerPatterns::attn_out,
     &LayerBlockGrads::attn_out},
    {&LayerView::inter_w, &LayerView::inter_b, &LayerPatterns::inter, &LayerBlockGrads::inter},
    {&LayerView::out_w, &LayerView::out_b, &LayerPatterns::out, &LayerBlockGrads::out},
};

}  // namespace

Linear layer_linear(const StepContext& s, int layer, LayerLinear which, const LayerView& w,
                    const LayerView* g) {
  const LinearFields& f = kLinearFields[static_cast<int>(which)];
  Linear lin;
  lin.W = w.*f.W;
  lin.W16 = s.p16 ? s.p16->layers[layer].*f.W : View();
  lin.b = w.*f.b;
  lin.pattern = s.patterns ? &(s.patterns[layer].*f.pattern) : nullptr;
  if (g) {
    lin.dW = g->*f.W;
    lin.db = g->*f.b;
    lin.block_l1 = s.block_grads ? &(s.block_grads[layer].*f.block_l1) : nullptr;
  }
  return lin;
}

// The step's linear layers: out = in . W^T + b, out as held (16 bits under a 16-bit precision for
// an output only 16-bit readers take: q | k | v, GELU's input). Dense under a 16-bit precision:
// the 16-bit operands in and W16 (a 16-bit out is rounded once, inside the GEMM). Block-sparse
// when the layer has a pattern: W holds its kept blocks' values (fp32 under every precision); a
// 16-bit out is rounded from the fp32 result in scratch.sparse_output.
void linear(const StepContext& s, const Linear& lin, View out, View in) {
  const Backend& be = s.be;
  if (!lin.pattern)
    return be.linear_forward(out, in, lin.W16 ? lin.W16 : lin.W, lin.b, nullptr, View());
  const View sparse = s.ws.get(Rec::sparse);
  if (out.is_16bit()) {
    const View y = sparse_output(s, out);
    be.linear_forward(y, in, lin.W, lin.b, lin.pattern, sparse);
    return be.convert(out, y);
  }
  be.linear_forward(out, in, lin.W, lin.b, lin.pattern, sparse);
}

// mode: how dinp is written (a fresh buffer is overwritten). lin.block_l1, when set (gradient
// regrow, a sparse layer), also receives the block L1 norms of the dense weight gradient, from
// the operands the layer's dense form would multiply.
void linear_grad(const StepContext& s, const Linear& lin, View dinp, View dout, View in,
                 GradWrite mode) {
  const Backend& be = s.be;
  const BlockPattern* pattern = lin.pattern;
  if (!pattern) {
    if (lin.block_l1) throw std::logic_error("block gradients are for block-sparse layers");
    return be.linear_backward(dinp, lin.dW, lin.db, dout, in, lin.W16 ? lin.W16 : lin.W, nullptr,
                              mode, lin.W16 ? s.ws.get(Rec::dout16) : View());
  }
  if (lin.block_l1)
    be.linear_block_grad_norms(
        View(lin.block_l1->data(), dout.cols / pattern->block, in.cols / pattern->block), dout, in,
        pattern->block, s.dense_scratch, in.is_16bit() ? s.ws.get(Rec::dout16) : View());
  be.linear_backward(dinp, lin.dW, lin.db, dout, in, lin.W, pattern, mode, s.ws.get(Rec::sparse));
}

namespace {

// A residual sum r = dropout(x) + skip at (layer, site), r and skip as held (under 16 bits
// rounded once into r). x is the linear layer's output in scratch, in the scalar (overwritten in
// the 16-bit case).
void residual_site(const StepContext& s, View r, View x, View skip, uint32_t layer, uint32_t site) {
  if (r.is_16bit()) {
    dropout_site(s, x, x, layer, site);
    return s.be.residual_forward(r, x, skip);
  }
  dropout_site(s, r, x, layer, site);
  s.be.residual_forward(r, r, skip);
}

}  // namespace

// LayerNorm forward and backward (dinp written over: each call's is a fresh buffer) of [N, C]
// from a residual sum as held; out as held, and out_wide as ln_apply's.
void ln_forward(const StepContext& s, View out, View mean, View rstd, View inp, View w, View b,
                View out_wide) {
  const auto [wide, out16] = wide_and_16(out, out_wide);
  s.be.layernorm_forward(wide, mean, rstd, inp, w, b, s.config.layer_norm_eps, out16);
}
void ln_backward(const StepContext& s, View dinp, View dw, View db, View dout, View inp, View w,
                 View mean, View rstd) {
  s.be.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, GradWrite::overwrite);
}

void ln_apply(const StepContext& s, View out, View inp, View mean, View rstd, View w, View b) {
  const auto [wide, out16] = wide_and_16(out);
  s.be.layernorm_apply(wide, inp, mean, rstd, w, b, out16);
}

namespace {

// GELU's output from its input, both as held.
void gelu_out(const StepContext& s, const LayerRecord& a) {
  s.be.gelu_forward(a.gelu, a.inter);
}
// dinter, written over, from GELU's input as held.
void gelu_grad(const StepContext& s, const LayerRecord& a, View dinter, View dgelu) {
  s.be.gelu_backward(dinter, View(), a.inter, dgelu, GradWrite::overwrite);
}

// GELU's and the FFN up-projection's backward under 16 bits, dense: GELU's gradient goes
// straight to the projection's 16-bit GEMM operand and bias gradient (gelu_backward with a
// 16-bit dinp), never to memory in fp32; dh1 += its input gradient. False (nothing done) where
// that path does not apply: scalar records, a sparse layer, or block gradients wanted.
bool ffn_up_backward_16(const StepContext& s, const LayerRecord& a, const Linear& up, View dh1,
                        View dgelu) {
  if (!a.inter.is_16bit() || !up.W16 || up.pattern || up.block_l1) return false;
  const View d16 = scratch_as(s, Rec::dout16, a.inter);
  s.be.gelu_backward(d16, up.db, a.inter, dgelu, GradWrite::overwrite);
  s.be.linear_backward(dh1, up.dW, View(), d16, a.h1, up.W16, nullptr, GradWrite::accumulate,
                       View());
  return true;
}

}  // namespace

AttentionDropout attention_dropout(const StepContext& s, int layer) {
  return {s.p_attn, s.seed, dropout_key(s.step, static_cast<uint32_t>(layer), kAttnProbs),
          s.places && !s.places->attention.empty() ? s.places->attention.data() : nullptr};
}

namespace {

// dqkv, written over, from the attention output's gradient and q | k | v and the probabilities
// as held.
void attention_grad(const StepContext& s, int layer, const LayerRecord& a, View dqkv, View datt) {
  s.be.attention_backward(dqkv, datt, a.qkv, a.probs, s.tokens.cu_seqlens.data(), s.n_seq(),
                          s.config.num_attention_heads, kernels::kGlobalAttention,
                          attention_dropout(s, layer), s.probs_offsets, s.ws.get(Rec::attn_work),
                          GradWrite::overwrite);
}

}  // namespace

void dropout_site(const StepContext& s, View out, View inp, uint32_t layer, uint32_t site) {
  const int64_t n = inp.numel();
  if (out.numel() != n) throw std::logic_error("dropout_site: out and inp differ in size");
  if (s.p_hidden > 0) {
    const uint64_t key = dropout_key(s.step, layer, site);
    for_each_dropout_run(s, n, site, [&](int64_t a, int64_t b, uint64_t first) {
      s.be.dropout_forward(out.slice(a, b - a), inp.slice(a, b - a), s.p_hidden, s.seed, key,
                           first);
    });
  } else if (out.data != inp.data) {
    s.be.convert(out, inp);
  }
}

void dropout_site_backward(const StepContext& s, View dinp, View dout, uint32_t layer,
                           uint32_t site) {
  const int64_t n = dout.numel();
  if (dinp.numel() != n) throw std::logic_error("dropout_site_backward: sizes differ");
  const uint64_t key = dropout_key(s.step, layer, site);
  for_each_dropout_run(s, n, site, [&](int64_t a, int64_t b, uint64_t first) {
    s.be.dropout_backward(dinp.slice(a, b - a), dout.slice(a, b - a), s.p_hidden, s.seed, key,
                          first);
  });
}

namespace {

// The gradient through a dropout site: dout itself when dropout is off, else the masked copy in
// scratch, written over it (dropout's backward is its forward's mask and scale applied to dout).
View through_dropout(const StepContext& s, View scratch, View dout, uint32_t layer, uint32_t site) {
  if (s.p_hidden <= 0) return dout;
  dropout_site(s, scratch, dout, layer, site);
  return scratch;
}

// The three embedding tables of p (the word table in 16 bits under 16-bit master weights, where
// p.word is empty).
std::array<View, 3> embedding_tables(const StepContext& s, const ParamView& p) {
  return {p.word ? p.word : s.p16->word, p.position, p.token_type};
}

}  // namespace

void embeddings_forward(const StepContext& s, const ParamView& p, const int32_t* ids,
                        const int32_t* pos, const int32_t* types, View out) {
  const View sum = s.ws.get(Rec::emb_sum);
  const View ln = s.p_hidden > 0 ? s.ws.get(Rec::tmp) : out;
  const auto [word, position, token_type] = embedding_tables(s, p);
  s.be.embedding_forward(sum, ids, pos, types, word, position, token_type);
  s.be.layernorm_forward(ln, s.ws.get(Rec::emb_mean), s.ws.get(Rec::emb_rstd), sum, p.emb_ln_w,
                         p.emb_ln_b, s.config.layer_norm_eps, View());
  if (s.p_hidden > 0) dropout_site(s, out, ln, kNoLayer, kEmbeddings);
}

void embeddings_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                         const int32_t* ids, const int32_t* pos, const int32_t* types, View dout,
                         View dword) {
  const View dln = through_dropout(s, s.ws.get(Rec::dtmp), dout, kNoLayer, kEmbeddings);
  const View dsum = s.ws.get(Rec::dres);
  s.be.layernorm_backward(dsum, g.emb_ln_w, g.emb_ln_b, dln, s.ws.get(Rec::emb_sum), p.emb_ln_w,
                          s.ws.get(Rec::emb_mean), s.ws.get(Rec::emb_rstd), GradWrite::overwrite);
  const auto [dtable, dposition, dtoken_type] = embedding_tables(s, g);
  s.be.embedding_backward(dword ? dword : dtable, dposition, dtoken_type, dsum, ids, pos, types);
}

void encoder_layer_forward(const StepContext& s, int layer, const LayerView& w,
                           const LayerRecord& a, View in, View out, View out_wide) {
  const uint32_t l = static_cast<uint32_t>(layer);
  auto lin = [&](LayerLinear which) { return layer_linear(s, layer, which, w); };
  const View tmp = s.ws.get(Rec::tmp);

  // q | k | v and the attention output as held (16 bits under a 16-bit precision: written by the
  // GEMM, read by attention).
  linear(s, lin(LayerLinear::qkv), a.qkv, in);
  s.tick();
  s.be.attention_forward(a.att, a.probs, a.qkv, s.tokens.cu_seqlens.data(), s.n_seq(),
                         s.config.num_attention_heads, kernels::kGlobalAttention,
                         attention_dropout(s, layer), s.probs_offsets, s.ws.get(Rec::attn_work));
  s.tick();
  linear(s, lin(LayerLinear::attn_out), tmp, a.att);
  residual_site(s, a.r1, tmp, in, l, kAttnOut);
  ln_forward(s, a.h1, a.ln1_mean, a.ln1_rstd, a.r1, w.ln1_w, w.ln1_b);
  linear(s, lin(LayerLinear::inter), a.inter, a.h1);
  s.tick();
  gelu_out(s, a);
  linear(s, lin(LayerLinear::out), tmp, a.gelu);
  s.tick();
  residual_site(s, a.r2, tmp, a.h1, l, kFfnOut);
  ln_forward(s, out, a.ln2_mean, a.ln2_rstd, a.r2, w.ln2_w, w.ln2_b, out_wide);
}

void encoder_layer_backward(const StepContext& s, int layer, const LayerView& w, const LayerView& g,
                            const LayerRecord& a, View in, View dout, View dinp) {
  const uint32_t l = static_cast<uint32_t>(layer);
  const Workspace& ws = s.ws;
  const View dres = ws.get(Rec::dres), dh1 = ws.get(Rec::dh1), dtmp = ws.get(Rec::dtmp),
             datt = ws.get(Rec::datt), dqkv = ws.get(Rec::dqkv), dgelu = ws.get(Rec::dgelu);
  View dinter = ws.get(Rec::dinter);
  auto lin = [&](LayerLinear which) { return layer_linear(s, layer, which, w, &g); };

  // Rebuild what the policy did not keep (the same kernels on the same inputs: bit for bit).
  if (s.policy.residual) {  // r1 = dropout(att . Wao + b) + in
    const View tmp = ws.get(Rec::tmp);
    linear(s, lin(LayerLinear::attn_out), tmp, a.att);
    residual_site(s, a.r1, tmp, in, l, kAttnOut);
  }
  if (s.policy.ln) ln_apply(s, a.h1, a.r1, a.ln1_mean, a.ln1_rstd, w.ln1_w, w.ln1_b);
  if (s.policy.gelu) gelu_out(s, a);

  // out = LN2(r2), r2 = dropout(gelu . Wo) + h1.
  // Each buffer is written over where first written (not zeroed, then added to).
  constexpr GradWrite over = GradWrite::overwrite, add = GradWrite::accumulate;
  ln_backward(s, dres, g.ln2_w, g.ln2_b, dout, a.r2, w.ln2_w, a.ln2_mean, a.ln2_rstd);
  s.be.convert(dh1, dres);  // the residual branch
  linear_grad(s, lin(LayerLinear::out), dgelu, through_dropout(s, dtmp, dres, l, kFfnOut), a.gelu,
              over);
  s.tick();
  const Linear up = lin(LayerLinear::inter);
  if (!ffn_up_backward_16(s, a, up, dh1, dgelu)) {
    // Under 16 bits grad.gelu_in is not held: a sparse up-projection takes GELU's input
    // gradient in fp32 from scratch.sparse_output.
    if (!dinter) dinter = sparse_output(s, dgelu);
    gelu_grad(s, a, dinter, dgelu);
    linear_grad(s, up, dh1, dinter, a.h1, add);
  }
  s.tick();

  // h1 = LN1(r1), r1 = dropout(att . Wao) + in.
  ln_backward(s, dres, g.ln1_w, g.ln1_b, dh1, a.r1, w.ln1_w, a.ln1_mean, a.ln1_rstd);
  s.be.convert(dinp, dres);  // the residual branch
  linear_grad(s, lin(LayerLinear::attn_out), datt, through_dropout(s, dtmp, dres, l, kAttnOut),
              a.att, over);
  s.tick();
  attention_grad(s, layer, a, dqkv, datt);
  s.tick();
  linear_grad(s, lin(LayerLinear::qkv), dinp, dqkv, in, add);
}

}  // namespace packbert::model
