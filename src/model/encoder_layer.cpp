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
template <typename T, typename H, typename F>
void for_each_dropout_run(const StepContext<T, H>& s, int64_t n, uint32_t site, F f) {
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
template <typename T, typename H>
T* sparse_output(const StepContext<T, H>& s) {
  T* out = s.ws.get(Rec::sparse_out);
  if (!out) throw std::logic_error("scratch.sparse_output is not held for this step");
  return out;
}

// A scratch record as an op's working memory (kernels/backend_ops.inc: only its pointer and
// dtype count).
template <typename E>
View scratch(E* p) {
  return p ? View::vector(p, 0) : View();
}

// A tensor the step holds in T (x) or, under a 16-bit precision, in H (x16): the 16-bit one when
// it is held.
template <typename T, typename H>
View held(const T* x, const H* x16, int64_t rows, int64_t cols) {
  return x16 ? View(x16, rows, cols) : View(x, rows, cols);
}

// The step's linear layers: out = in . W^T + b, out in T or (under 16 bits, for an output only
// 16-bit readers take: q | k | v, GELU's input) in H. Dense with 16-bit weights W16: the 16-bit
// operands in16 and W16 (a 16-bit out is rounded once, inside the GEMM). Block-sparse when the
// layer has a pattern: W holds its kept blocks' values (fp32 under every precision); the input
// is in16 for a 16-bit out (the fp32 result, in scratch.sparse_output, is rounded after), else
// in when held, else in16.
template <typename T, typename H>
void linear(const StepContext<T, H>& s, const BlockPattern* pattern, View out, const T* in,
            const H* in16, const T* W, const H* W16, const T* b, int N, int C, int OC) {
  const Backend& be = s.be;
  const View bias = View::vector(b, OC);
  if (!pattern) {
    be.linear_forward(out, W16 ? View(in16, N, C) : View(in, N, C),
                      W16 ? View(W16, OC, C) : View(W, OC, C), bias, nullptr, View());
    return;
  }
  const View values = View::vector(W, pattern->values_size());
  const View sparse = scratch(s.ws.get(Rec::sparse));
  if (traits(out.dtype).is_16bit) {
    const View y(sparse_output(s), N, OC);
    be.linear_forward(y, View(in16, N, C), values, bias, pattern, sparse);
    return be.convert(out, y);
  }
  be.linear_forward(out, in ? View(in, N, C) : View(in16, N, C), values, bias, pattern, sparse);
}

// mode: how dinp is written (a fresh buffer is overwritten). block_l1, when given (gradient
// regrow, a sparse layer), also receives the block L1 norms of the dense weight gradient, from
// the operands the layer's dense form would multiply.
template <typename T, typename H>
void linear_grad(const StepContext<T, H>& s, const BlockPattern* pattern, T* dinp, T* dW, T* db,
                 const T* dout, const T* in, const H* in16, const T* W, const H* W16, int N, int C,
                 int OC, std::vector<float>* block_l1, GradWrite mode) {
  const Backend& be = s.be;
  const View dy(dout, N, OC), dbias = View::vector(db, OC);
  if (!pattern) {
    if (block_l1) throw std::logic_error("block gradients are for block-sparse layers");
    be.linear_backward(View(dinp, N, C), View(dW, OC, C), dbias, dy,
                       W16 ? View(in16, N, C) : View(in, N, C),
                       W16 ? View(W16, OC, C) : View(W, OC, C), nullptr, mode,
                       W16 ? scratch(s.ws.template get16<H>(Rec::dout16)) : View());
    return;
  }
  const View x = in ? View(in, N, C) : View(in16, N, C);
  if (block_l1)
    be.linear_block_grad_norms(View(block_l1->data(), OC / pattern->block, C / pattern->block), dy,
                               x, pattern->block, scratch(s.dense_scratch),
                               in ? View() : scratch(s.ws.template get16<H>(Rec::dout16)));
  const int64_t nv = pattern->values_size();
  be.linear_backward(View(dinp, N, C), View::vector(dW, nv), dbias, dy, x, View::vector(W, nv),
                     pattern, mode, scratch(s.ws.get(Rec::sparse)));
}

// The block gradient norms backward collects for one of a layer's linear layers, or null.
template <typename T, typename H>
std::vector<float>* block_grads_of(const StepContext<T, H>& s, int layer,
                                   std::vector<float> LayerBlockGrads::*which) {
  return s.block_grads ? &(s.block_grads[layer].*which) : nullptr;
}

// A layer's pattern of one of its linear layers, or null when the model is dense.
template <typename T, typename H>
const BlockPattern* pattern_of(const StepContext<T, H>& s, int layer,
                               BlockPattern LayerPatterns::*which) {
  return s.patterns ? &(s.patterns[layer].*which) : nullptr;
}

// A residual sum r = dropout(x) + skip at (layer, site): in T, or under 16 bits from the H
// skip16, rounded once into r16. x is the linear layer's output in scratch (overwritten in the
// 16-bit case).
template <typename T, typename H>
void residual_site(const StepContext<T, H>& s, T* r, H* r16, T* x, const T* skip, const H* skip16,
                   int64_t n, uint32_t layer, uint32_t site) {
  if (r16) {
    dropout_site(s, x, x, n, layer, site);
    return s.be.residual_forward(View::vector(r16, n), View::vector(x, n), View::vector(skip16, n));
  }
  dropout_site(s, r, x, n, layer, site);
  s.be.residual_forward(View::vector(r, n), View::vector(r, n), View::vector(skip, n));
}

// LayerNorm forward and backward (dinp written over: each call's is a fresh buffer) from a
// residual sum stored in T (inp) or H (inp16).
template <typename T, typename H>
void ln_forward(const StepContext<T, H>& s, T* out, T* mean, T* rstd, const T* inp, const H* inp16,
                const T* w, const T* b, int N, int C, H* out16) {
  s.be.layernorm_forward(View(out, N, C), View::vector(mean, N), View::vector(rstd, N),
                         held(inp, inp16, N, C), View::vector(w, C), View::vector(b, C),
                         s.config.layer_norm_eps, View(out16, N, C));
}
template <typename T, typename H>
void ln_backward(const StepContext<T, H>& s, T* dinp, T* dw, T* db, const T* dout, const T* inp,
                 const H* inp16, const T* w, const T* mean, const T* rstd, int N, int C) {
  s.be.layernorm_backward(View(dinp, N, C), View::vector(dw, C), View::vector(db, C),
                          View(dout, N, C), held(inp, inp16, N, C), View::vector(w, C),
                          View::vector(mean, N), View::vector(rstd, N), GradWrite::overwrite);
}

}  // namespace

template <typename T, typename H>
void ln_apply(const StepContext<T, H>& s, T* out, const T* inp, const H* inp16, const T* mean,
              const T* rstd, const T* w, const T* b, int N, int C, H* out16) {
  s.be.layernorm_apply(View(out, N, C), held(inp, inp16, N, C), View::vector(mean, N),
                       View::vector(rstd, N), View::vector(w, C), View::vector(b, C),
                       View(out16, N, C));
}

namespace {

// GELU's output from its input: both T, or both H under a 16-bit precision.
template <typename T, typename H>
void gelu_out(const StepContext<T, H>& s, const LayerRecord<T, H>& a, int64_t n) {
  if (a.gelu16) return s.be.gelu_forward(View::vector(a.gelu16, n), View::vector(a.inter16, n));
  s.be.gelu_forward(View::vector(a.gelu, n), View::vector(a.inter, n));
}
// dinter, written over, from GELU's input as kept (T, or H under a 16-bit precision).
template <typename T, typename H>
void gelu_grad(const StepContext<T, H>& s, const LayerRecord<T, H>& a, T* dinter, const T* dgelu,
               int64_t n) {
  s.be.gelu_backward(View::vector(dinter, n), View(), held(a.inter, a.inter16, 1, n),
                     View::vector(dgelu, n), GradWrite::overwrite);
}

// GELU's and the FFN up-projection's backward under 16 bits, dense: GELU's gradient goes
// straight to the projection's 16-bit GEMM operand and bias gradient (gelu_backward with a
// 16-bit dinp), never to memory in fp32; dh1 += its input gradient. False (nothing done) where
// that path does not apply: T storage, a sparse layer, or block gradients wanted.
template <typename T, typename H>
bool ffn_up_backward_16(const StepContext<T, H>& s, const LayerRecord<T, H>& a,
                        const LayerView<T>& g, T* dh1, const T* dgelu, const H* W16,
                        const BlockPattern* pattern, const std::vector<float>* block_l1) {
  if (!a.inter16 || !W16 || pattern || block_l1) return false;
  const int Tn = s.T_(), C = s.config.hidden_size, I = s.config.intermediate_size;
  const View d16(s.ws.template get16<H>(Rec::dout16), Tn, I);
  s.be.gelu_backward(d16, View::vector(g.inter_b, I), View(a.inter16, Tn, I), View(dgelu, Tn, I),
                     GradWrite::overwrite);
  s.be.linear_backward(View(dh1, Tn, C), View(g.inter_w, I, C), View(), d16, View(a.h1_16, Tn, C),
                       View(W16, I, C), nullptr, GradWrite::accumulate, View());
  return true;
}

template <typename T, typename H>
AttentionDropout attention_dropout(const StepContext<T, H>& s, int layer) {
  return {s.p_attn, s.seed, dropout_key(s.step, static_cast<uint32_t>(layer), kAttnProbs),
          s.places && !s.places->attention.empty() ? s.places->attention.data() : nullptr};
}

// The attention probabilities as kept (T, or H under a 16-bit precision; empty when rebuilt).
template <typename T, typename H>
View probs_of(const StepContext<T, H>& s, const LayerRecord<T, H>& a) {
  const int64_t n = s.probs_offsets[s.n_seq()];
  return a.qkv16 ? View::vector(a.probs16, n) : View::vector(a.probs, n);
}

// dqkv, written over, from the attention output's gradient and q | k | v and the probabilities
// as kept (T, or H under a 16-bit precision).
template <typename T, typename H>
void attention_grad(const StepContext<T, H>& s, int layer, const LayerRecord<T, H>& a, T* dqkv,
                    const T* datt) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  s.be.attention_backward(View(dqkv, Tn, 3 * C), View(datt, Tn, C), held(a.qkv, a.qkv16, Tn, 3 * C),
                          probs_of(s, a), s.tokens.cu_seqlens.data(), s.n_seq(),
                          s.config.num_attention_heads, attention_dropout(s, layer),
                          s.probs_offsets, scratch(s.ws.get(Rec::attn_work)), GradWrite::overwrite);
}

}  // namespace

template <typename T, typename H>
void dropout_site(const StepContext<T, H>& s, T* out, const T* inp, int64_t n, uint32_t layer,
                  uint32_t site) {
  if (s.p_hidden > 0) {
    const uint64_t key = dropout_key(s.step, layer, site);
    for_each_dropout_run(s, n, site, [&](int64_t a, int64_t b, uint64_t first) {
      s.be.dropout_forward(View::vector(out + a, b - a), View::vector(inp + a, b - a), s.p_hidden,
                           s.seed, key, first);
    });
  } else if (out != inp) {
    s.be.convert(View::vector(out, n), View::vector(inp, n));
  }
}

template <typename T, typename H>
void dropout_site_backward(const StepContext<T, H>& s, T* dinp, const T* dout, int64_t n,
                           uint32_t layer, uint32_t site) {
  const uint64_t key = dropout_key(s.step, layer, site);
  for_each_dropout_run(s, n, site, [&](int64_t a, int64_t b, uint64_t first) {
    s.be.dropout_backward(View::vector(dinp + a, b - a), View::vector(dout + a, b - a), s.p_hidden,
                          s.seed, key, first);
  });
}

namespace {

// The gradient through a dropout site: dout itself when dropout is off, else the masked copy in
// scratch, written over it (dropout's backward is its forward's mask and scale applied to dout).
template <typename T, typename H>
const T* through_dropout(const StepContext<T, H>& s, T* scratch, const T* dout, int64_t n,
                         uint32_t layer, uint32_t site) {
  if (s.p_hidden <= 0) return dout;
  dropout_site(s, scratch, dout, n, layer, site);
  return scratch;
}

// The three embedding tables of p (the word table in bf16 under bf16 master weights, where
// p.word is null).
template <typename T, typename H>
std::array<View, 3> embedding_tables(const StepContext<T, H>& s, const ParamView<T>& p) {
  const BertConfig& c = s.config;
  const int64_t C = c.hidden_size;
  return {p.word ? View(p.word, c.vocab_size, C) : View(s.p16->word, c.vocab_size, C),
          View(p.position, c.max_position_embeddings, C), View(p.token_type, c.type_vocab_size, C)};
}

}  // namespace

template <typename T, typename H>
void embeddings_forward(const StepContext<T, H>& s, const ParamView<T>& p, const int32_t* ids,
                        const int32_t* pos, const int32_t* types, T* out) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  T* sum = s.ws.get(Rec::emb_sum);
  T* ln = s.p_hidden > 0 ? s.ws.get(Rec::tmp) : out;
  const auto [word, position, token_type] = embedding_tables(s, p);
  s.be.embedding_forward(View(sum, Tn, C), ids, pos, types, word, position, token_type);
  s.be.layernorm_forward(View(ln, Tn, C), View::vector(s.ws.get(Rec::emb_mean), Tn),
                         View::vector(s.ws.get(Rec::emb_rstd), Tn), View(sum, Tn, C),
                         View::vector(p.emb_ln_w, C), View::vector(p.emb_ln_b, C),
                         s.config.layer_norm_eps, View());
  if (s.p_hidden > 0) dropout_site(s, out, ln, static_cast<int64_t>(Tn) * C, kNoLayer, kEmbeddings);
}

template <typename T, typename H>
void embeddings_backward(const StepContext<T, H>& s, const ParamView<T>& p, const ParamView<T>& g,
                         const int32_t* ids, const int32_t* pos, const int32_t* types,
                         const T* dout) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  const int64_t TC = static_cast<int64_t>(Tn) * C;
  const T* dln = through_dropout(s, s.ws.get(Rec::dtmp), dout, TC, kNoLayer, kEmbeddings);
  T* dsum = s.ws.get(Rec::dres);
  s.be.layernorm_backward(View(dsum, Tn, C), View::vector(g.emb_ln_w, C),
                          View::vector(g.emb_ln_b, C), View(dln, Tn, C),
                          View(s.ws.get(Rec::emb_sum), Tn, C), View::vector(p.emb_ln_w, C),
                          View::vector(s.ws.get(Rec::emb_mean), Tn),
                          View::vector(s.ws.get(Rec::emb_rstd), Tn), GradWrite::overwrite);
  const auto [dword, dposition, dtoken_type] = embedding_tables(s, g);
  s.be.embedding_backward(dword, dposition, dtoken_type, View(dsum, Tn, C), ids, pos, types);
}

template <typename T, typename H>
void encoder_layer_forward(const StepContext<T, H>& s, int layer, const LayerView<T>& w,
                           const LayerRecord<T, H>& a, const T* in, T* out, const H* in16,
                           H* out16) {
  const BertConfig& c = s.config;
  const int Tn = s.T_(), C = c.hidden_size, I = c.intermediate_size;
  const int64_t TC = static_cast<int64_t>(Tn) * C;
  const uint32_t l = static_cast<uint32_t>(layer);
  const LayerView<H>* w16 = s.p16 ? &s.p16->layers[layer] : nullptr;
  auto W16 = [&](H* LayerView<H>::*field) { return w16 ? w16->*field : nullptr; };
  T* tmp = s.ws.get(Rec::tmp);

  // q | k | v and the attention output: 16-bit under a 16-bit precision (written by the GEMM,
  // read by attention).
  const View qkv = w16 ? View(a.qkv16, Tn, 3 * C) : View(a.qkv, Tn, 3 * C);
  linear(s, pattern_of(s, layer, &LayerPatterns::qkv), qkv, in, in16, w.qkv_w,
         W16(&LayerView<H>::qkv_w), w.qkv_b, Tn, C, 3 * C);
  s.be.attention_forward(w16 ? View(a.att16, Tn, C) : View(a.att, Tn, C), probs_of(s, a), qkv,
                         s.tokens.cu_seqlens.data(), s.n_seq(), c.num_attention_heads,
                         attention_dropout(s, layer), s.probs_offsets,
                         scratch(s.ws.get(Rec::attn_work)));
  linear(s, pattern_of(s, layer, &LayerPatterns::attn_out), View(tmp, Tn, C), a.att, a.att16,
         w.attn_out_w, W16(&LayerView<H>::attn_out_w), w.attn_out_b, Tn, C, C);
  residual_site(s, a.r1, a.r1_16, tmp, in, in16, TC, l, kAttnOut);
  ln_forward(s, a.h1, a.ln1_mean, a.ln1_rstd, a.r1, a.r1_16, w.ln1_w, w.ln1_b, Tn, C, a.h1_16);
  linear(s, pattern_of(s, layer, &LayerPatterns::inter),
         w16 ? View(a.inter16, Tn, I) : View(a.inter, Tn, I), a.h1, a.h1_16, w.inter_w,
         W16(&LayerView<H>::inter_w), w.inter_b, Tn, C, I);
  gelu_out(s, a, static_cast<int64_t>(Tn) * I);
  linear(s, pattern_of(s, layer, &LayerPatterns::out), View(tmp, Tn, C), a.gelu, a.gelu16, w.out_w,
         W16(&LayerView<H>::out_w), w.out_b, Tn, I, C);
  residual_site(s, a.r2, a.r2_16, tmp, a.h1, a.h1_16, TC, l, kFfnOut);
  ln_forward(s, out, a.ln2_mean, a.ln2_rstd, a.r2, a.r2_16, w.ln2_w, w.ln2_b, Tn, C, out16);
}

template <typename T, typename H>
void encoder_layer_backward(const StepContext<T, H>& s, int layer, const LayerView<T>& w,
                            const LayerView<T>& g, const LayerRecord<T, H>& a, const T* in,
                            const T* dout, T* dinp, const H* in16) {
  const BertConfig& c = s.config;
  const int Tn = s.T_(), C = c.hidden_size, I = c.intermediate_size;
  const int64_t TC = static_cast<int64_t>(Tn) * C, TI = static_cast<int64_t>(Tn) * I;
  const uint32_t l = static_cast<uint32_t>(layer);
  const Workspace<T>& ws = s.ws;
  T *dres = ws.get(Rec::dres), *dh1 = ws.get(Rec::dh1), *dtmp = ws.get(Rec::dtmp),
    *datt = ws.get(Rec::datt), *dqkv = ws.get(Rec::dqkv), *dinter = ws.get(Rec::dinter),
    *dgelu = ws.get(Rec::dgelu);
  const LayerView<H>* w16 = s.p16 ? &s.p16->layers[layer] : nullptr;
  auto W16 = [&](H* LayerView<H>::*field) { return w16 ? w16->*field : nullptr; };

  // Rebuild what the policy did not keep (the same kernels on the same inputs: bit for bit).
  if (s.policy.residual) {  // r1 = dropout(att . Wao + b) + in
    T* tmp = ws.get(Rec::tmp);
    linear(s, pattern_of(s, layer, &LayerPatterns::attn_out), View(tmp, Tn, C), a.att, a.att16,
           w.attn_out_w, W16(&LayerView<H>::attn_out_w), w.attn_out_b, Tn, C, C);
    residual_site(s, a.r1, a.r1_16, tmp, in, in16, TC, l, kAttnOut);
  }
  if (s.policy.ln)
    ln_apply(s, a.h1, a.r1, a.r1_16, a.ln1_mean, a.ln1_rstd, w.ln1_w, w.ln1_b, Tn, C, a.h1_16);
  if (s.policy.gelu) gelu_out(s, a, TI);

  // out = LN2(r2), r2 = dropout(gelu . Wo) + h1.
  // Each buffer is written over where first written (not zeroed, then added to).
  constexpr GradWrite over = GradWrite::overwrite, add = GradWrite::accumulate;
  ln_backward(s, dres, g.ln2_w, g.ln2_b, dout, a.r2, a.r2_16, w.ln2_w, a.ln2_mean, a.ln2_rstd, Tn,
              C);
  s.be.convert(View::vector(dh1, TC), View::vector(dres, TC));  // the residual branch
  const T* dffn = through_dropout(s, dtmp, dres, TC, l, kFfnOut);
  linear_grad(s, pattern_of(s, layer, &LayerPatterns::out), dgelu, g.out_w, g.out_b, dffn, a.gelu,
              a.gelu16, w.out_w, W16(&LayerView<H>::out_w), Tn, I, C,
              block_grads_of(s, layer, &LayerBlockGrads::out), over);
  const BlockPattern* inter_pattern = pattern_of(s, layer, &LayerPatterns::inter);
  std::vector<float>* inter_blocks = block_grads_of(s, layer, &LayerBlockGrads::inter);
  if (!ffn_up_backward_16(s, a, g, dh1, dgelu, W16(&LayerView<H>::inter_w), inter_pattern,
                          inter_blocks)) {
    // Under 16 bits grad.gelu_in is not held: a sparse up-projection takes GELU's input
    // gradient in fp32 from scratch.sparse_output.
    if (!dinter) dinter = sparse_output(s);
    gelu_grad(s, a, dinter, dgelu, TI);
    linear_grad(s, inter_pattern, dh1, g.inter_w, g.inter_b, dinter, a.h1, a.h1_16, w.inter_w,
                W16(&LayerView<H>::inter_w), Tn, C, I, inter_blocks, add);
  }

  // h1 = LN1(r1), r1 = dropout(att . Wao) + in.
  ln_backward(s, dres, g.ln1_w, g.ln1_b, dh1, a.r1, a.r1_16, w.ln1_w, a.ln1_mean, a.ln1_rstd, Tn,
              C);
  s.be.convert(View::vector(dinp, TC), View::vector(dres, TC));  // the residual branch
  const T* dproj = through_dropout(s, dtmp, dres, TC, l, kAttnOut);
  linear_grad(s, pattern_of(s, layer, &LayerPatterns::attn_out), datt, g.attn_out_w, g.attn_out_b,
              dproj, a.att, a.att16, w.attn_out_w, W16(&LayerView<H>::attn_out_w), Tn, C, C,
              block_grads_of(s, layer, &LayerBlockGrads::attn_out), over);
  attention_grad(s, layer, a, dqkv, datt);
  linear_grad(s, pattern_of(s, layer, &LayerPatterns::qkv), dinp, g.qkv_w, g.qkv_b, dqkv, in, in16,
              w.qkv_w, W16(&LayerView<H>::qkv_w), Tn, C, 3 * C,
              block_grads_of(s, layer, &LayerBlockGrads::qkv), add);
}

#define PACKBERT_INSTANTIATE(T, H)                                                                 \
  template void dropout_site<T, H>(const StepContext<T, H>&, T*, const T*, int64_t, uint32_t,      \
                                   uint32_t);                                                      \
  template void dropout_site_backward<T, H>(const StepContext<T, H>&, T*, const T*, int64_t,       \
                                            uint32_t, uint32_t);                                   \
  template void embeddings_forward<T, H>(const StepContext<T, H>&, const ParamView<T>&,            \
                                         const int32_t*, const int32_t*, const int32_t*, T*);      \
  template void embeddings_backward<T, H>(const StepContext<T, H>&, const ParamView<T>&,           \
                                          const ParamView<T>&, const int32_t*, const int32_t*,     \
                                          const int32_t*, const T*);                               \
  template void ln_apply<T, H>(const StepContext<T, H>&, T*, const T*, const H*, const T*,         \
                               const T*, const T*, const T*, int, int, H*);                        \
  template void encoder_layer_forward<T, H>(const StepContext<T, H>&, int, const LayerView<T>&,    \
                                            const LayerRecord<T, H>&, const T*, T*, const H*, H*); \
  template void encoder_layer_backward<T, H>(const StepContext<T, H>&, int, const LayerView<T>&,   \
                                             const LayerView<T>&, const LayerRecord<T, H>&,        \
                                             const T*, const T*, T*, const H*);
PACKBERT_INSTANTIATE(float, bf16)
PACKBERT_INSTANTIATE(float, f16)
PACKBERT_INSTANTIATE(double, bf16)
#undef PACKBERT_INSTANTIATE

}  // namespace packbert::model
