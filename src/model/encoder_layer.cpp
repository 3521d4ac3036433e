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

// scratch.sparse_output: under a 16-bit precision, the fp32 output of a block-sparse layer that
// the step keeps in 16 bits, or GELU's fp32 input gradient for a sparse up-projection.
View sparse_output(const StepContext& s) {
  const View out = s.ws.get(Rec::sparse_out);
  if (!out) throw std::logic_error("scratch.sparse_output is not held for this step");
  return out;
}

}  // namespace

// The step's linear layers: out = in . W^T + b, [N, OC] from [N, C], out as held (16 bits under
// a 16-bit precision for an output only 16-bit readers take: q | k | v, GELU's input). Dense
// under a 16-bit precision: the 16-bit operands in and W16 (a 16-bit out is rounded once, inside
// the GEMM). Block-sparse when the layer has a pattern: W holds its kept blocks' values (fp32
// under every precision); a 16-bit out is rounded from the fp32 result in scratch.sparse_output.
void linear(const StepContext& s, const BlockPattern* pattern, View out, View in, View W, View W16,
            View b, int N, int C, int OC) {
  const Backend& be = s.be;
  const View bias = b.shaped(1, OC), x = in.shaped(N, C);
  if (!pattern) {
    be.linear_forward(out, x, W16 ? W16.shaped(OC, C) : W.shaped(OC, C), bias, nullptr, View());
    return;
  }
  const View values = W.shaped(1, pattern->values_size()), sparse = s.ws.get(Rec::sparse);
  if (out.is_16bit()) {
    const View y = sparse_output(s).shaped(N, OC);
    be.linear_forward(y, x, values, bias, pattern, sparse);
    return be.convert(out, y);
  }
  be.linear_forward(out, x, values, bias, pattern, sparse);
}

// mode: how dinp is written (a fresh buffer is overwritten). block_l1, when given (gradient
// regrow, a sparse layer), also receives the block L1 norms of the dense weight gradient, from
// the operands the layer's dense form would multiply.
void linear_grad(const StepContext& s, const BlockPattern* pattern, View dinp, View dW, View db,
                 View dout, View in, View W, View W16, int N, int C, int OC,
                 std::vector<float>* block_l1, GradWrite mode) {
  const Backend& be = s.be;
  const View dy = dout.shaped(N, OC), dbias = db.shaped(1, OC), x = in.shaped(N, C);
  if (!pattern) {
    if (block_l1) throw std::logic_error("block gradients are for block-sparse layers");
    be.linear_backward(dinp.shaped(N, C), dW.shaped(OC, C), dbias, dy, x,
                       W16 ? W16.shaped(OC, C) : W.shaped(OC, C), nullptr, mode,
                       W16 ? s.ws.get(Rec::dout16) : View());
    return;
  }
  if (block_l1)
    be.linear_block_grad_norms(View(block_l1->data(), OC / pattern->block, C / pattern->block), dy,
                               x, pattern->block, s.dense_scratch,
                               x.is_16bit() ? s.ws.get(Rec::dout16) : View());
  const int64_t nv = pattern->values_size();
  be.linear_backward(dinp.shaped(N, C), dW.shaped(1, nv), dbias, dy, x, W.shaped(1, nv), pattern,
                     mode, s.ws.get(Rec::sparse));
}

namespace {

// The block gradient norms backward collects for one of a layer's linear layers, or null.
std::vector<float>* block_grads_of(const StepContext& s, int layer,
                                   std::vector<float> LayerBlockGrads::*which) {
  return s.block_grads ? &(s.block_grads[layer].*which) : nullptr;
}

// A layer's pattern of one of its linear layers, or null when the model is dense.
const BlockPattern* pattern_of(const StepContext& s, int layer,
                               BlockPattern LayerPatterns::*which) {
  return s.patterns ? &(s.patterns[layer].*which) : nullptr;
}

// A residual sum r = dropout(x) + skip at (layer, site), n elements, r and skip as held (under
// 16 bits rounded once into r). x is the linear layer's output in scratch, in the scalar
// (overwritten in the 16-bit case).
void residual_site(const StepContext& s, View r, View x, View skip, int64_t n, uint32_t layer,
                   uint32_t site) {
  if (r.is_16bit()) {
    dropout_site(s, x, x, n, layer, site);
    return s.be.residual_forward(r.shaped(1, n), x.shaped(1, n), skip.shaped(1, n));
  }
  dropout_site(s, r, x, n, layer, site);
  s.be.residual_forward(r.shaped(1, n), r.shaped(1, n), skip.shaped(1, n));
}

}  // namespace

// LayerNorm forward and backward (dinp written over: each call's is a fresh buffer) of [N, C]
// from a residual sum as held; out as held, and out_wide as ln_apply's.
void ln_forward(const StepContext& s, View out, View mean, View rstd, View inp, View w, View b,
                int N, int C, View out_wide) {
  const auto [wide, out16] = wide_and_16(out, out_wide);
  s.be.layernorm_forward(wide.shaped(N, C), mean.shaped(1, N), rstd.shaped(1, N), inp.shaped(N, C),
                         w.shaped(1, C), b.shaped(1, C), s.config.layer_norm_eps,
                         out16.shaped(N, C));
}
void ln_backward(const StepContext& s, View dinp, View dw, View db, View dout, View inp, View w,
                 View mean, View rstd, int N, int C) {
  s.be.layernorm_backward(dinp.shaped(N, C), dw.shaped(1, C), db.shaped(1, C), dout.shaped(N, C),
                          inp.shaped(N, C), w.shaped(1, C), mean.shaped(1, N), rstd.shaped(1, N),
                          GradWrite::overwrite);
}

void ln_apply(const StepContext& s, View out, View inp, View mean, View rstd, View w, View b, int N,
              int C) {
  const auto [wide, out16] = wide_and_16(out);
  s.be.layernorm_apply(wide.shaped(N, C), inp.shaped(N, C), mean.shaped(1, N), rstd.shaped(1, N),
                       w.shaped(1, C), b.shaped(1, C), out16.shaped(N, C));
}

namespace {

// GELU's output from its input, n elements, both as held.
void gelu_out(const StepContext& s, const LayerRecord& a, int64_t n) {
  s.be.gelu_forward(a.gelu.shaped(1, n), a.inter.shaped(1, n));
}
// dinter, written over, from GELU's input as held.
void gelu_grad(const StepContext& s, const LayerRecord& a, View dinter, View dgelu, int64_t n) {
  s.be.gelu_backward(dinter.shaped(1, n), View(), a.inter.shaped(1, n), dgelu.shaped(1, n),
                     GradWrite::overwrite);
}

// GELU's and the FFN up-projection's backward under 16 bits, dense: GELU's gradient goes
// straight to the projection's 16-bit GEMM operand and bias gradient (gelu_backward with a
// 16-bit dinp), never to memory in fp32; dh1 += its input gradient. False (nothing done) where
// that path does not apply: scalar records, a sparse layer, or block gradients wanted.
bool ffn_up_backward_16(const StepContext& s, const LayerRecord& a, const LayerView& g, View dh1,
                        View dgelu, View W16, const BlockPattern* pattern,
                        const std::vector<float>* block_l1) {
  if (!a.inter.is_16bit() || !W16 || pattern || block_l1) return false;
  const int Tn = s.T_(), C = s.config.hidden_size, I = s.config.intermediate_size;
  const View d16 = s.ws.get(Rec::dout16).shaped(Tn, I);
  s.be.gelu_backward(d16, g.inter_b.shaped(1, I), a.inter.shaped(Tn, I), dgelu.shaped(Tn, I),
                     GradWrite::overwrite);
  s.be.linear_backward(dh1.shaped(Tn, C), g.inter_w.shaped(I, C), View(), d16, a.h1.shaped(Tn, C),
                       W16.shaped(I, C), nullptr, GradWrite::accumulate, View());
  return true;
}

}  // namespace

AttentionDropout attention_dropout(const StepContext& s, int layer) {
  return {s.p_attn, s.seed, dropout_key(s.step, static_cast<uint32_t>(layer), kAttnProbs),
          s.places && !s.places->attention.empty() ? s.places->attention.data() : nullptr};
}

namespace {

// The attention probabilities as kept (empty when rebuilt).
View probs_of(const StepContext& s, const LayerRecord& a) {
  return a.probs.shaped(1, s.probs_offsets[s.n_seq()]);
}

// dqkv, written over, from the attention output's gradient and q | k | v and the probabilities
// as held.
void attention_grad(const StepContext& s, int layer, const LayerRecord& a, View dqkv, View datt) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  s.be.attention_backward(dqkv.shaped(Tn, 3 * C), datt.shaped(Tn, C), a.qkv.shaped(Tn, 3 * C),
                          probs_of(s, a), s.tokens.cu_seqlens.data(), s.n_seq(),
                          s.config.num_attention_heads, kernels::kGlobalAttention,
                          attention_dropout(s, layer), s.probs_offsets, s.ws.get(Rec::attn_work),
                          GradWrite::overwrite);
}

}  // namespace

void dropout_site(const StepContext& s, View out, View inp, int64_t n, uint32_t layer,
                  uint32_t site) {
  if (s.p_hidden > 0) {
    const uint64_t key = dropout_key(s.step, layer, site);
    for_each_dropout_run(s, n, site, [&](int64_t a, int64_t b, uint64_t first) {
      s.be.dropout_forward(out.slice(a, b - a), inp.slice(a, b - a), s.p_hidden, s.seed, key,
                           first);
    });
  } else if (out.data != inp.data) {
    s.be.convert(out.shaped(1, n), inp.shaped(1, n));
  }
}

void dropout_site_backward(const StepContext& s, View dinp, View dout, int64_t n, uint32_t layer,
                           uint32_t site) {
  const uint64_t key = dropout_key(s.step, layer, site);
  for_each_dropout_run(s, n, site, [&](int64_t a, int64_t b, uint64_t first) {
    s.be.dropout_backward(dinp.slice(a, b - a), dout.slice(a, b - a), s.p_hidden, s.seed, key,
                          first);
  });
}

namespace {

// The gradient through a dropout site: dout itself when dropout is off, else the masked copy in
// scratch, written over it (dropout's backward is its forward's mask and scale applied to dout).
View through_dropout(const StepContext& s, View scratch, View dout, int64_t n, uint32_t layer,
                     uint32_t site) {
  if (s.p_hidden <= 0) return dout;
  dropout_site(s, scratch, dout, n, layer, site);
  return scratch;
}

// The three embedding tables of p (the word table in 16 bits under 16-bit master weights, where
// p.word is empty).
std::array<View, 3> embedding_tables(const StepContext& s, const ParamView& p) {
  const BertConfig& c = s.config;
  const int64_t C = c.hidden_size;
  return {(p.word ? p.word : s.p16->word).shaped(c.vocab_size, C),
          p.position.shaped(c.max_position_embeddings, C),
          p.token_type.shaped(c.type_vocab_size, C)};
}

}  // namespace

void embeddings_forward(const StepContext& s, const ParamView& p, const int32_t* ids,
                        const int32_t* pos, const int32_t* types, View out) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  const View sum = s.ws.get(Rec::emb_sum).shaped(Tn, C);
  const View ln = (s.p_hidden > 0 ? s.ws.get(Rec::tmp) : out).shaped(Tn, C);
  const auto [word, position, token_type] = embedding_tables(s, p);
  s.be.embedding_forward(sum, ids, pos, types, word, position, token_type);
  s.be.layernorm_forward(ln, s.ws.get(Rec::emb_mean).shaped(1, Tn),
                         s.ws.get(Rec::emb_rstd).shaped(1, Tn), sum, p.emb_ln_w.shaped(1, C),
                         p.emb_ln_b.shaped(1, C), s.config.layer_norm_eps, View());
  if (s.p_hidden > 0) dropout_site(s, out, ln, static_cast<int64_t>(Tn) * C, kNoLayer, kEmbeddings);
}

void embeddings_backward(const StepContext& s, const ParamView& p, const ParamView& g,
                         const int32_t* ids, const int32_t* pos, const int32_t* types, View dout,
                         View dword) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  const int64_t TC = static_cast<int64_t>(Tn) * C;
  const View dln = through_dropout(s, s.ws.get(Rec::dtmp), dout, TC, kNoLayer, kEmbeddings);
  const View dsum = s.ws.get(Rec::dres).shaped(Tn, C);
  s.be.layernorm_backward(dsum, g.emb_ln_w.shaped(1, C), g.emb_ln_b.shaped(1, C), dln.shaped(Tn, C),
                          s.ws.get(Rec::emb_sum).shaped(Tn, C), p.emb_ln_w.shaped(1, C),
                          s.ws.get(Rec::emb_mean).shaped(1, Tn),
                          s.ws.get(Rec::emb_rstd).shaped(1, Tn), GradWrite::overwrite);
  const auto [dtable, dposition, dtoken_type] = embedding_tables(s, g);
  s.be.embedding_backward(dword ? dword : dtable, dposition, dtoken_type, dsum, ids, pos, types);
}

View weight16(const StepContext& s, int layer, View LayerView::*field) {
  return s.p16 ? s.p16->layers[layer].*field : View();
}

void encoder_layer_forward(const StepContext& s, int layer, const LayerView& w,
                           const LayerRecord& a, View in, View out, View out_wide) {
  const BertConfig& c = s.config;
  const int Tn = s.T_(), C = c.hidden_size, I = c.intermediate_size;
  const int64_t TC = static_cast<int64_t>(Tn) * C;
  const uint32_t l = static_cast<uint32_t>(layer);
  auto W16 = [&](View LayerView::*field) { return weight16(s, layer, field); };
  const View tmp = s.ws.get(Rec::tmp);

  // q | k | v and the attention output as held (16 bits under a 16-bit precision: written by the
  // GEMM, read by attention).
  const View qkv = a.qkv.shaped(Tn, 3 * C);
  linear(s, pattern_of(s, layer, &LayerPatterns::qkv), qkv, in, w.qkv_w, W16(&LayerView::qkv_w),
         w.qkv_b, Tn, C, 3 * C);
  s.tick();
  s.be.attention_forward(a.att.shaped(Tn, C), probs_of(s, a), qkv, s.tokens.cu_seqlens.data(),
                         s.n_seq(), c.num_attention_heads, kernels::kGlobalAttention,
                         attention_dropout(s, layer), s.probs_offsets, s.ws.get(Rec::attn_work));
  s.tick();
  linear(s, pattern_of(s, layer, &LayerPatterns::attn_out), tmp.shaped(Tn, C), a.att, w.attn_out_w,
         W16(&LayerView::attn_out_w), w.attn_out_b, Tn, C, C);
  residual_site(s, a.r1, tmp, in, TC, l, kAttnOut);
  ln_forward(s, a.h1, a.ln1_mean, a.ln1_rstd, a.r1, w.ln1_w, w.ln1_b, Tn, C);
  linear(s, pattern_of(s, layer, &LayerPatterns::inter), a.inter.shaped(Tn, I), a.h1, w.inter_w,
         W16(&LayerView::inter_w), w.inter_b, Tn, C, I);
  s.tick();
  gelu_out(s, a, static_cast<int64_t>(Tn) * I);
  linear(s, pattern_of(s, layer, &LayerPatterns::out), tmp.shaped(Tn, C), a.gelu, w.out_w,
         W16(&LayerView::out_w), w.out_b, Tn, I, C);
  s.tick();
  residual_site(s, a.r2, tmp, a.h1, TC, l, kFfnOut);
  ln_forward(s, out, a.ln2_mean, a.ln2_rstd, a.r2, w.ln2_w, w.ln2_b, Tn, C, out_wide);
}

void encoder_layer_backward(const StepContext& s, int layer, const LayerView& w, const LayerView& g,
                            const LayerRecord& a, View in, View dout, View dinp) {
  const BertConfig& c = s.config;
  const int Tn = s.T_(), C = c.hidden_size, I = c.intermediate_size;
  const int64_t TC = static_cast<int64_t>(Tn) * C, TI = static_cast<int64_t>(Tn) * I;
  const uint32_t l = static_cast<uint32_t>(layer);
  const Workspace& ws = s.ws;
  const View dres = ws.get(Rec::dres), dh1 = ws.get(Rec::dh1), dtmp = ws.get(Rec::dtmp),
             datt = ws.get(Rec::datt), dqkv = ws.get(Rec::dqkv), dgelu = ws.get(Rec::dgelu);
  View dinter = ws.get(Rec::dinter);
  auto W16 = [&](View LayerView::*field) { return weight16(s, layer, field); };

  // Rebuild what the policy did not keep (the same kernels on the same inputs: bit for bit).
  if (s.policy.residual) {  // r1 = dropout(att . Wao + b) + in
    const View tmp = ws.get(Rec::tmp);
    linear(s, pattern_of(s, layer, &LayerPatterns::attn_out), tmp.shaped(Tn, C), a.att,
           w.attn_out_w, W16(&LayerView::attn_out_w), w.attn_out_b, Tn, C, C);
    residual_site(s, a.r1, tmp, in, TC, l, kAttnOut);
  }
  if (s.policy.ln) ln_apply(s, a.h1, a.r1, a.ln1_mean, a.ln1_rstd, w.ln1_w, w.ln1_b, Tn, C);
  if (s.policy.gelu) gelu_out(s, a, TI);

  // out = LN2(r2), r2 = dropout(gelu . Wo) + h1.
  // Each buffer is written over where first written (not zeroed, then added to).
  constexpr GradWrite over = GradWrite::overwrite, add = GradWrite::accumulate;
  ln_backward(s, dres, g.ln2_w, g.ln2_b, dout, a.r2, w.ln2_w, a.ln2_mean, a.ln2_rstd, Tn, C);
  s.be.convert(dh1.shaped(1, TC), dres.shaped(1, TC));  // the residual branch
  const View dffn = through_dropout(s, dtmp, dres, TC, l, kFfnOut);
  linear_grad(s, pattern_of(s, layer, &LayerPatterns::out), dgelu, g.out_w, g.out_b, dffn, a.gelu,
              w.out_w, W16(&LayerView::out_w), Tn, I, C,
              block_grads_of(s, layer, &LayerBlockGrads::out), over);
  s.tick();
  const BlockPattern* inter_pattern = pattern_of(s, layer, &LayerPatterns::inter);
  std::vector<float>* inter_blocks = block_grads_of(s, layer, &LayerBlockGrads::inter);
  if (!ffn_up_backward_16(s, a, g, dh1, dgelu, W16(&LayerView::inter_w), inter_pattern,
                          inter_blocks)) {
    // Under 16 bits grad.gelu_in is not held: a sparse up-projection takes GELU's input
    // gradient in fp32 from scratch.sparse_output.
    if (!dinter) dinter = sparse_output(s);
    gelu_grad(s, a, dinter, dgelu, TI);
    linear_grad(s, inter_pattern, dh1, g.inter_w, g.inter_b, dinter, a.h1, w.inter_w,
                W16(&LayerView::inter_w), Tn, C, I, inter_blocks, add);
  }
  s.tick();

  // h1 = LN1(r1), r1 = dropout(att . Wao) + in.
  ln_backward(s, dres, g.ln1_w, g.ln1_b, dh1, a.r1, w.ln1_w, a.ln1_mean, a.ln1_rstd, Tn, C);
  s.be.convert(dinp.shaped(1, TC), dres.shaped(1, TC));  // the residual branch
  const View dproj = through_dropout(s, dtmp, dres, TC, l, kAttnOut);
  linear_grad(s, pattern_of(s, layer, &LayerPatterns::attn_out), datt, g.attn_out_w, g.attn_out_b,
              dproj, a.att, w.attn_out_w, W16(&LayerView::attn_out_w), Tn, C, C,
              block_grads_of(s, layer, &LayerBlockGrads::attn_out), over);
  s.tick();
  attention_grad(s, layer, a, dqkv, datt);
  s.tick();
  linear_grad(s, pattern_of(s, layer, &LayerPatterns::qkv), dinp, g.qkv_w, g.qkv_b, dqkv, in,
              w.qkv_w, W16(&LayerView::qkv_w), Tn, C, 3 * C,
              block_grads_of(s, layer, &LayerBlockGrads::qkv), add);
}

}  // namespace packbert::model
