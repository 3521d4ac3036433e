#include "model/encoder_layer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/dropout.h"
#include "kernels/gemm.h"
#include "kernels/layers.h"
#include "kernels/sparse.h"

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

// The step's linear layers: out = in . W^T + b with fp32 operands, or with the 16-bit twins (H) of
// the input and weight when the caller passes them (T = float, a 16-bit precision), or block-sparse
// when the layer has a pattern (W then holds its kept blocks' values, in fp32 under every
// precision; under 16 bits the kernel reads the 16-bit input, in is null).
template <typename T, typename H>
void linear(const StepContext<T, H>& s, const BlockPattern* pattern, T* out, const T* in,
            const H* in16, const T* W, const H* W16, const T* b, int N, int C, int OC) {
  if (pattern) {
    T* scratch = s.ws.get(Rec::sparse);
    if constexpr (std::is_same_v<T, float>)
      if (!in) return sparse_linear_forward(out, in16, *pattern, W, b, N, scratch);
    return sparse_linear_forward(out, in, *pattern, W, b, N, scratch);
  }
  if constexpr (std::is_same_v<T, float>)
    if (W16) return linear_forward(out, in16, W16, b, N, C, OC);
  linear_forward(out, in, W, b, N, C, OC);
}
// The same under a 16-bit precision for an output only 16-bit readers take (q | k | v, GELU's
// input): the fp32 sum plus bias rounded once, inside the GEMM when dense, after the block-sparse
// kernel (from scratch.sparse_output) when sparse.
template <typename H>
void linear_to16(const StepContext<float, H>& s, const BlockPattern* pattern, H* out16,
                 const H* in16, const float* W, const H* W16, const float* b, int N, int C,
                 int OC) {
  if (!pattern) return linear_forward(out16, in16, W16, b, N, C, OC);
  float* y = sparse_output(s);
  sparse_linear_forward(y, in16, *pattern, W, b, N, s.ws.get(Rec::sparse));
  to_half(out16, y, static_cast<int64_t>(N) * OC);
}
// block_l1[rb * C / B + cb] += the L1 norm of block (rb, cb) of dout^T . in, the dense weight
// gradient (formed in s.dense_scratch): from fp32 operands, or under 16 bits (in null) from
// in16 and dout rounded to 16 bits (scratch.grad_bf16), as a dense 16-bit layer's weight
// gradient is formed.
template <typename T, typename H>
void add_block_grads(const StepContext<T, H>& s, std::vector<float>& block_l1, const T* dout,
                     const T* in, const H* in16, int N, int C, int OC, int B) {
  T* dW = s.dense_scratch;
  if (in) {
    gemm(true, false, OC, C, N, T(1), dout, OC, in, C, T(0), dW, C);
  } else if constexpr (std::is_same_v<T, float>) {
    H* dout16 = s.ws.template get16<H>(Rec::dout16);
    to_half(dout16, dout, static_cast<int64_t>(N) * OC);
    gemm(true, false, OC, C, N, 1.0f, dout16, OC, in16, C, 0.0f, dW, C);
  }
  const int Cb = C / B;
#pragma omp parallel for schedule(static)
  for (int rb = 0; rb < OC / B; ++rb)
    for (int o = 0; o < B; ++o)
      for (int c = 0; c < C; ++c)
        block_l1[static_cast<size_t>(rb) * Cb + c / B] +=
            static_cast<float>(std::abs(dW[static_cast<int64_t>(rb * B + o) * C + c]));
}

// mode: how dinp is written (a fresh buffer is overwritten: the dense GEMM runs with beta 0).
template <typename T, typename H>
void linear_grad(const StepContext<T, H>& s, const BlockPattern* pattern, T* dinp, T* dW, T* db,
                 const T* dout, const T* in, const H* in16, const T* W, const H* W16, int N, int C,
                 int OC, std::vector<float>* block_l1, GradWrite mode) {
  if (pattern) {
    if (block_l1) add_block_grads(s, *block_l1, dout, in, in16, N, C, OC, pattern->block);
    if (mode == GradWrite::overwrite) zero_fill(dinp, static_cast<int64_t>(N) * C);
    T* scratch = s.ws.get(Rec::sparse);
    if constexpr (std::is_same_v<T, float>)
      if (!in) return sparse_linear_backward(dinp, dW, db, dout, in16, *pattern, W, N, scratch);
    return sparse_linear_backward(dinp, dW, db, dout, in, *pattern, W, N, scratch);
  }
  if (block_l1) throw std::logic_error("block gradients are for block-sparse layers");
  if constexpr (std::is_same_v<T, float>)
    if (W16)
      return linear_backward(dinp, dW, db, dout, s.ws.template get16<H>(Rec::dout16), in16, W16, N,
                             C, OC, mode);
  linear_backward(dinp, dW, db, dout, in, W, N, C, OC, mode);
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
  if constexpr (std::is_same_v<T, float>) {
    if (r16) {
      dropout_site(s, x, x, n, layer, site);
      return residual_forward(r16, x, skip16, n);
    }
  }
  dropout_site(s, r, x, n, layer, site);
  residual_forward(r, r, skip, n);
}

// LayerNorm forward, rebuild and backward from a residual sum stored in T (inp) or H (inp16).
template <typename T, typename H>
void ln_forward(T* out, T* mean, T* rstd, const T* inp, const H* inp16, const T* w, const T* b,
                int N, int C, T eps, H* out16) {
  if constexpr (std::is_same_v<T, float>)
    if (inp16) return layernorm_forward(out, mean, rstd, inp16, w, b, N, C, eps, out16);
  layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps, out16);
}
// Writes dinp over (each call's dinp is a fresh buffer).
template <typename T, typename H>
void ln_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const H* inp16, const T* w,
                 const T* mean, const T* rstd, int N, int C) {
  constexpr GradWrite over = GradWrite::overwrite;
  if constexpr (std::is_same_v<T, float>)
    if (inp16) return layernorm_backward(dinp, dw, db, dout, inp16, w, mean, rstd, N, C, over);
  layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, over);
}

}  // namespace

template <typename T, typename H>
void ln_apply(T* out, const T* inp, const H* inp16, const T* mean, const T* rstd, const T* w,
              const T* b, int N, int C, H* out16) {
  if constexpr (std::is_same_v<T, float>)
    if (inp16) return layernorm_apply(out, inp16, mean, rstd, w, b, N, C, out16);
  layernorm_apply(out, inp, mean, rstd, w, b, N, C, out16);
}

namespace {

// GELU's output from its input: both T, or both H under a 16-bit precision.
template <typename T, typename H>
void gelu_out(const LayerRecord<T, H>& a, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    if (a.gelu16) return gelu_forward(a.gelu16, a.inter16, n);
  gelu_forward(a.gelu, a.inter, n);
}
// dinter, written over, from GELU's input as kept (T, or H under a 16-bit precision).
template <typename T, typename H>
void gelu_grad(const LayerRecord<T, H>& a, T* dinter, const T* dgelu, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    if (a.inter16) return gelu_backward(dinter, a.inter16, dgelu, n, GradWrite::overwrite);
  gelu_backward(dinter, a.inter, dgelu, n, GradWrite::overwrite);
}

// GELU's and the FFN up-projection's backward under 16 bits, dense: GELU's gradient goes
// straight to the projection's 16-bit GEMM operand and bias gradient (gelu_backward_to_half),
// never to memory in fp32; dh1 += its input gradient. False (nothing done) where that path does
// not apply: T storage, a sparse layer, or block gradients wanted.
template <typename T, typename H>
bool ffn_up_backward_16(const StepContext<T, H>& s, const LayerRecord<T, H>& a,
                        const LayerView<T>& g, T* dh1, const T* dgelu, const H* W16,
                        const BlockPattern* pattern, const std::vector<float>* block_l1) {
  if constexpr (std::is_same_v<T, float>) {
    if (!a.inter16 || !W16 || pattern || block_l1) return false;
    const int Tn = s.T_(), C = s.config.hidden_size, I = s.config.intermediate_size;
    H* d16 = s.ws.template get16<H>(Rec::dout16);
    gelu_backward_to_half(d16, g.inter_b, a.inter16, dgelu, Tn, I);
    linear_backward(dh1, g.inter_w, d16, a.h1_16, W16, Tn, C, I, GradWrite::accumulate);
    return true;
  }
  return false;
}

template <typename T, typename H>
AttentionDropout attention_dropout(const StepContext<T, H>& s, int layer) {
  return {s.p_attn, s.seed, dropout_key(s.step, static_cast<uint32_t>(layer), kAttnProbs),
          s.places && !s.places->attention.empty() ? s.places->attention.data() : nullptr};
}

// dqkv, written over, from the attention output's gradient and q | k | v and the probabilities
// as kept (T, or H under a 16-bit precision).
template <typename T, typename H>
void attention_grad(const StepContext<T, H>& s, int layer, const LayerRecord<T, H>& a, T* dqkv,
                    const T* datt) {
  const int C = s.config.hidden_size, NH = s.config.num_attention_heads;
  const int32_t* cu = s.tokens.cu_seqlens.data();
  const AttentionWork<T> work{s.probs_offsets, s.ws.get(Rec::attn_work)};
  const AttentionDropout drop = attention_dropout(s, layer);
  constexpr GradWrite over = GradWrite::overwrite;
  if constexpr (std::is_same_v<T, float>)
    if (a.qkv16)
      return attention_backward(dqkv, datt, a.qkv16, a.probs16, cu, s.n_seq(), C, NH, drop, work,
                                over);
  attention_backward(dqkv, datt, a.qkv, a.probs, cu, s.n_seq(), C, NH, drop, work, over);
}

}  // namespace

template <typename T, typename H>
void dropout_site(const StepContext<T, H>& s, T* out, const T* inp, int64_t n, uint32_t layer,
                  uint32_t site) {
  if (s.p_hidden > 0) {
    const uint64_t key = dropout_key(s.step, layer, site);
    for_each_dropout_run(s, n, site, [&](int64_t a, int64_t b, uint64_t first) {
      dropout_forward(out + a, inp + a, b - a, s.p_hidden, s.seed, key, first);
    });
  } else if (out != inp) {
    std::copy(inp, inp + n, out);
  }
}

template <typename T, typename H>
void dropout_site_backward(const StepContext<T, H>& s, T* dinp, const T* dout, int64_t n,
                           uint32_t layer, uint32_t site) {
  const uint64_t key = dropout_key(s.step, layer, site);
  for_each_dropout_run(s, n, site, [&](int64_t a, int64_t b, uint64_t first) {
    dropout_backward(dinp + a, dout + a, b - a, s.p_hidden, s.seed, key, first);
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

}  // namespace

template <typename T, typename H>
void embeddings_forward(const StepContext<T, H>& s, const ParamView<T>& p, const int32_t* ids,
                        const int32_t* pos, const int32_t* types, T* out) {
  const int Tn = s.T_(), C = s.config.hidden_size;
  T* sum = s.ws.get(Rec::emb_sum);
  T* ln = s.p_hidden > 0 ? s.ws.get(Rec::tmp) : out;
  // Under bf16 master weights the word embeddings exist in bf16 only (p.word is null).
  if constexpr (std::is_same_v<T, float> && std::is_same_v<H, bf16>)
    if (!p.word)
      embedding_forward(sum, ids, pos, types, s.p16->word, p.position, p.token_type, Tn, C);
  if (p.word) embedding_forward(sum, ids, pos, types, p.word, p.position, p.token_type, Tn, C);
  layernorm_forward(ln, s.ws.get(Rec::emb_mean), s.ws.get(Rec::emb_rstd), sum, p.emb_ln_w,
                    p.emb_ln_b, Tn, C, static_cast<T>(s.config.layer_norm_eps));
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
  layernorm_backward(dsum, g.emb_ln_w, g.emb_ln_b, dln, s.ws.get(Rec::emb_sum), p.emb_ln_w,
                     s.ws.get(Rec::emb_mean), s.ws.get(Rec::emb_rstd), Tn, C, GradWrite::overwrite);
  embedding_backward(g.word, g.position, g.token_type, dsum, ids, pos, types, Tn, C);
}

template <typename T, typename H>
void encoder_layer_forward(const StepContext<T, H>& s, int layer, const LayerView<T>& w,
                           const LayerRecord<T, H>& a, const T* in, T* out, const H* in16,
                           H* out16) {
  const BertConfig& c = s.config;
  const int Tn = s.T_(), C = c.hidden_size, I = c.intermediate_size;
  const int64_t TC = static_cast<int64_t>(Tn) * C;
  const T eps = static_cast<T>(c.layer_norm_eps);
  const uint32_t l = static_cast<uint32_t>(layer);
  const LayerView<H>* w16 = s.p16 ? &s.p16->layers[layer] : nullptr;
  auto W16 = [&](H* LayerView<H>::*field) { return w16 ? w16->*field : nullptr; };
  T* tmp = s.ws.get(Rec::tmp);
  const AttentionWork<T> work{s.probs_offsets, s.ws.get(Rec::attn_work)};

  const AttentionDropout drop = attention_dropout(s, layer);
  const int32_t* cu = s.tokens.cu_seqlens.data();
  // q | k | v and the attention output: 16-bit under a 16-bit precision (written by the GEMM,
  // read by attention).
  if constexpr (std::is_same_v<T, float>) {
    if (w16) {
      linear_to16(s, pattern_of(s, layer, &LayerPatterns::qkv), a.qkv16, in16, w.qkv_w, w16->qkv_w,
                  w.qkv_b, Tn, C, 3 * C);
      attention_forward(a.att16, a.probs16, a.qkv16, cu, s.n_seq(), C, c.num_attention_heads, drop,
                        work);
    }
  }
  if (!w16) {
    linear(s, pattern_of(s, layer, &LayerPatterns::qkv), a.qkv, in, in16, w.qkv_w,
           static_cast<const H*>(nullptr), w.qkv_b, Tn, C, 3 * C);
    attention_forward(a.att, a.probs, a.qkv, cu, s.n_seq(), C, c.num_attention_heads, drop, work);
  }
  linear(s, pattern_of(s, layer, &LayerPatterns::attn_out), tmp, a.att, a.att16, w.attn_out_w,
         W16(&LayerView<H>::attn_out_w), w.attn_out_b, Tn, C, C);
  residual_site(s, a.r1, a.r1_16, tmp, in, in16, TC, l, kAttnOut);
  ln_forward(a.h1, a.ln1_mean, a.ln1_rstd, a.r1, a.r1_16, w.ln1_w, w.ln1_b, Tn, C, eps, a.h1_16);
  if constexpr (std::is_same_v<T, float>) {
    if (w16)
      linear_to16(s, pattern_of(s, layer, &LayerPatterns::inter), a.inter16, a.h1_16, w.inter_w,
                  w16->inter_w, w.inter_b, Tn, C, I);
  }
  if (!w16)
    linear(s, pattern_of(s, layer, &LayerPatterns::inter), a.inter, a.h1, a.h1_16, w.inter_w,
           static_cast<const H*>(nullptr), w.inter_b, Tn, C, I);
  gelu_out(a, static_cast<int64_t>(Tn) * I);
  linear(s, pattern_of(s, layer, &LayerPatterns::out), tmp, a.gelu, a.gelu16, w.out_w,
         W16(&LayerView<H>::out_w), w.out_b, Tn, I, C);
  residual_site(s, a.r2, a.r2_16, tmp, a.h1, a.h1_16, TC, l, kFfnOut);
  ln_forward(out, a.ln2_mean, a.ln2_rstd, a.r2, a.r2_16, w.ln2_w, w.ln2_b, Tn, C, eps, out16);
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
    linear(s, pattern_of(s, layer, &LayerPatterns::attn_out), tmp, a.att, a.att16, w.attn_out_w,
           W16(&LayerView<H>::attn_out_w), w.attn_out_b, Tn, C, C);
    residual_site(s, a.r1, a.r1_16, tmp, in, in16, TC, l, kAttnOut);
  }
  if (s.policy.ln)
    ln_apply(a.h1, a.r1, a.r1_16, a.ln1_mean, a.ln1_rstd, w.ln1_w, w.ln1_b, Tn, C, a.h1_16);
  if (s.policy.gelu) gelu_out(a, TI);

  // out = LN2(r2), r2 = dropout(gelu . Wo) + h1.
  // Each buffer is written over where first written (not zeroed, then added to).
  constexpr GradWrite over = GradWrite::overwrite, add = GradWrite::accumulate;
  ln_backward(dres, g.ln2_w, g.ln2_b, dout, a.r2, a.r2_16, w.ln2_w, a.ln2_mean, a.ln2_rstd, Tn, C);
  std::copy(dres, dres + TC, dh1);  // the residual branch
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
    gelu_grad(a, dinter, dgelu, TI);
    linear_grad(s, inter_pattern, dh1, g.inter_w, g.inter_b, dinter, a.h1, a.h1_16, w.inter_w,
                W16(&LayerView<H>::inter_w), Tn, C, I, inter_blocks, add);
  }

  // h1 = LN1(r1), r1 = dropout(att . Wao) + in.
  ln_backward(dres, g.ln1_w, g.ln1_b, dh1, a.r1, a.r1_16, w.ln1_w, a.ln1_mean, a.ln1_rstd, Tn, C);
  std::copy(dres, dres + TC, dinp);  // the residual branch
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
  template void ln_apply<T, H>(T*, const T*, const H*, const T*, const T*, const T*, const T*,     \
                               int, int, H*);                                                      \
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
