#include "model/bert.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <type_traits>

#include "error.h"
#include "kernels/attention_layout.h"
#include "kernels/cpu/layers.h"
#include "kernels/tensor.h"
#include "model/heads.h"

namespace packbert::model {

template <typename T>
BertModel<T>::BertModel(const BertConfig& config, Heads heads, Sparsity sparsity)
    : layout_(config, heads, sparsity),
      patterns_(random_patterns(layout_, 0)),
      params_(layout_.total(), T(0)),
      grads_(layout_.total(), T(0)),
      p_(layout_, params_.data()),
      g_(layout_, grads_.data()) {
  config.validate("model config");
  // What backward finishes one after another: heads (pooler on), layers from the top, embeddings.
  const size_t total = layout_.total();
  auto at = [&](const T* p) { return static_cast<size_t>(p - params_.data()); };
  const int L = config.num_hidden_layers;
  size_t end = total;
  const size_t heads_begin = at(p_.pool_w);
  grad_ranges_.push_back({heads_begin, end});
  end = heads_begin;
  for (int l = L - 1; l >= 0; --l) {
    const size_t begin = at(p_.layers[l].qkv_w);
    grad_ranges_.push_back({begin, end});
    end = begin;
  }
  grad_ranges_.push_back({0, end});
}

template <typename T>
void BertModel<T>::collect_block_grads(bool on) {
  block_grads_.clear();
  dense_grad_scratch_.clear();
  dense_grad_scratch_.shrink_to_fit();
  if (!on || patterns_.empty()) return;
  block_grads_.resize(patterns_.size());
  size_t widest = 0;
  for (size_t l = 0; l < patterns_.size(); ++l) {
    const LayerPatterns& lp = patterns_[l];
    LayerBlockGrads& g = block_grads_[l];
    auto blocks = [](const kernels::BlockPattern& p) {
      return static_cast<size_t>(p.block_rows()) * p.block_cols();
    };
    g.qkv.assign(blocks(lp.qkv), 0.0f);
    g.attn_out.assign(blocks(lp.attn_out), 0.0f);
    g.inter.assign(blocks(lp.inter), 0.0f);
    g.out.assign(blocks(lp.out), 0.0f);
    for (const kernels::BlockPattern* p : {&lp.qkv, &lp.attn_out, &lp.inter, &lp.out})
      widest = std::max(widest, static_cast<size_t>(p->rows) * p->cols);
  }
  dense_grad_scratch_.resize(widest);
}

template <typename T>
void BertModel<T>::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <typename T>
kernels::bf16* BertModel<T>::weights16() {
  if (params16_.empty()) {
    params16_.resize(params_.size());
    p16_ = std::make_unique<ParamView<kernels::bf16>>(layout_, params16_.data());
  }
  return params16_.data();
}

template <typename T>
void BertModel<T>::keep_masters_in_bf16() {
  if constexpr (!std::is_same_v<T, float>) {
    throw std::logic_error("bf16 master weights need a float model");
  } else {
    if (masters16_) return;
    if (!patterns_.empty())  // the block-sparse kernels read their values in fp32
      throw std::logic_error("block-sparse layers need fp32 master weights");
    kernels::to_bf16(weights16(), params_.data(), static_cast<int64_t>(params_.size()));
    const KeptArena arena = fp32_kept_arena(layout_);
    kept_fp32_ = arena.places;
    std::vector<T> kept(arena.total, T(0));
    std::map<size_t, size_t> at;  // whole offset -> kept offset
    for (const KeptPlace& k : kept_fp32_) {
      std::copy_n(params_.data() + k.whole, k.numel, kept.data() + k.kept);
      at[k.whole] = k.kept;
    }
    params_ = std::move(kept);
    T* base = params_.data();
    p_ = ParamView<T>(layout_, [&](const TensorSpec& t) -> T* {
      auto it = at.find(t.offset);
      return it == at.end() ? nullptr : base + it->second;
    });
    masters16_ = true;
    weights16_written();
  }
}

template <typename T>
void BertModel<T>::masters16_written() {
  if constexpr (std::is_same_v<T, float>) {
    for (const KeptPlace& k : kept_fp32_)
      kernels::to_float(params_.data() + k.kept, params16_.data() + k.whole,
                        static_cast<int64_t>(k.numel));
    weights16_written();
  }
}

template <typename T>
const T* BertModel<T>::weights_fp32(std::vector<T>& scratch) const {
  if constexpr (std::is_same_v<T, float>) {
    if (masters16_) {
      scratch.resize(layout_.total());
      kernels::to_float(scratch.data(), params16_.data(), static_cast<int64_t>(scratch.size()));
      return scratch.data();
    }
  }
  return params_.data();
}

template <typename T>
template <typename H>
StepContext<T, H> BertModel<T>::context() {
  const BertConfig& c = config();
  StepContext<T, H> s{c, tl_, probs_offsets_.data(), ws_, opt_.recompute, *backend_};
  if constexpr (std::is_same_v<H, kernels::bf16>) {
    if (opt_.precision == Precision::bf16) s.p16 = p16_.get();
  } else {
    if (opt_.precision == Precision::fp16) s.p16 = p_f16_.get();
  }
  if (!patterns_.empty()) s.patterns = patterns_.data();
  if (!block_grads_.empty()) {
    s.block_grads = block_grads_.data();
    s.dense_scratch = dense_grad_scratch_.data();
  }
  s.p_hidden = opt_.training ? c.hidden_dropout_prob : 0.0;
  s.p_attn = opt_.training ? c.attention_probs_dropout_prob : 0.0;
  s.seed = opt_.seed;
  s.step = opt_.step;
  s.loss_scale = opt_.loss_scale;
  if (!share_.places.empty()) {
    s.places = &places_;
    s.mlm_total = share_.mlm, s.nsp_total = share_.nsp, s.cls_total = share_.cls,
    s.span_total = share_.span;
  }
  return s;
}

// Under every:K the inputs of layers 0, K, 2K, ... and the encoder's output are kept; the other
// layer inputs live in the segment scratch, slot j holding the output of the segment's layer j.
// Under `ln` (without every:K) the first input and the encoder's output are kept and the inner
// inputs alternate between two shared slots, so a layer never writes the slot it reads; backward
// rebuilds each from the layer below's LN2 input and statistics.
template <typename T>
bool BertModel<T>::kept(int l) const {
  const int K = opt_.recompute.every;
  return K == 0 || l % K == 0 || l == config().num_hidden_layers;
}

template <typename T>
typename BertModel<T>::Slot BertModel<T>::input_slot(int l) const {
  const int K = opt_.recompute.every, L = config().num_hidden_layers;
  if (rebuilds_layer_inputs(opt_.recompute)) {  // (implies K == 0)
    if (l == 0 || l == L) return {Rec::hidden, l == 0 ? 0 : 1};
    return {Rec::hidden_rebuilt, l % 2};
  }
  if (K == 0) return {Rec::hidden, l};
  if (l % K == 0) return {Rec::hidden, l / K};
  if (l == L) return {Rec::hidden, (L + K - 1) / K};
  return {Rec::seg_hidden, l % K - 1};
}

template <typename T>
typename BertModel<T>::Slot BertModel<T>::output_slot(int l) const {
  const int K = opt_.recompute.every;
  return kept(l + 1) ? input_slot(l + 1) : Slot{Rec::seg_hidden, l % K};
}

template <typename T>
T* BertModel<T>::input_of(int l) const {
  if (l == config().num_hidden_layers && ws_.get(Rec::top)) return ws_.get(Rec::top);
  const Slot s = input_slot(l);
  return ws_.get(s.rec, s.copy);
}
template <typename T>
T* BertModel<T>::output_of(int l) const {
  return kept(l + 1) ? input_of(l + 1) : ws_.get(Rec::seg_hidden, l % opt_.recompute.every);
}
template <typename T>
template <typename H>
H* BertModel<T>::input16_of(int l) const {
  const Slot s = input_slot(l);
  return ws_.template get16<H>(s.rec, s.copy);
}
template <typename T>
template <typename H>
H* BertModel<T>::output16_of(int l) const {
  const Slot s = output_slot(l);
  return ws_.template get16<H>(s.rec, s.copy);
}

template <typename T>
template <typename H>
LayerRecord<T, H> BertModel<T>::record_of(int l) const {
  const int K = opt_.recompute.every;
  return ws_.template layer<H>(K ? l % K : l);
}

// The dropout places of a share's tokens and sequences: each row is a run of both, starting at
// its place in the whole batch; each sequence's attention probabilities start at NH times the
// sum of L * L over the whole batch's sequences before it.
template <typename T>
void BertModel<T>::place_rows(const PackedBatch& batch) {
  if (share_.places.size() != static_cast<size_t>(batch.B))
    throw InputError("batch: " + std::to_string(share_.places.size()) + " row places for " +
                     std::to_string(batch.B) + " rows");
  const int64_t NH = config().num_attention_heads;
  DropoutPlaces& d = places_;
  d.token_local.assign(1, 0), d.seq_local.assign(1, 0);
  d.token_global.clear(), d.seq_global.clear(), d.attention.clear();
  int64_t token = 0;
  int seq = 0;
  for (int p = 0; p < batch.B; ++p) {
    const RowPlace& at = share_.places[p];
    d.token_global.push_back(at.token);
    d.seq_global.push_back(at.sequence);
    int64_t attention = at.attention;
    // The row's sequences are the layout's next ones, up to the row's last real slot.
    while (seq < tl_.sequences() && tl_.slot[tl_.cu_seqlens[seq]] / batch.S == p) {
      const int64_t len = tl_.cu_seqlens[seq + 1] - tl_.cu_seqlens[seq];
      d.attention.push_back(NH * attention);
      attention += len * len;
      token += len;
      ++seq;
    }
    d.token_local.push_back(token);
    d.seq_local.push_back(seq);
  }
}

// The classifier's targets from the batch (checked against the head), kept for backward.
template <typename T>
ClassTargets<T> BertModel<T>::class_targets(const PackedBatch& batch) {
  const size_t n_seq = static_cast<size_t>(tl_.sequences());
  if (config().regression()) {
    if (batch.class_targets.size() != n_seq)
      throw InputError("batch: " + std::to_string(batch.class_targets.size()) +
                       " regression targets for " + std::to_string(n_seq) + " sequences");
    for (float y : batch.class_targets)
      if (!std::isfinite(y)) throw InputError("batch: a regression target is not finite");
    cls_values_.assign(batch.class_targets.begin(), batch.class_targets.end());
    return {nullptr, cls_values_.data()};
  }
  if (batch.class_labels.size() != n_seq)
    throw InputError("batch: " + std::to_string(batch.class_labels.size()) + " class labels for " +
                     std::to_string(n_seq) + " sequences");
  for (int32_t y : batch.class_labels)
    if (y >= config().num_labels)
      throw InputError("batch: class label " + std::to_string(y) + " >= num_labels");
  cls_targets_.assign(batch.class_labels.begin(), batch.class_labels.end());
  return {cls_targets_.data(), nullptr};
}

template <typename T>
Outputs BertModel<T>::forward(const PackedBatch& batch, const StepOptions& options) {
  if (options.recompute.automatic)
    throw std::logic_error("recompute policy `auto` must be resolved before the step");
  if (masters16_ && options.precision != Precision::bf16)
    throw std::logic_error("a model with bf16 master weights runs Precision::bf16 steps only");
  if (is_16bit(options.precision)) {
    if constexpr (std::is_same_v<T, float>) {
      if (options.precision == Precision::bf16 && !masters16_ &&
          params16_version_ != params_version_) {  // changed since their copy
        kernels::to_bf16(weights16(), params_.data(), static_cast<int64_t>(params_.size()));
        weights16_written();
      }
      if (options.precision == Precision::fp16 && params_f16_version_ != params_version_) {
        if (params_f16_.empty()) {
          params_f16_.resize(params_.size());
          p_f16_ = std::make_unique<ParamView<kernels::f16>>(layout_, params_f16_.data());
        }
        kernels::to_f16(params_f16_.data(), params_.data(), static_cast<int64_t>(params_.size()));
        params_f16_version_ = params_version_;
      }
    } else {
      throw std::logic_error("16-bit precisions need a float model");
    }
  }
  const BertConfig& c = config();
  const Heads& heads = layout_.heads();
  opt_ = options;
  token_layout(batch, c, tl_);
  out_ = Outputs{};
  const int Tn = tl_.tokens(), n_seq = tl_.sequences();

  ids_.resize(Tn);
  pos_.resize(Tn);
  types_.resize(Tn);
  for (int t = 0; t < Tn; ++t) {
    ids_[t] = batch.input_ids[tl_.slot[t]];
    pos_[t] = batch.position_ids[tl_.slot[t]];
    types_[t] = batch.token_type_ids[tl_.slot[t]];
  }
  probs_offsets_.resize(n_seq + 1);
  kernels::attention_probs_offsets(tl_.cu_seqlens.data(), n_seq, c.num_attention_heads,
                                   probs_offsets_.data());
  share_ = batch.share;
  if (!share_.places.empty()) place_rows(batch);
  StepShape shape = shape_of(tl_, omp_get_max_threads());
  shape.sparse_scratch = sparse_scratch_elems(layout_, Tn);
  ws_.prepare(c, heads, opt_.recompute, shape, opt_.precision);
  if constexpr (std::is_same_v<T, float>)  // (fp16 steps need a float model: checked above)
    if (opt_.precision == Precision::fp16) {
      forward_with<kernels::f16>(batch);
      return out_;
    }
  forward_with<kernels::bf16>(batch);
  return out_;
}

template <typename T>
template <typename H>
void BertModel<T>::forward_with(const PackedBatch& batch) {
  const BertConfig& c = config();
  const Heads& heads = layout_.heads();
  const int Tn = tl_.tokens(), n_seq = tl_.sequences(), L = c.num_hidden_layers;
  const StepContext<T, H> s = context<H>();

  if (s.p16) {  // 16-bit: the embeddings in fp32 in scratch (dx is free until backward), rounded
    T* staged = ws_.get(Rec::dx);
    embeddings_forward(s, p_, ids_.data(), pos_.data(), types_.data(), staged);
    s.be.convert(kernels::View(input16_of<H>(0), Tn, c.hidden_size),
                 kernels::View(staged, Tn, c.hidden_size));
  } else {
    embeddings_forward(s, p_, ids_.data(), pos_.data(), types_.data(), input_of(0));
  }
  for (int l = 0; l < L; ++l)
    encoder_layer_forward(s, l, p_.layers[l], record_of<H>(l), input_of(l), output_of(l),
                          input16_of<H>(l), output16_of<H>(l));
  const T* top = input_of(L);
  pooler_forward(s, p_, top);

  if (heads.pretraining) {
    mlm_forward(s, p_, top, input16_of<H>(L), out_);
    nsp_forward(s, p_, tl_.nsp_label.data(), out_);
  }
  if (heads.classifier) {
    classifier_forward(s, p_, class_targets(batch), out_);
  }
  if (heads.span) {
    if (batch.span_starts.size() != static_cast<size_t>(n_seq) ||
        batch.span_ends.size() != static_cast<size_t>(n_seq))
      throw InputError("batch: span labels do not match the " + std::to_string(n_seq) +
                       " sequences");
    span_targets_.resize(2 * static_cast<size_t>(n_seq));
    for (int i = 0; i < n_seq; ++i) {
      const int len = tl_.cu_seqlens[i + 1] - tl_.cu_seqlens[i];
      span_targets_[2 * i] = batch.span_starts[i];
      span_targets_[2 * i + 1] = batch.span_ends[i];
      if (batch.span_starts[i] < 0) continue;
      for (int32_t y : {batch.span_starts[i], batch.span_ends[i]})
        if (y >= len)
          throw InputError("batch: span position " + std::to_string(y) + " beyond sequence " +
                           std::to_string(i) + " of length " + std::to_string(len));
    }
    span_forward(s, p_, top, span_targets_.data(), out_);
  }
}

template <typename T>
void BertModel<T>::backward(const std::function<void(size_t begin, size_t end)>& ready) {
  if constexpr (std::is_same_v<T, float>)
    if (opt_.precision == Precision::fp16) return backward_with<kernels::f16>(ready);
  backward_with<kernels::bf16>(ready);
}

template <typename T>
template <typename H>
void BertModel<T>::backward_with(const std::function<void(size_t begin, size_t end)>& ready) {
  size_t range = 0;  // the next of grad_ranges_ to report
  auto finished = [&] {
    if (ready) ready(grad_ranges_[range].first, grad_ranges_[range].second);
    ++range;
  };
  const BertConfig& c = config();
  const Heads& heads = layout_.heads();
  const int Tn = tl_.tokens(), n_seq = tl_.sequences(), L = c.num_hidden_layers;
  const int64_t TC = static_cast<int64_t>(Tn) * c.hidden_size;
  const StepContext<T, H> s = context<H>();
  T *dh = ws_.get(Rec::dh), *dx = ws_.get(Rec::dx);  // d loss / d layer output, / d layer input
  T* dpooled = ws_.get(Rec::dpooled);
  s.be.zero(kernels::View::vector(dh, TC));
  s.be.zero(kernels::View(dpooled, n_seq, c.hidden_size));
  const T* top = input_of(L);

  if (heads.pretraining) {
    mlm_backward(s, p_, g_, out_, dh);
    nsp_backward(s, p_, g_, tl_.nsp_label.data(), out_);
  }
  if (heads.classifier)
    classifier_backward(s, p_, g_, {cls_targets_.data(), cls_values_.data()}, out_);
  if (heads.span) span_backward(s, p_, g_, top, span_targets_.data(), out_, dh);
  pooler_backward(s, p_, g_, dh);
  finished();

  auto layer_backward = [&](int l) {
    if (rebuilds_layer_inputs(opt_.recompute) && l > 0) {  // LN2 of layer l - 1, bit for bit
      const LayerRecord<T, H> below = record_of<H>(l - 1);
      ln_apply(s, input_of(l), below.r2, below.r2_16, below.ln2_mean, below.ln2_rstd,
               p_.layers[l - 1].ln2_w, p_.layers[l - 1].ln2_b, Tn, c.hidden_size, input16_of<H>(l));
    }
    encoder_layer_backward(s, l, p_.layers[l], g_.layers[l], record_of<H>(l), input_of(l), dh, dx,
                           input16_of<H>(l));
    std::swap(dh, dx);
    finished();
  };
  const int K = opt_.recompute.every;
  if (K == 0) {
    for (int l = L - 1; l >= 0; --l) layer_backward(l);
  } else {
    // Segments [a, b) from the top: re-run their forward from the kept input, then backward.
    for (int a = (L - 1) / K * K; a >= 0; a -= K) {
      const int b = std::min(a + K, L);
      for (int l = a; l < b; ++l)
        encoder_layer_forward(s, l, p_.layers[l], record_of<H>(l), input_of(l),
                              ws_.get(Rec::seg_hidden, l - a), input16_of<H>(l),
                              ws_.template get16<H>(Rec::seg_hidden, l - a));
      for (int l = b - 1; l >= a; --l) layer_backward(l);
    }
  }
  embeddings_backward(s, p_, g_, ids_.data(), pos_.data(), types_.data(), dh);
  finished();
}

template class BertModel<float>;
template class BertModel<double>;

}  // namespace packbert::model
