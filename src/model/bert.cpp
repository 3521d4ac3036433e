#include "model/bert.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <type_traits>

#include "error.h"
#include "kernels/attention_layout.h"
#include "kernels/tensor.h"
#include "model/heads.h"
#include "model/modernbert.h"

namespace packbert::model {

using kernels::Buffer;
using kernels::DType;
using kernels::View;

BertModel::BertModel(const BertConfig& config, Heads heads, Sparsity sparsity, DType dtype,
                     Stage stage)
    : layout_(config, heads, sparsity, stage) {
  config.validate("model config");
  use_pass(0);
  if (!layout_.whole() && sparsity.on())
    throw InputError("pipeline stages of a block-sparse model are not built");
  if (config.family == Family::modernbert && sparsity.on())
    throw InputError("block-sparse ModernBERT layers are not built (sparsity is BERT's)");
  patterns_ = random_patterns(layout_, 0);
  if (dtype != DType::f32 && dtype != DType::f64)
    throw std::logic_error(std::string("a model's scalar is f32 or f64, not ") +
                           kernels::dtype_name(dtype));
  const int64_t total = static_cast<int64_t>(layout_.total());
  params_ = Buffer(backend_->device(), dtype, total);
  grads_ = Buffer(backend_->device(), dtype, total);
  p_ = ParamView(layout_, params_.view());
  g_ = ParamView(layout_, grads_.view());
  // What backward finishes one after another: heads (pooler on), layers from the top, embeddings
  // (of a stage: what it holds of these; a last stage's word table, the decoder's, with its
  // heads).
  auto at = [&](const View& v) {
    return static_cast<size_t>((static_cast<const std::byte*>(v.data) -
                                static_cast<const std::byte*>(params_.view().data)) /
                               static_cast<int64_t>(kernels::traits(dtype).bytes));
  };
  const Stage& st = layout_.stage();
  size_t end = layout_.total();
  // (a layer's first tensor: its query weight; a ModernBERT layer's attention norm, but layer 0's)
  auto layer_begin = [&](int l) {
    return at(p_.layers[l].ln1_w && config.family == Family::modernbert ? p_.layers[l].ln1_w
                                                                        : p_.layers[l].qkv_w);
  };
  const size_t layers_begin = layer_begin(st.first);
  if (layout_.has_heads()) {
    const size_t heads_begin = at(config.family == Family::modernbert ? p_.final_ln_w : p_.pool_w);
    grad_ranges_.push_back({heads_begin, end});
    end = heads_begin;
    word_with_heads_ = !layout_.has_embeddings() && layers_begin > 0;
    if (word_with_heads_) grad_ranges_.push_back({0, layers_begin});
  }
  for (int l = st.end - 1; l >= st.first; --l) {
    const size_t begin = layer_begin(l);
    grad_ranges_.push_back({begin, end});
    end = begin;
  }
  if (layout_.has_embeddings()) grad_ranges_.push_back({0, end});
  // Deferring the embeddings' word-table share: the word table right after the heads, the rest of
  // the embeddings last.
  if (!layout_.whole()) return;
  const size_t word_end = static_cast<size_t>(p_.word.numel());
  deferred_ranges_ = grad_ranges_;
  deferred_ranges_.insert(deferred_ranges_.begin() + 1, {0, word_end});
  deferred_ranges_.back().first = word_end;
}

void BertModel::use_pass(int k) {
  if (k < 0) throw std::logic_error("use_pass: a negative pass");
  while (passes_.size() <= static_cast<size_t>(k)) passes_.push_back(std::make_unique<Pass>());
  cur_ = passes_[static_cast<size_t>(k)].get();
}

void BertModel::defer_word_rows(const std::vector<int32_t>& rows) {
  if (!layout_.whole()) throw std::logic_error("defer_word_rows: a whole model's only");
  word_rows_.assign(rows.begin(), rows.end());
  const int64_t n = static_cast<int64_t>(rows.size()) * config().hidden_size;
  if (word_rows_grads_.size() < n) word_rows_grads_ = Buffer(backend_->device(), dtype(), n);
  backend_->zero(word_rows_grads());
}

View BertModel::word_rows_grads() const {
  return word_rows_grads_.view().shaped(static_cast<int64_t>(word_rows_.size()),
                                        config().hidden_size);
}

void BertModel::add_word_rows() {
  if (word_rows_.empty()) return;
  backend_->gather_rows_backward(g_.word, word_rows_grads(), word_rows_.data());
  word_rows_.clear();
}

void BertModel::set_backend(const kernels::Backend& b) {
  if (&b.device() != &backend_->device())
    throw std::logic_error(std::string("moving a model from ") + backend_->device().name() +
                           " memory to " + b.device().name() + " memory is not built");
  backend_ = &b;
}

void BertModel::collect_block_grads(bool on) {
  block_grads_.clear();
  dense_grad_scratch_.reset();
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
  dense_grad_scratch_ = Buffer(backend_->device(), dtype(), static_cast<int64_t>(widest));
}

void BertModel::zero_grads() {
  backend_->zero(grads_.view());
}

StepContext BertModel::context() {
  const BertConfig& c = config();
  StepContext s{c,
                cur_->tl,
                cur_->probs_offsets.data(),
                cur_->ws,
                cur_->opt.recompute,
                *backend_,
                nullptr,
                nullptr,
                nullptr,
                {}};
  if (is_16bit(cur_->opt.precision)) s.p16 = &p16_;
  if (!patterns_.empty()) s.patterns = patterns_.data();
  if (!block_grads_.empty()) {
    s.block_grads = block_grads_.data();
    s.dense_scratch = dense_grad_scratch_.view();
  }
  // (ModernBERT trains without dropout: forward refuses a config with any)
  const bool dropout = cur_->opt.training && c.family == Family::bert;
  s.p_hidden = dropout ? c.hidden_dropout_prob : 0.0;
  s.p_attn = dropout ? c.attention_probs_dropout_prob : 0.0;
  s.positions = cur_->pos.data();
  s.probs_offsets_local = cur_->probs_offsets_local.data();
  s.token_sequence = cur_->token_sequence.data();
  s.seed = cur_->opt.seed;
  s.step = cur_->opt.step;
  s.loss_scale = cur_->opt.loss_scale;
  if (!cur_->share.places.empty()) {
    s.places = &cur_->places;
    s.mlm_total = cur_->share.mlm, s.nsp_total = cur_->share.nsp, s.cls_total = cur_->share.cls,
    s.span_total = cur_->share.span;
  }
  return s;
}

// Under every:K the inputs of layers 0, K, 2K, ... and the encoder's output are kept; the other
// layer inputs live in the segment scratch, slot j holding the output of the segment's layer j.
// Under `ln` (without every:K) the first input and the encoder's output are kept and the inner
// inputs alternate between two shared slots, so a layer never writes the slot it reads; backward
// rebuilds each from the layer below's LN2 input and statistics.
bool BertModel::kept(int l) const {
  const int K = cur_->opt.recompute.every;
  return K == 0 || l % K == 0 || l == layout_.stage_config().num_hidden_layers;
}

BertModel::Slot BertModel::input_slot(int l) const {
  const int K = cur_->opt.recompute.every, L = layout_.stage_config().num_hidden_layers;
  if (rebuilds_layer_inputs(cur_->opt.recompute, config().family)) {  // (implies K == 0)
    if (l == 0 || l == L) return {Rec::hidden, l == 0 ? 0 : 1};
    return {Rec::hidden_rebuilt, l % 2};
  }
  if (K == 0) return {Rec::hidden, l};
  if (l % K == 0) return {Rec::hidden, l / K};
  if (l == L) return {Rec::hidden, (L + K - 1) / K};
  return {Rec::seg_hidden, l % K - 1};
}

View BertModel::input_of(int l) const {
  const Slot s = input_slot(l);
  return cur_->ws.get(s.rec, s.copy);
}
View BertModel::output_of(int l) const {
  return kept(l + 1) ? input_of(l + 1)
                     : cur_->ws.get(Rec::seg_hidden, l % cur_->opt.recompute.every);
}
View BertModel::top() const {
  const View wide = cur_->ws.get(Rec::top);
  return wide ? wide : input_of(layout_.stage_config().num_hidden_layers);
}

LayerRecord BertModel::record_of(int l) const {
  const int K = cur_->opt.recompute.every;
  LayerRecord r = cur_->ws.layer(K ? l % K : l);
  // (the stage's config: its layer l is the model's first + l, of that layer's kind)
  const ModernBertFields& m = layout_.stage_config().modern;
  if (config().family == Family::modernbert) {  // a global layer's probabilities, or a local one's
    const bool global = m.global_layer(l);
    int same_kind = 0;  // the layers of l's kind below it
    for (int j = 0; j < l; ++j) same_kind += m.global_layer(j) == global;
    r.probs = cur_->ws.get(global ? Rec::probs : Rec::probs_local, K ? l % K : same_kind);
  }
  return r;
}

// The dropout places of a share's tokens and sequences: each row is a run of both, starting at
// its place in the whole batch; each sequence's attention probabilities start at NH times the
// sum of L * L over the whole batch's sequences before it.
void BertModel::place_rows(const PackedBatch& batch) {
  if (cur_->share.places.size() != static_cast<size_t>(batch.B))
    throw InputError("batch: " + std::to_string(cur_->share.places.size()) + " row places for " +
                     std::to_string(batch.B) + " rows");
  const int64_t NH = config().num_attention_heads;
  DropoutPlaces& d = cur_->places;
  d.token_local.assign(1, 0), d.seq_local.assign(1, 0);
  d.token_global.clear(), d.seq_global.clear(), d.attention.clear();
  int64_t token = 0;
  int seq = 0;
  for (int p = 0; p < batch.B; ++p) {
    const RowPlace& at = cur_->share.places[p];
    d.token_global.push_back(at.token);
    d.seq_global.push_back(at.sequence);
    int64_t attention = at.attention;
    // The row's sequences are the layout's next ones, up to the row's last real slot.
    while (seq < cur_->tl.sequences() && cur_->tl.slot[cur_->tl.cu_seqlens[seq]] / batch.S == p) {
      const int64_t len = cur_->tl.cu_seqlens[seq + 1] - cur_->tl.cu_seqlens[seq];
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
ClassTargets BertModel::class_targets(const PackedBatch& batch) {
  const size_t n_seq = static_cast<size_t>(cur_->tl.sequences());
  if (config().regression()) {
    if (batch.class_targets.size() != n_seq)
      throw InputError("batch: " + std::to_string(batch.class_targets.size()) +
                       " regression targets for " + std::to_string(n_seq) + " sequences");
    for (float y : batch.class_targets)
      if (!std::isfinite(y)) throw InputError("batch: a regression target is not finite");
    if (cur_->cls_values.size() < static_cast<int64_t>(n_seq))
      cur_->cls_values = Buffer(backend_->device(), dtype(), static_cast<int64_t>(n_seq));
    const View values = cur_->cls_values.view().shaped(1, static_cast<int64_t>(n_seq));
    for (size_t i = 0; i < n_seq; ++i) values.put(static_cast<int64_t>(i), batch.class_targets[i]);
    return {nullptr, values};
  }
  if (batch.class_labels.size() != n_seq)
    throw InputError("batch: " + std::to_string(batch.class_labels.size()) + " class labels for " +
                     std::to_string(n_seq) + " sequences");
  for (int32_t y : batch.class_labels)
    if (y >= config().num_labels)
      throw InputError("batch: class label " + std::to_string(y) + " >= num_labels");
  cur_->cls_targets.assign(batch.class_labels.begin(), batch.class_labels.end());
  return {cur_->cls_targets.data(), View()};
}

Outputs BertModel::forward(const PackedBatch& batch, const StepOptions& options, View input,
                           const std::function<void()>& progress) {
  if (config().family == Family::modernbert) refuse_unbuilt_modernbert(options);
  if (layout_.has_embeddings() == static_cast<bool>(input))
    throw std::logic_error(layout_.has_embeddings()
                               ? "forward: a first stage computes its input (the embeddings)"
                               : "forward: a later stage needs the stage below's output");
  if (options.recompute.automatic)
    throw std::logic_error("recompute policy `auto` must be resolved before the step");
  refresh_copy16(options.precision);
  prepare_pass(batch, options);
  const BertConfig& c = config();
  const Heads& heads = layout_.heads();
  const int L = layout_.stage_config().num_hidden_layers;
  StepContext s = context();
  if (progress) s.progress = &progress;

  const View in = input_of(0);
  if (input) {
    if (input.dtype != in.dtype || input.numel() != in.numel())
      throw std::logic_error("forward: the stage input is not [T, C] as the layers hold it");
    s.be.convert(in, input);
  } else if (in.is_16bit()) {  // the embeddings in the scalar in scratch (dx is free until
                               // backward)
    const View staged = cur_->ws.get(Rec::dx);
    embeddings_of(s, staged);
    s.be.convert(in, staged);
  } else {
    embeddings_of(s, in);
  }
  for (int l = 0; l < L; ++l) layer_forward(s, l, l == L - 1 ? cur_->ws.get(Rec::top) : View());
  if (!layout_.has_heads()) return cur_->out;
  if (c.family == Family::modernbert) {
    const View top_held = final_norm_forward(s, p_, input_of(L));
    const View top = cur_->ws.get(Rec::final_out);
    if (heads.pretraining) mlm_forward(s, p_, top_held, cur_->out);
    if (heads.classifier)
      modernbert_classifier_forward(s, p_, top, class_targets(batch), cur_->out);
    if (heads.span) modernbert_span_forward(s, p_, top, span_targets(batch), cur_->out);
    return cur_->out;
  }
  pooler_forward(s, p_, top());

  if (heads.pretraining) {
    mlm_forward(s, p_, input_of(L), cur_->out);
    nsp_forward(s, p_, cur_->tl.nsp_label.data(), cur_->out);
  }
  if (heads.classifier)
    classifier_forward(s, p_, cur_->ws.get(Rec::pooled), class_targets(batch), cur_->out);
  if (heads.span) span_forward(s, p_, top(), span_targets(batch), cur_->out);
  return cur_->out;
}

void BertModel::prepare_pass(const PackedBatch& batch, const StepOptions& options) {
  cur_->forwarded = true;
  const BertConfig& c = config();
  cur_->opt = options;
  token_layout(batch, c, cur_->tl);
  cur_->out = Outputs{};
  const int Tn = cur_->tl.tokens(), n_seq = cur_->tl.sequences();
  cur_->ids.resize(Tn);
  cur_->pos.resize(Tn);
  cur_->types.resize(Tn);
  for (int t = 0; t < Tn; ++t) {
    cur_->ids[t] = batch.input_ids[cur_->tl.slot[t]];
    cur_->pos[t] = batch.position_ids[cur_->tl.slot[t]];
    cur_->types[t] = batch.token_type_ids[cur_->tl.slot[t]];
  }
  cur_->probs_offsets.resize(n_seq + 1);
  kernels::attention_probs_offsets(cur_->tl.cu_seqlens.data(), n_seq, c.num_attention_heads,
                                   kernels::kGlobalAttention, cur_->probs_offsets.data());
  cur_->probs_offsets_local.clear();
  cur_->token_sequence.clear();
  if (c.family == Family::modernbert && layout_.heads().classifier &&
      c.modern.mean_pooling())  // mean pooling's rows
    for (int i = 0; i < n_seq; ++i)
      cur_->token_sequence.insert(cur_->token_sequence.end(),
                                  cur_->tl.cu_seqlens[i + 1] - cur_->tl.cu_seqlens[i], i);
  if (c.family == Family::modernbert) {  // the local layers' bands
    cur_->probs_offsets_local.resize(n_seq + 1);
    kernels::attention_probs_offsets(cur_->tl.cu_seqlens.data(), n_seq, c.num_attention_heads,
                                     c.modern.local_attention, cur_->probs_offsets_local.data());
  }
  cur_->share = batch.share;
  if (!cur_->share.places.empty()) place_rows(batch);
  StepShape shape = shape_of(cur_->tl, omp_get_max_threads(), c.local_window());
  size_kernel_scratch(shape, layout_, *backend_);
  cur_->ws.prepare(layout_.stage_config(), layout_.workspace_heads(), cur_->opt.recompute, shape,
                   cur_->opt.precision, dtype(), backend_->device());
}

const int32_t* BertModel::span_targets(const PackedBatch& batch) {
  const int n_seq = cur_->tl.sequences();
  if (batch.span_starts.size() != static_cast<size_t>(n_seq) ||
      batch.span_ends.size() != static_cast<size_t>(n_seq))
    throw InputError("batch: span labels do not match the " + std::to_string(n_seq) + " sequences");
  cur_->span_targets.resize(2 * static_cast<size_t>(n_seq));
  for (int i = 0; i < n_seq; ++i) {
    const int len = cur_->tl.cu_seqlens[i + 1] - cur_->tl.cu_seqlens[i];
    cur_->span_targets[2 * i] = batch.span_starts[i];
    cur_->span_targets[2 * i + 1] = batch.span_ends[i];
    if (batch.span_starts[i] < 0) continue;
    for (int32_t y : {batch.span_starts[i], batch.span_ends[i]})
      if (y >= len)
        throw InputError("batch: span position " + std::to_string(y) + " beyond sequence " +
                         std::to_string(i) + " of length " + std::to_string(len));
  }
  return cur_->span_targets.data();
}

void BertModel::backward(const std::function<void(size_t begin, size_t end)>& ready,
                         const std::function<void()>& progress, View output_grad) {
  if (layout_.has_heads() == static_cast<bool>(output_grad))
    throw std::logic_error(layout_.has_heads()
                               ? "backward: a last stage starts from its losses"
                               : "backward: a stage below the last needs its output's gradient");
  if (!cur_->forwarded) throw std::logic_error("backward: the selected pass holds no forward");
  cur_->forwarded = false;
  const std::vector<std::pair<size_t, size_t>>& ranges = grad_ranges();
  size_t range = 0;  // the next of ranges to report
  auto finished = [&] {
    if (ready) ready(ranges[range].first, ranges[range].second);
    ++range;
  };
  const BertConfig& c = config();
  const int Tn = cur_->tl.tokens();
  const int first = layout_.stage().first, L = layout_.stage_config().num_hidden_layers;
  const int64_t TC = static_cast<int64_t>(Tn) * c.hidden_size;
  StepContext s = context();
  if (progress) s.progress = &progress;
  s.decoder_elsewhere = decoder_elsewhere_;
  // d loss / d layer output, / d layer input
  View dh = cur_->ws.get(Rec::dh), dx = cur_->ws.get(Rec::dx);
  if (output_grad) {  // (a stage below the last: its output's gradient instead of the heads)
    if (output_grad.dtype != dh.dtype || output_grad.numel() != TC)
      throw std::logic_error("backward: the output gradient is not [T, C] in the model's scalar");
    s.be.convert(dh, output_grad);
  } else {
    heads_backward(s, dh);
    finished();
    // The word table: the decoder's share is all it gets (deferred, or on a last stage, where
    // it may be the first stage's to form).
    if (!word_rows_.empty() || word_with_heads_) finished();
  }

  // l: the stage's own index of a layer (records, slots); first + l: the model's (weights,
  // dropout streams).
  auto layer_backward = [&](int l) {
    if (rebuilds_layer_inputs(cur_->opt.recompute, c.family) && l > 0) {
      // LN2 of layer l - 1, bit for bit
      const LayerRecord below = record_of(l - 1);
      const LayerView& w = p_.layers[first + l - 1];
      ln_apply(s, input_of(l), below.r2, below.ln2_mean, below.ln2_rstd, w.ln2_w, w.ln2_b);
    }
    const LayerView &w = p_.layers[first + l], &g = g_.layers[first + l];
    if (c.family == Family::modernbert)
      modernbert_layer_backward(s, first + l, w, g, record_of(l), input_of(l), dh, dx);
    else
      encoder_layer_backward(s, first + l, w, g, record_of(l), input_of(l), dh, dx);
    std::swap(dh, dx);
    finished();
  };
  const int K = cur_->opt.recompute.every;
  if (K == 0) {
    for (int l = L - 1; l >= 0; --l) layer_backward(l);
  } else {
    // Segments [a, b) from the top: re-run their forward from the kept input, then backward.
    for (int a = (L - 1) / K * K; a >= 0; a -= K) {
      const int b = std::min(a + K, L);
      for (int l = a; l < b; ++l) layer_forward(s, l, View(), cur_->ws.get(Rec::seg_hidden, l - a));
      for (int l = b - 1; l >= a; --l) layer_backward(l);
    }
  }
  if (!layout_.has_embeddings()) {
    cur_->input_grad = dh;
    return;
  }
  embeddings_backward_of(s, dh);
  finished();
}

void BertModel::hand_decoder_to_first_stage() {
  if (!word_with_heads_ || !layout_.heads().pretraining)
    throw std::logic_error("hand_decoder_to_first_stage: not a last stage below the embeddings");
  decoder_elsewhere_ = true;
}

DecoderInput BertModel::decoder_input() const {
  if (!layout_.has_heads() || !layout_.heads().pretraining)
    throw std::logic_error("decoder_input: no MLM head here");
  return {cur_->ws.get(Rec::mlm_t3), p_.mlm_bias};
}

void BertModel::add_decoder_grad(const DecoderInput& d, const std::function<void()>& progress) {
  if (!layout_.forms_decoder_grad())
    throw std::logic_error("add_decoder_grad: only a first stage below the MLM head takes it");
  if (!cur_->forwarded)
    throw std::logic_error("add_decoder_grad: the selected pass holds no forward");
  StepContext s = context();
  if (progress) s.progress = &progress;
  mlm_decoder_weight_backward(s, p_, g_, d);
}

void BertModel::heads_backward(const StepContext& s, View dh) {
  const Heads& heads = layout_.heads();
  const int n_seq = cur_->tl.sequences();
  // a regression head's targets (class_targets wrote them)
  const View values = config().regression() ? cur_->cls_values.view().shaped(1, n_seq) : View();
  if (config().family == Family::modernbert) {  // the heads read the final norm's output
    const View dtop = cur_->ws.get(Rec::dx);
    const View top = cur_->ws.get(Rec::final_out);
    s.be.zero(dtop);
    if (heads.pretraining) mlm_backward(s, p_, g_, cur_->out, dtop);
    if (heads.classifier)
      modernbert_classifier_backward(s, p_, g_, {cur_->cls_targets.data(), values}, cur_->out,
                                     dtop);
    if (heads.span)
      modernbert_span_backward(s, p_, g_, top, cur_->span_targets.data(), cur_->out, dtop);
    final_norm_backward(s, p_, g_, input_of(layout_.stage_config().num_hidden_layers), dtop, dh);
    return;
  }
  s.be.zero(dh);
  s.be.zero(cur_->ws.get(Rec::dpooled));
  if (heads.pretraining) {
    mlm_backward(s, p_, g_, cur_->out, dh);
    nsp_backward(s, p_, g_, cur_->tl.nsp_label.data(), cur_->out);
  }
  if (heads.classifier)
    classifier_backward(s, p_, g_, {cur_->cls_targets.data(), values}, cur_->out,
                        cur_->ws.get(Rec::dpooled));
  if (heads.span) span_backward(s, p_, g_, top(), cur_->span_targets.data(), cur_->out, dh);
  pooler_backward(s, p_, g_, dh);
}

void BertModel::embeddings_backward_of(const StepContext& s, View dh) {
  const bool modern = config().family == Family::modernbert;
  if (word_rows_.empty()) {
    if (modern)
      modernbert_embeddings_backward(s, p_, g_, cur_->ids.data(), dh);
    else
      embeddings_backward(s, p_, g_, cur_->ids.data(), cur_->pos.data(), cur_->types.data(), dh);
    return;
  }
  // The word table's share into word_rows_grads(), at each id's place among the rows.
  cur_->word_ids.resize(cur_->ids.size());
  for (size_t t = 0; t < cur_->ids.size(); ++t) {
    const auto at = std::lower_bound(word_rows_.begin(), word_rows_.end(), cur_->ids[t]);
    if (at == word_rows_.end() || *at != cur_->ids[t])
      throw std::logic_error("a token id outside the deferred word rows");
    cur_->word_ids[t] = static_cast<int32_t>(at - word_rows_.begin());
  }
  if (modern)
    modernbert_embeddings_backward(s, p_, g_, cur_->word_ids.data(), dh, word_rows_grads());
  else
    embeddings_backward(s, p_, g_, cur_->word_ids.data(), cur_->pos.data(), cur_->types.data(), dh,
                        word_rows_grads());
}

void BertModel::embeddings_of(const StepContext& s, View out) {
  if (config().family == Family::modernbert)
    modernbert_embeddings_forward(s, p_, cur_->ids.data(), out);
  else
    embeddings_forward(s, p_, cur_->ids.data(), cur_->pos.data(), cur_->types.data(), out);
}

void BertModel::layer_forward(const StepContext& s, int l, View out_wide, View out) {
  const int at = layout_.stage().first + l;
  if (!out) out = output_of(l);
  if (config().family == Family::modernbert)
    modernbert_layer_forward(s, at, p_.layers[at], record_of(l), input_of(l), out);
  else
    encoder_layer_forward(s, at, p_.layers[at], record_of(l), input_of(l), out, out_wide);
}

void BertModel::refuse_unbuilt_modernbert(const StepOptions& options) const {
  const BertConfig& c = config();
  if (options.training && (c.attention_probs_dropout_prob > 0 || c.modern.embedding_dropout > 0 ||
                           c.modern.mlp_dropout > 0 || c.modern.classifier_dropout > 0))
    throw InputError(
        "a ModernBERT trains without dropout here (attention_dropout, embedding_dropout, "
        "mlp_dropout and classifier_dropout 0, transformers' defaults): its dropout is not built");
}

}  // namespace packbert::model
