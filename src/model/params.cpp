#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "error.h"
#include "kernels/block_pattern.h"
#include "kernels/tensor.h"
#include "rng.h"

namespace packbert::model {

ParamLayout::ParamLayout(const BertConfig& c, Heads heads, Sparsity sparsity, Stage stage)
    : config_(c), heads_(heads), sparsity_(sparsity), stage_(stage) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  const int L = c.num_hidden_layers;
  if (stage_.end == -1) stage_.end = L;
  if (!(0 <= stage_.first && stage_.first < stage_.end && stage_.end <= L))
    throw InputError("pipeline stage: layers [" + std::to_string(stage_.first) + ", " +
                     std::to_string(stage_.end) + ") of a " + std::to_string(L) + "-layer model");
  stage_config_ = c;
  stage_config_.num_hidden_layers = stage_.end - stage_.first;
  stage_config_.modern.first_layer = stage_.first;
  if (sparsity.on()) {
    if (!kernels::supported_block(sparsity.block))
      throw InputError("`block` " + std::to_string(sparsity.block) + ": expected 1, 4, 8 or 16");
    if (C % sparsity.block || I % sparsity.block)
      throw InputError("`block` " + std::to_string(sparsity.block) +
                       " does not divide hidden_size " + std::to_string(C) +
                       " and intermediate_size " + std::to_string(I));
    if (!(sparsity.sparsity >= 0 && sparsity.sparsity < 1))
      throw InputError("`sparsity` " + std::to_string(sparsity.sparsity) + ": expected [0, 1)");
  }
  const bool sp = sparsity.on();
  if (c.family == Family::modernbert) {
    if (sp) throw InputError("block-sparse weights: BERT's layers only; not ModernBERT's yet");
    add_modernbert();
  } else {
    if (has_embeddings() || (has_heads() && heads.pretraining))
      add("bert.embeddings.word_embeddings.weight", {c.vocab_size, C});
    if (has_embeddings()) {
      add("bert.embeddings.position_embeddings.weight", {c.max_position_embeddings, C});
      add("bert.embeddings.token_type_embeddings.weight", {c.type_vocab_size, C});
      add("bert.embeddings.LayerNorm.weight", {C});
      add("bert.embeddings.LayerNorm.bias", {C});
    }
    for (int l = stage_.first; l < stage_.end; ++l) {
      std::string p = "bert.encoder.layer." + std::to_string(l) + ".";
      // query/key/value weights adjacent, then their biases adjacent: the fused QKV views.
      // (no alignment padding between the three, or the fused [3C, C] / [3C] views would break).
      add(p + "attention.self.query.weight", {C, C}, true, sp);
      add(p + "attention.self.key.weight", {C, C}, false, sp);
      add(p + "attention.self.value.weight", {C, C}, false, sp);
      add(p + "attention.self.query.bias", {C});
      add(p + "attention.self.key.bias", {C}, false);
      add(p + "attention.self.value.bias", {C}, false);
      add(p + "attention.output.dense.weight", {C, C}, true, sp);
      add(p + "attention.output.dense.bias", {C});
      add(p + "attention.output.LayerNorm.weight", {C});
      add(p + "attention.output.LayerNorm.bias", {C});
      add(p + "intermediate.dense.weight", {I, C}, true, sp);
      add(p + "intermediate.dense.bias", {I});
      add(p + "output.dense.weight", {C, I}, true, sp);
      add(p + "output.dense.bias", {C});
      add(p + "output.LayerNorm.weight", {C});
      add(p + "output.LayerNorm.bias", {C});
    }
    if (has_heads()) add_heads();
  }
  // Where each tensor sits in the whole model (the same place unless this is a stage).
  if (whole()) {
    for (size_t k = 0; k < tensors_.size(); ++k)
      tensors_[k].whole_index = k, tensors_[k].whole_offset = tensors_[k].offset;
    return;
  }
  const ParamLayout all(c, heads, sparsity);
  for (TensorSpec& t : tensors_) {
    const TensorSpec* w = all.find(t.name);
    t.whole_index = static_cast<size_t>(w - all.tensors().data()), t.whole_offset = w->offset;
  }
}

void ParamLayout::add_modernbert() {
  const BertConfig& c = config_;
  const ModernBertFields& m = c.modern;
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  // A LayerNorm: its weight, and its bias under norm_bias; a linear layer's bias under `bias`.
  auto norm = [&](const std::string& name) {
    add(name + ".weight", {C});
    if (m.norm_bias) add(name + ".bias", {C});
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
    add(name + ".weight", {out, in});
    if (bias) add(name + ".bias", {out});
  };
  if (heads_.classifier && heads_.span)
    throw InputError("ModernBERT carries one task head (classifier or span), not both");
  if (has_embeddings() || (has_heads() && heads_.pretraining))
    add(word_table_name(Family::modernbert), {c.vocab_size, C});
  if (has_embeddings()) norm("model.embeddings.norm");
  for (int l = stage_.first; l < stage_.end; ++l) {
    const std::string p = layer_prefix(Family::modernbert, l);
    if (l > 0) norm(p + "attn_norm");  // layer 0's is an identity
    linear(p + "attn.Wqkv", 3 * C, C, m.attention_bias);
    linear(p + "attn.Wo", C, C, m.attention_bias);
    norm(p + "mlp_norm");
    linear(p + "mlp.Wi", 2 * I, C, m.mlp_bias);
    linear(p + "mlp.Wo", C, I, m.mlp_bias);
  }
  if (!has_heads()) return;
  norm("model.final_norm");
  if (heads_.pretraining || heads_.classifier || heads_.span) {  // the prediction head
    linear("head.dense", C, C, m.classifier_bias);
    norm("head.norm");
  }
  if (heads_.pretraining && m.decoder_bias) add("decoder.bias", {c.vocab_size});
  // ModernBertForSequenceClassification's and ModernBertForQuestionAnswering's (two outputs,
  // start and end) output layer are both named classifier.
  if (heads_.classifier) linear("classifier", c.num_labels, C, true);
  if (heads_.span) linear("classifier", 2, C, true);
}

const char* ParamLayout::word_table_name(Family f) {
  return f == Family::modernbert ? "model.embeddings.tok_embeddings.weight"
                                 : "bert.embeddings.word_embeddings.weight";
}

std::string ParamLayout::layer_prefix(Family f, int l) {
  return (f == Family::modernbert ? "model.layers." : "bert.encoder.layer.") + std::to_string(l) +
         ".";
}

void ParamLayout::add_heads() {
  const BertConfig& c = config_;
  const int64_t C = c.hidden_size;
  add("bert.pooler.dense.weight", {C, C});
  add("bert.pooler.dense.bias", {C});
  if (heads_.pretraining) {
    add("cls.predictions.transform.dense.weight", {C, C});
    add("cls.predictions.transform.dense.bias", {C});
    add("cls.predictions.transform.LayerNorm.weight", {C});
    add("cls.predictions.transform.LayerNorm.bias", {C});
    add("cls.predictions.bias", {c.vocab_size});
    add("cls.seq_relationship.weight", {2, C});
    add("cls.seq_relationship.bias", {2});
  }
  if (heads_.classifier) {
    add("classifier.weight", {c.num_labels, C});
    add("classifier.bias", {c.num_labels});
  }
  if (heads_.span) {
    add("qa_outputs.weight", {2, C});
    add("qa_outputs.bias", {2});
  }
}

void ParamLayout::add(const std::string& name, std::vector<int64_t> shape, bool align,
                      bool sparse) {
  TensorSpec t;
  t.name = name;
  t.shape = std::move(shape);
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= static_cast<size_t>(d);
  if (sparse) {
    const int B = sparsity_.block;
    t.block = B;
    t.kept_blocks = kernels::blocks_kept(static_cast<int>(t.shape[0]), static_cast<int>(t.shape[1]),
                                         B, sparsity_.sparsity);
    t.numel = static_cast<size_t>(t.kept_blocks) * B * B;
  }
  // Tensors start at a multiple of 16 elements from the arena's start (64 bytes of floats)
  // unless they continue a fused group; their addresses are 64-byte aligned only as far as the
  // arena's own storage is (a std::vector's: 16 bytes guaranteed).
  t.offset = align ? (total_ + 15) / 16 * 16 : total_;
  total_ = t.offset + t.numel;
  const bool is_ln = name.find("LayerNorm") != std::string::npos || name.ends_with("norm.weight") ||
                     name.ends_with("norm.bias");
  bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
  t.no_decay = is_ln || is_bias;
  t.is_layernorm_weight = is_ln && !is_bias;
  t.is_matrix_init = !t.no_decay;
  tensors_.push_back(std::move(t));
}

const TensorSpec* ParamLayout::find(const std::string& name) const {
  for (const TensorSpec& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

size_t layer_linear_numel(const ParamLayout& layout) {
  size_t n = 0;  // (of a stage's first layer: every layer holds the same)
  const std::string first = ParamLayout::layer_prefix(layout.config().family, layout.stage().first);
  for (const TensorSpec& t : layout.tensors())
    if (t.name.rfind(first, 0) == 0 && t.shape.size() == 2) n += t.numel;
  return n;
}

bool read_only_in_16bit(const TensorSpec& t) {
  auto ends_with = [&](const std::string& tail) {
    return t.name.size() >= tail.size() &&
           t.name.compare(t.name.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (t.name == "bert.embeddings.word_embeddings.weight" ||
      t.name == "cls.predictions.transform.dense.weight")
    return true;
  if (t.name == "model.embeddings.tok_embeddings.weight" || t.name == "head.dense.weight")
    return true;
  if (t.name.starts_with("model.layers."))
    return t.name.ends_with(".Wqkv.weight") || t.name.ends_with(".Wo.weight") ||
           t.name.ends_with(".Wi.weight");
  if (t.name.rfind("bert.encoder.layer.", 0) != 0) return false;
  return ends_with(".query.weight") || ends_with(".key.weight") || ends_with(".value.weight") ||
         ends_with(".dense.weight");
}

KeptArena fp32_kept_arena(const ParamLayout& layout) {
  KeptArena a;
  size_t prev_end = SIZE_MAX;
  for (const TensorSpec& t : layout.tensors()) {
    if (read_only_in_16bit(t)) continue;
    if (t.offset != prev_end) a.total = (a.total + 15) / 16 * 16;
    a.places.push_back({t.offset, a.total, t.numel});
    a.total += t.numel;
    prev_end = t.offset + t.numel;
  }
  return a;
}

ParamView::ParamView(const ParamLayout& layout, const kernels::View& arena)
    : ParamView(layout, [&arena](const TensorSpec& t) {
        return arena.slice(static_cast<int64_t>(t.offset), static_cast<int64_t>(t.numel));
      }) {}

namespace {

using kernels::View;

// Where each named view of ParamView / LayerView lies in a family: its Hugging Face name (a
// layer's after the family's layer prefix). BERT's qkv_w and qkv_b start at the query's tensor and
// span query, key and value; ModernBERT's Wqkv is one tensor.
struct ModelTensor {
  View ParamView::*field;
  const char* bert;
  const char* modernbert;  // (null: the family has none)
};
const ModelTensor kModelTensors[] = {
    {&ParamView::word, "bert.embeddings.word_embeddings.weight",
     "model.embeddings.tok_embeddings.weight"},
    {&ParamView::position, "bert.embeddings.position_embeddings.weight", nullptr},
    {&ParamView::token_type, "bert.embeddings.token_type_embeddings.weight", nullptr},
    {&ParamView::emb_ln_w, "bert.embeddings.LayerNorm.weight", "model.embeddings.norm.weight"},
    {&ParamView::emb_ln_b, "bert.embeddings.LayerNorm.bias", "model.embeddings.norm.bias"},
    {&ParamView::final_ln_w, nullptr, "model.final_norm.weight"},
    {&ParamView::final_ln_b, nullptr, "model.final_norm.bias"},
    {&ParamView::pool_w, "bert.pooler.dense.weight", nullptr},
    {&ParamView::pool_b, "bert.pooler.dense.bias", nullptr},
    {&ParamView::mlm_w, "cls.predictions.transform.dense.weight", "head.dense.weight"},
    {&ParamView::mlm_b, "cls.predictions.transform.dense.bias", "head.dense.bias"},
    {&ParamView::mlm_ln_w, "cls.predictions.transform.LayerNorm.weight", "head.norm.weight"},
    {&ParamView::mlm_ln_b, "cls.predictions.transform.LayerNorm.bias", "head.norm.bias"},
    {&ParamView::mlm_bias, "cls.predictions.bias", "decoder.bias"},
    {&ParamView::nsp_w, "cls.seq_relationship.weight", nullptr},
    {&ParamView::nsp_b, "cls.seq_relationship.bias", nullptr},
    {&ParamView::cls_w, "classifier.weight", "classifier.weight"},
    {&ParamView::cls_b, "classifier.bias", "classifier.bias"},
    {&ParamView::span_w, "qa_outputs.weight", "classifier.weight"},
    {&ParamView::span_b, "qa_outputs.bias", "classifier.bias"},
};
struct LayerTensor {
  View LayerView::*field;
  const char* bert;
  const char* modernbert;
};
const LayerTensor kLayerTensors[] = {
    {&LayerView::qkv_w, "attention.self.query.weight", "attn.Wqkv.weight"},
    {&LayerView::qkv_b, "attention.self.query.bias", "attn.Wqkv.bias"},
    {&LayerView::attn_out_w, "attention.output.dense.weight", "attn.Wo.weight"},
    {&LayerView::attn_out_b, "attention.output.dense.bias", "attn.Wo.bias"},
    {&LayerView::ln1_w, "attention.output.LayerNorm.weight", "attn_norm.weight"},
    {&LayerView::ln1_b, "attention.output.LayerNorm.bias", "attn_norm.bias"},
    {&LayerView::inter_w, "intermediate.dense.weight", "mlp.Wi.weight"},
    {&LayerView::inter_b, "intermediate.dense.bias", "mlp.Wi.bias"},
    {&LayerView::out_w, "output.dense.weight", "mlp.Wo.weight"},
    {&LayerView::out_b, "output.dense.bias", "mlp.Wo.bias"},
    {&LayerView::ln2_w, "output.LayerNorm.weight", "mlp_norm.weight"},
    {&LayerView::ln2_b, "output.LayerNorm.bias", "mlp_norm.bias"},
};

}  // namespace

ParamView::ParamView(const ParamLayout& layout,
                     const std::function<kernels::View(const TensorSpec&)>& place) {
  const Family family = layout.config().family;
  const bool modern = family == Family::modernbert;
  // Each tensor as the ops read it: a dense matrix as its PyTorch shape [out, in], a bias or norm
  // as [1, n], a block-sparse weight's kept values as a vector.
  auto at = [&](const char* name) -> View {
    const TensorSpec* t = name ? layout.find(name) : nullptr;
    if (!t) return View();
    const View v = place(*t);
    if (!v || t->block) return v;
    return t->shape.size() == 2 ? v.shaped(t->shape[0], t->shape[1]) : v.shaped(1, v.numel());
  };
  for (const ModelTensor& m : kModelTensors) {
    // ModernBERT names both task heads' output layer `classifier`: it is the head the model has.
    const bool span = m.field == &ParamView::span_w || m.field == &ParamView::span_b;
    const bool cls = m.field == &ParamView::cls_w || m.field == &ParamView::cls_b;
    if (modern && ((span && !layout.heads().span) || (cls && !layout.heads().classifier))) continue;
    this->*m.field = at(modern ? m.modernbert : m.bert);
  }
  for (int l = 0; l < layout.config().num_hidden_layers; ++l) {
    const std::string prefix = ParamLayout::layer_prefix(family, l);
    LayerView& v = layers.emplace_back();
    for (const LayerTensor& t : kLayerTensors)
      v.*t.field = at((prefix + (modern ? t.modernbert : t.bert)).c_str());
    // BERT's query | key | value, adjacent in every arena (ParamLayout's fused groups): [3C, C]
    // and [1, 3C] (a block-sparse weight: the three tensors' kept values, one vector).
    if (!modern) {
      View& w = v.qkv_w;
      if (w && w.rows > 1)
        w.rows *= 3;
      else
        w.cols = w.ld = 3 * w.cols;
      v.qkv_b.cols = v.qkv_b.ld = 3 * v.qkv_b.cols;
    }
  }
}

const char* sparse_init_name(SparseInit init) {
  return init == SparseInit::fan_in ? "fan-in" : "dense";
}

SparseInit parse_sparse_init(const std::string& name, const std::string& flag) {
  if (name == "dense") return SparseInit::dense;
  if (name == "fan-in") return SparseInit::fan_in;
  throw InputError(flag + " " + name + ": expected dense or fan-in");
}

double sparse_init_factor(const TensorSpec& t, SparseInit init) {
  if (init != SparseInit::fan_in || !t.block) return 1.0;
  const double dense = static_cast<double>(t.shape[0]) * static_cast<double>(t.shape[1]);
  return std::sqrt(dense / static_cast<double>(t.numel));
}

template <typename T>
void init_params(const ParamLayout& layout, T* params, uint64_t seed, SparseInit sparse) {
  SplitMix64 rng(seed);
  // The whole model's stream, tensor by tensor: a stage's tensors take their values from it,
  // the draws of the others are skipped (two a matrix element).
  std::optional<ParamLayout> whole;
  if (!layout.whole()) whole.emplace(layout.config(), layout.heads(), layout.sparsity());
  for (const TensorSpec& w : (whole ? *whole : layout).tensors()) {
    const TensorSpec* held = whole ? layout.find(w.name) : &w;
    if (!held) {
      if (w.is_matrix_init) rng.state += 2 * static_cast<uint64_t>(w.numel) * kGolden64;
      continue;
    }
    const TensorSpec& t = *held;
    const double std = layout.config().initializer_range * sparse_init_factor(t, sparse);
    T* p = params + t.offset;
    for (size_t i = 0; i < t.numel; ++i) {
      if (t.is_matrix_init) {
        // Box-Muller from two 53-bit uniforms.
        double u1 = (static_cast<double>(rng.next() >> 11) + 0.5) * 0x1.0p-53;
        double u2 = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
        p[i] = static_cast<T>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
      } else {
        p[i] = t.is_layernorm_weight ? T(1) : T(0);
      }
    }
  }
  // Row 0 ([PAD], HF's padding_idx) of the word embeddings starts at zero, as in HF.
  if (const TensorSpec* word = layout.find("bert.embeddings.word_embeddings.weight"))
    std::fill(params + word->offset, params + word->offset + word->shape[1], T(0));
}

template void init_params<float>(const ParamLayout&, float*, uint64_t, SparseInit);
template void init_params<double>(const ParamLayout&, double*, uint64_t, SparseInit);

bool is_encoder_tensor(const std::string& name) {
  return name.starts_with("bert.embeddings.") || name.starts_with("bert.encoder.") ||
         name.starts_with("model.");
}

}  // namespace packbert::model
