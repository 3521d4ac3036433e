#include "model/bert.h"

#include <algorithm>
#include <cmath>

#include "error.h"
#include "kernels/attention.h"
#include "kernels/dropout.h"
#include "kernels/layers.h"

namespace packbert::model {

using namespace kernels;

namespace {

// Dropout sites: (layer, site) name every dropout so masks are reproducible per step.
enum Site : uint32_t { kAttnProbs = 0, kAttnOut = 1, kFfnOut = 2, kEmbeddings = 3, kPooled = 4 };
constexpr uint32_t kNoLayer = 0xffffffffu;

template <typename T>
void gather_rows(T* out, const T* in, const std::vector<int32_t>& rows, int C) {
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(in + static_cast<int64_t>(rows[r]) * C, in + static_cast<int64_t>(rows[r] + 1) * C,
              out + r * C);
}

template <typename T>
void scatter_add_rows(T* out, const T* in, const std::vector<int32_t>& rows, int C) {
  for (size_t r = 0; r < rows.size(); ++r)
    for (int c = 0; c < C; ++c) out[static_cast<int64_t>(rows[r]) * C + c] += in[r * C + c];
}

template <typename T>
void zeros(std::vector<T>& v, size_t n) {
  v.assign(n, T(0));
}

}  // namespace

template <typename T>
BertModel<T>::BertModel(const BertConfig& config, Heads heads)
    : layout_(config, heads),
      params_(layout_.total(), T(0)),
      grads_(layout_.total(), T(0)),
      p_(layout_, params_.data()),
      g_(layout_, grads_.data()) {
  config.validate("model config");
}

template <typename T>
void BertModel<T>::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <typename T>
Outputs BertModel<T>::forward(const PackedBatch& batch, const StepOptions& options) {
  const BertConfig& c = config();
  const Heads& heads = layout_.heads();
  opt_ = options;
  tl_ = token_layout(batch, c);
  out_ = Outputs{};
  const int Tn = tl_.tokens(), C = c.hidden_size, I = c.intermediate_size,
            NH = c.num_attention_heads;
  const int n_seq = tl_.sequences();
  const size_t TC = static_cast<size_t>(Tn) * C;
  const double p_hidden = options.training ? c.hidden_dropout_prob : 0.0;
  const double p_attn = options.training ? c.attention_probs_dropout_prob : 0.0;
  auto key = [&](uint32_t layer, uint32_t site) { return dropout_key(options.step, layer, site); };
  auto dropout = [&](T* out, const T* in, size_t n, uint32_t layer, uint32_t site) {
    if (p_hidden > 0)
      dropout_forward(out, in, static_cast<int64_t>(n), p_hidden, options.seed, key(layer, site));
    else
      std::copy(in, in + n, out);
  };

  ids_.resize(Tn);
  pos_.resize(Tn);
  types_.resize(Tn);
  for (int t = 0; t < Tn; ++t) {
    ids_[t] = batch.input_ids[tl_.slot[t]];
    pos_[t] = batch.position_ids[tl_.slot[t]];
    types_[t] = batch.token_type_ids[tl_.slot[t]];
  }

  // Embeddings: word + position + type, LayerNorm, dropout.
  emb_sum_.resize(TC);
  emb_ln_.resize(TC);
  emb_mean_.resize(Tn);
  emb_rstd_.resize(Tn);
  embedding_forward(emb_sum_.data(), ids_.data(), pos_.data(), types_.data(), p_.word, p_.position,
                    p_.token_type, Tn, C);
  layernorm_forward(emb_ln_.data(), emb_mean_.data(), emb_rstd_.data(), emb_sum_.data(),
                    p_.emb_ln_w, p_.emb_ln_b, Tn, C, static_cast<T>(c.layer_norm_eps));
  hidden_.resize(c.num_hidden_layers + 1);
  hidden_[0].resize(TC);
  dropout(hidden_[0].data(), emb_ln_.data(), TC, kNoLayer, kEmbeddings);

  // Encoder layers (post-LN, as BERT).
  acts_.resize(c.num_hidden_layers);
  const int64_t n_probs = attention_probs_offsets(tl_.cu_seqlens.data(), n_seq, NH).back();
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerView<T>& w = p_.layers[l];
    LayerActs& a = acts_[l];
    const T* x = hidden_[l].data();
    a.qkv.resize(TC * 3);
    a.probs.resize(n_probs);
    a.att.resize(TC);
    a.r1.resize(TC);
    a.h1.resize(TC);
    a.ln1_mean.resize(Tn);
    a.ln1_rstd.resize(Tn);
    a.inter.resize(static_cast<size_t>(Tn) * I);
    a.gelu.resize(static_cast<size_t>(Tn) * I);
    a.r2.resize(TC);
    a.ln2_mean.resize(Tn);
    a.ln2_rstd.resize(Tn);
    hidden_[l + 1].resize(TC);

    linear_forward(a.qkv.data(), x, w.qkv_w, w.qkv_b, Tn, C, 3 * C);
    attention_forward(a.att.data(), a.probs.data(), a.qkv.data(), tl_.cu_seqlens.data(), n_seq, C,
                      NH, AttentionDropout{p_attn, options.seed, key(l, kAttnProbs)});
    std::vector<T> tmp(TC);
    linear_forward(tmp.data(), a.att.data(), w.attn_out_w, w.attn_out_b, Tn, C, C);
    dropout(a.r1.data(), tmp.data(), TC, l, kAttnOut);
    residual_forward(a.r1.data(), a.r1.data(), x, static_cast<int64_t>(TC));
    layernorm_forward(a.h1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), a.r1.data(), w.ln1_w,
                      w.ln1_b, Tn, C, static_cast<T>(c.layer_norm_eps));
    linear_forward(a.inter.data(), a.h1.data(), w.inter_w, w.inter_b, Tn, C, I);
    gelu_forward(a.gelu.data(), a.inter.data(), static_cast<int64_t>(Tn) * I);
    linear_forward(tmp.data(), a.gelu.data(), w.out_w, w.out_b, Tn, I, C);
    dropout(a.r2.data(), tmp.data(), TC, l, kFfnOut);
    residual_forward(a.r2.data(), a.r2.data(), a.h1.data(), static_cast<int64_t>(TC));
    layernorm_forward(hidden_[l + 1].data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.r2.data(),
                      w.ln2_w, w.ln2_b, Tn, C, static_cast<T>(c.layer_norm_eps));
  }
  const T* top = hidden_[c.num_hidden_layers].data();

  // Pooler on each sequence's first token ([CLS]).
  std::vector<int32_t> cls_rows(tl_.cu_seqlens.begin(), tl_.cu_seqlens.end() - 1);
  cls_in_.resize(static_cast<size_t>(n_seq) * C);
  pooled_.resize(static_cast<size_t>(n_seq) * C);
  gather_rows(cls_in_.data(), top, cls_rows, C);
  linear_forward(pooled_.data(), cls_in_.data(), p_.pool_w, p_.pool_b, n_seq, C, C);
  for (T& v : pooled_) v = std::tanh(v);

  if (heads.pretraining) {
    // MLM on masked tokens only: transform, GELU, LayerNorm, decoder tied to word embeddings.
    const int M = static_cast<int>(tl_.mlm_token.size());
    const int V = c.vocab_size;
    mlm_in_.resize(static_cast<size_t>(M) * C);
    mlm_t1_.resize(mlm_in_.size());
    mlm_t2_.resize(mlm_in_.size());
    mlm_t3_.resize(mlm_in_.size());
    mlm_mean_.resize(M);
    mlm_rstd_.resize(M);
    mlm_probs_.resize(static_cast<size_t>(M) * V);
    gather_rows(mlm_in_.data(), top, tl_.mlm_token, C);
    linear_forward(mlm_t1_.data(), mlm_in_.data(), p_.mlm_w, p_.mlm_b, M, C, C);
    gelu_forward(mlm_t2_.data(), mlm_t1_.data(), static_cast<int64_t>(M) * C);
    layernorm_forward(mlm_t3_.data(), mlm_mean_.data(), mlm_rstd_.data(), mlm_t2_.data(),
                      p_.mlm_ln_w, p_.mlm_ln_b, M, C, static_cast<T>(c.layer_norm_eps));
    std::vector<T> logits(static_cast<size_t>(M) * V), losses(M);
    linear_forward(logits.data(), mlm_t3_.data(), p_.word, p_.mlm_bias, M, C, V);
    cross_entropy_forward(losses.data(), mlm_probs_.data(), logits.data(), tl_.mlm_label.data(), M,
                          V);
    double sum = 0;
    for (int m = 0; m < M; ++m) {
      sum += losses[m];
      const T* pr = &mlm_probs_[static_cast<size_t>(m) * V];
      out_.mlm_correct += std::max_element(pr, pr + V) - pr == tl_.mlm_label[m];
    }
    out_.mlm_count = M;
    out_.mlm_loss = M ? sum / M : 0.0;

    // NSP on the pooled [CLS] of every sequence that has a label.
    nsp_targets_ = tl_.nsp_label;
    std::vector<T> logits2(static_cast<size_t>(n_seq) * 2), losses2(n_seq);
    nsp_probs_.resize(logits2.size());
    linear_forward(logits2.data(), pooled_.data(), p_.nsp_w, p_.nsp_b, n_seq, C, 2);
    cross_entropy_forward(losses2.data(), nsp_probs_.data(), logits2.data(), nsp_targets_.data(),
                          n_seq, 2);
    double nsum = 0;
    for (int s = 0; s < n_seq; ++s) {
      if (nsp_targets_[s] < 0) continue;
      nsum += losses2[s];
      ++out_.nsp_count;
      out_.nsp_correct += (nsp_probs_[2 * s + 1] > nsp_probs_[2 * s]) == (nsp_targets_[s] == 1);
    }
    out_.nsp_loss = out_.nsp_count ? nsum / out_.nsp_count : 0.0;
  }

  if (heads.classifier) {
    const int NL = c.num_labels;
    if (batch.class_labels.size() != static_cast<size_t>(n_seq))
      throw InputError("batch: " + std::to_string(batch.class_labels.size()) +
                       " class labels for " + std::to_string(n_seq) + " sequences");
    cls_targets_ = batch.class_labels;
    for (int32_t y : cls_targets_)
      if (y >= NL) throw InputError("batch: class label " + std::to_string(y) + " >= num_labels");
    cls_drop_.resize(pooled_.size());
    dropout(cls_drop_.data(), pooled_.data(), pooled_.size(), kNoLayer, kPooled);
    cls_logits_.resize(static_cast<size_t>(n_seq) * NL);
    cls_probs_.resize(cls_logits_.size());
    std::vector<T> losses(n_seq);
    linear_forward(cls_logits_.data(), cls_drop_.data(), p_.cls_w, p_.cls_b, n_seq, C, NL);
    cross_entropy_forward(losses.data(), cls_probs_.data(), cls_logits_.data(), cls_targets_.data(),
                          n_seq, NL);
    double sum = 0;
    for (int s = 0; s < n_seq; ++s) {
      if (cls_targets_[s] < 0) continue;
      sum += losses[s];
      ++out_.cls_count;
      const T* pr = &cls_probs_[static_cast<size_t>(s) * NL];
      out_.cls_correct += std::max_element(pr, pr + NL) - pr == cls_targets_[s];
    }
    out_.cls_loss = out_.cls_count ? sum / out_.cls_count : 0.0;
  }

  if (heads.span) {
    // Start/end logits per token; each sequence's softmax runs over its own tokens only.
    if (batch.span_starts.size() != static_cast<size_t>(n_seq) ||
        batch.span_ends.size() != static_cast<size_t>(n_seq))
      throw InputError("batch: span labels do not match the " + std::to_string(n_seq) +
                       " sequences");
    span_logits_.resize(static_cast<size_t>(Tn) * 2);
    span_probs_.resize(span_logits_.size());
    linear_forward(span_logits_.data(), top, p_.span_w, p_.span_b, Tn, C, 2);
    double sum = 0;
    span_targets_.resize(static_cast<size_t>(n_seq) * 2);
    for (int s = 0; s < n_seq; ++s) {
      const int a = tl_.cu_seqlens[s], L = tl_.cu_seqlens[s + 1] - a;
      const int32_t target[2] = {batch.span_starts[s], batch.span_ends[s]};
      span_targets_[2 * s] = target[0], span_targets_[2 * s + 1] = target[1];
      for (int e = 0; e < 2; ++e) {
        T mx = -INFINITY;
        for (int i = 0; i < L; ++i) mx = std::max(mx, span_logits_[2 * (a + i) + e]);
        T z = 0;
        for (int i = 0; i < L; ++i)
          z += (span_probs_[2 * (a + i) + e] = std::exp(span_logits_[2 * (a + i) + e] - mx));
        for (int i = 0; i < L; ++i) span_probs_[2 * (a + i) + e] /= z;
        if (target[0] < 0) continue;
        if (target[e] >= L)
          throw InputError("batch: span position " + std::to_string(target[e]) +
                           " beyond sequence " + std::to_string(s) + " of length " +
                           std::to_string(L));
        sum += -std::log(span_probs_[2 * (a + target[e]) + e]) / 2;
      }
      if (target[0] >= 0) ++out_.span_count;
    }
    out_.span_loss = out_.span_count ? sum / out_.span_count : 0.0;
  }
  return out_;
}

template <typename T>
void BertModel<T>::backward() {
  const BertConfig& c = config();
  const Heads& heads = layout_.heads();
  const int Tn = tl_.tokens(), C = c.hidden_size, I = c.intermediate_size,
            NH = c.num_attention_heads;
  const int n_seq = tl_.sequences();
  const size_t TC = static_cast<size_t>(Tn) * C;
  const double p_hidden = opt_.training ? c.hidden_dropout_prob : 0.0;
  const double p_attn = opt_.training ? c.attention_probs_dropout_prob : 0.0;
  auto key = [&](uint32_t layer, uint32_t site) { return dropout_key(opt_.step, layer, site); };
  auto dropout_back = [&](T* din, const T* dout, size_t n, uint32_t layer, uint32_t site) {
    if (p_hidden > 0)
      dropout_backward(din, dout, static_cast<int64_t>(n), p_hidden, opt_.seed, key(layer, site));
    else
      for (size_t i = 0; i < n; ++i) din[i] += dout[i];
  };

  std::vector<T> dtop(TC, T(0));
  std::vector<T> dpooled(static_cast<size_t>(n_seq) * C, T(0));

  if (heads.pretraining) {
    const int M = static_cast<int>(tl_.mlm_token.size());
    const int V = c.vocab_size;
    if (M > 0) {
      std::vector<T> dloss(M, static_cast<T>(1.0 / M)), dlogits(static_cast<size_t>(M) * V, T(0));
      cross_entropy_backward(dlogits.data(), mlm_probs_.data(), tl_.mlm_label.data(), dloss.data(),
                             M, V);
      std::vector<T> dt3(mlm_t3_.size(), T(0)), dt2(dt3.size(), T(0)), dt1(dt3.size(), T(0)),
          din(dt3.size(), T(0));
      linear_backward(dt3.data(), g_.word, g_.mlm_bias, dlogits.data(), mlm_t3_.data(), p_.word, M,
                      C, V);
      layernorm_backward(dt2.data(), g_.mlm_ln_w, g_.mlm_ln_b, dt3.data(), mlm_t2_.data(),
                         p_.mlm_ln_w, mlm_mean_.data(), mlm_rstd_.data(), M, C);
      gelu_backward(dt1.data(), mlm_t1_.data(), dt2.data(), static_cast<int64_t>(M) * C);
      linear_backward(din.data(), g_.mlm_w, g_.mlm_b, dt1.data(), mlm_in_.data(), p_.mlm_w, M, C,
                      C);
      scatter_add_rows(dtop.data(), din.data(), tl_.mlm_token, C);
    }
    if (out_.nsp_count > 0) {
      std::vector<T> dloss(n_seq, static_cast<T>(1.0 / out_.nsp_count)),
          dlogits(static_cast<size_t>(n_seq) * 2, T(0));
      cross_entropy_backward(dlogits.data(), nsp_probs_.data(), nsp_targets_.data(), dloss.data(),
                             n_seq, 2);
      linear_backward(dpooled.data(), g_.nsp_w, g_.nsp_b, dlogits.data(), pooled_.data(), p_.nsp_w,
                      n_seq, C, 2);
    }
  }
  if (heads.classifier && out_.cls_count > 0) {
    const int NL = c.num_labels;
    std::vector<T> dloss(n_seq, static_cast<T>(1.0 / out_.cls_count)),
        dlogits(static_cast<size_t>(n_seq) * NL, T(0)), ddrop(pooled_.size(), T(0));
    cross_entropy_backward(dlogits.data(), cls_probs_.data(), cls_targets_.data(), dloss.data(),
                           n_seq, NL);
    linear_backward(ddrop.data(), g_.cls_w, g_.cls_b, dlogits.data(), cls_drop_.data(), p_.cls_w,
                    n_seq, C, NL);
    dropout_back(dpooled.data(), ddrop.data(), ddrop.size(), kNoLayer, kPooled);
  }
  if (heads.span && out_.span_count > 0) {
    std::vector<T> dlogits(span_logits_.size(), T(0));
    const T scale = static_cast<T>(0.5 / out_.span_count);
    for (int s = 0; s < n_seq; ++s) {
      const int a = tl_.cu_seqlens[s], L = tl_.cu_seqlens[s + 1] - a;
      const int32_t target[2] = {span_targets_[2 * s], span_targets_[2 * s + 1]};
      if (target[0] < 0) continue;
      for (int e = 0; e < 2; ++e)
        for (int i = 0; i < L; ++i)
          dlogits[2 * (a + i) + e] =
              (span_probs_[2 * (a + i) + e] - (i == target[e] ? T(1) : T(0))) * scale;
    }
    linear_backward(dtop.data(), g_.span_w, g_.span_b, dlogits.data(),
                    hidden_[c.num_hidden_layers].data(), p_.span_w, Tn, C, 2);
  }
  {  // pooler: pooled = tanh(cls_in . Wp^T + bp)
    std::vector<T> dpre(dpooled.size()), dcls(dpooled.size(), T(0));
    for (size_t i = 0; i < dpre.size(); ++i)
      dpre[i] = dpooled[i] * (T(1) - pooled_[i] * pooled_[i]);
    linear_backward(dcls.data(), g_.pool_w, g_.pool_b, dpre.data(), cls_in_.data(), p_.pool_w,
                    n_seq, C, C);
    std::vector<int32_t> cls_rows(tl_.cu_seqlens.begin(), tl_.cu_seqlens.end() - 1);
    scatter_add_rows(dtop.data(), dcls.data(), cls_rows, C);
  }

  // Encoder layers in reverse. dh holds d loss / d (layer output).
  std::vector<T> dh = std::move(dtop), dr2(TC), dh1(TC), dtmp(TC),
                 dgelu(static_cast<size_t>(Tn) * I), dinter(dgelu.size()), dr1(TC), datt(TC),
                 dqkv(TC * 3), dx(TC);
  for (int l = c.num_hidden_layers - 1; l >= 0; --l) {
    const LayerView<T>& w = p_.layers[l];
    const LayerView<T>& gw = g_.layers[l];
    const LayerActs& a = acts_[l];
    const T* x = hidden_[l].data();
    std::fill(dr2.begin(), dr2.end(), T(0));
    layernorm_backward(dr2.data(), gw.ln2_w, gw.ln2_b, dh.data(), a.r2.data(), w.ln2_w,
                       a.ln2_mean.data(), a.ln2_rstd.data(), Tn, C);
    dh1 = dr2;  // residual branch
    std::fill(dtmp.begin(), dtmp.end(), T(0));
    dropout_back(dtmp.data(), dr2.data(), TC, l, kFfnOut);
    std::fill(dgelu.begin(), dgelu.end(), T(0));
    linear_backward(dgelu.data(), gw.out_w, gw.out_b, dtmp.data(), a.gelu.data(), w.out_w, Tn, I,
                    C);
    std::fill(dinter.begin(), dinter.end(), T(0));
    gelu_backward(dinter.data(), a.inter.data(), dgelu.data(), static_cast<int64_t>(Tn) * I);
    linear_backward(dh1.data(), gw.inter_w, gw.inter_b, dinter.data(), a.h1.data(), w.inter_w, Tn,
                    C, I);
    std::fill(dr1.begin(), dr1.end(), T(0));
    layernorm_backward(dr1.data(), gw.ln1_w, gw.ln1_b, dh1.data(), a.r1.data(), w.ln1_w,
                       a.ln1_mean.data(), a.ln1_rstd.data(), Tn, C);
    dx = dr1;  // residual branch
    std::fill(dtmp.begin(), dtmp.end(), T(0));
    dropout_back(dtmp.data(), dr1.data(), TC, l, kAttnOut);
    std::fill(datt.begin(), datt.end(), T(0));
    linear_backward(datt.data(), gw.attn_out_w, gw.attn_out_b, dtmp.data(), a.att.data(),
                    w.attn_out_w, Tn, C, C);
    std::fill(dqkv.begin(), dqkv.end(), T(0));
    attention_backward(dqkv.data(), datt.data(), a.qkv.data(), a.probs.data(),
                       tl_.cu_seqlens.data(), n_seq, C, NH,
                       AttentionDropout{p_attn, opt_.seed, key(l, kAttnProbs)});
    linear_backward(dx.data(), gw.qkv_w, gw.qkv_b, dqkv.data(), x, w.qkv_w, Tn, C, 3 * C);
    std::swap(dh, dx);
  }

  // Embeddings: dropout, LayerNorm, lookup tables.
  std::fill(dtmp.begin(), dtmp.end(), T(0));
  dropout_back(dtmp.data(), dh.data(), TC, kNoLayer, kEmbeddings);
  std::fill(dx.begin(), dx.end(), T(0));
  layernorm_backward(dx.data(), g_.emb_ln_w, g_.emb_ln_b, dtmp.data(), emb_sum_.data(), p_.emb_ln_w,
                     emb_mean_.data(), emb_rstd_.data(), Tn, C);
  embedding_backward(g_.word, g_.position, g_.token_type, dx.data(), ids_.data(), pos_.data(),
                     types_.data(), Tn, C);
}

template <typename T>
size_t BertModel<T>::activation_bytes() const {
  size_t n = emb_sum_.size() + emb_mean_.size() + emb_rstd_.size() + emb_ln_.size();
  for (const auto& h : hidden_) n += h.size();
  for (const LayerActs& a : acts_)
    n += a.qkv.size() + a.probs.size() + a.att.size() + a.r1.size() + a.ln1_mean.size() +
         a.ln1_rstd.size() + a.h1.size() + a.inter.size() + a.gelu.size() + a.r2.size() +
         a.ln2_mean.size() + a.ln2_rstd.size();
  n += mlm_in_.size() + mlm_t1_.size() + mlm_t2_.size() + mlm_mean_.size() + mlm_rstd_.size() +
       mlm_t3_.size() + mlm_probs_.size() + cls_in_.size() + pooled_.size() + nsp_probs_.size() +
       cls_drop_.size() + cls_probs_.size() + span_probs_.size();
  return n * sizeof(T);
}

template class BertModel<float>;
template class BertModel<double>;

}  // namespace packbert::model
