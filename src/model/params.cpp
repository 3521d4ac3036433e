#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "error.h"
#include "kernels/cpu/sparse.h"
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
                     std::to_string(stage_.end) + ") of a " + std::to_string(L) +
                     "-layer model");
  stage_config_ = c;
  stage_config_.num_hidden_layers = stage_.end - stage_.first;
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
  bool is_ln = name.find("LayerNorm") != std::string::npos;
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
  const std::string first = "bert.encoder.layer." + std::to_string(layout.stage().first) + ".";
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

// Where each named view of ParamView / LayerView lies: its Hugging Face name (a layer's after
// "bert.encoder.layer.<l>."). qkv_w and qkv_b start at the query's tensor and span query, key
// and value.
const std::pair<View ParamView::*, const char*> kModelTensors[] = {
    {&ParamView::word, "bert.embeddings.word_embeddings.weight"},
    {&ParamView::position, "bert.embeddings.position_embeddings.weight"},
    {&ParamView::token_type, "bert.embeddings.token_type_embeddings.weight"},
    {&ParamView::emb_ln_w, "bert.embeddings.LayerNorm.weight"},
    {&ParamView::emb_ln_b, "bert.embeddings.LayerNorm.bias"},
    {&ParamView::pool_w, "bert.pooler.dense.weight"},
    {&ParamView::pool_b, "bert.pooler.dense.bias"},
    {&ParamView::mlm_w, "cls.predictions.transform.dense.weight"},
    {&ParamView::mlm_b, "cls.predictions.transform.dense.bias"},
    {&ParamView::mlm_ln_w, "cls.predictions.transform.LayerNorm.weight"},
    {&ParamView::mlm_ln_b, "cls.predictions.transform.LayerNorm.bias"},
    {&ParamView::mlm_bias, "cls.predictions.bias"},
    {&ParamView::nsp_w, "cls.seq_relationship.weight"},
    {&ParamView::nsp_b, "cls.seq_relationship.bias"},
    {&ParamView::cls_w, "classifier.weight"},
    {&ParamView::cls_b, "classifier.bias"},
    {&ParamView::span_w, "qa_outputs.weight"},
    {&ParamView::span_b, "qa_outputs.bias"},
};
const std::pair<View LayerView::*, const char*> kLayerTensors[] = {
    {&LayerView::qkv_w, "attention.self.query.weight"},
    {&LayerView::qkv_b, "attention.self.query.bias"},
    {&LayerView::attn_out_w, "attention.output.dense.weight"},
    {&LayerView::attn_out_b, "attention.output.dense.bias"},
    {&LayerView::ln1_w, "attention.output.LayerNorm.weight"},
    {&LayerView::ln1_b, "attention.output.LayerNorm.bias"},
    {&LayerView::inter_w, "intermediate.dense.weight"},
    {&LayerView::inter_b, "intermediate.dense.bias"},
    {&LayerView::out_w, "output.dense.weight"},
    {&LayerView::out_b, "output.dense.bias"},
    {&LayerView::ln2_w, "output.LayerNorm.weight"},
    {&LayerView::ln2_b, "output.LayerNorm.bias"},
};

}  // namespace

ParamView::ParamView(const ParamLayout& layout,
                     const std::function<kernels::View(const TensorSpec&)>& place) {
  auto at = [&](const std::string& name) -> View {
    const TensorSpec* t = layout.find(name);
    return t ? place(*t) : View();
  };
  for (const auto& [field, name] : kModelTensors) this->*field = at(name);
  for (int l = 0; l < layout.config().num_hidden_layers; ++l) {
    const std::string prefix = "bert.encoder.layer." + std::to_string(l) + ".";
    LayerView& v = layers.emplace_back();
    for (const auto& [field, name] : kLayerTensors) v.*field = at(prefix + name);
    // query | key | value, adjacent in every arena (ParamLayout's fused groups).
    for (View LayerView::*fused : {&LayerView::qkv_w, &LayerView::qkv_b})
      (v.*fused).cols = (v.*fused).ld = 3 * (v.*fused).cols;
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
  return name.starts_with("bert.embeddings.") || name.starts_with("bert.encoder.");
}

}  // namespace packbert::model
