// Parameters: one contiguous arena per kind (weights, gradients, optimizer moments), laid out
// by ParamLayout under Hugging Face BERT tensor names, reached through structs of named views.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/tensor.h"
#include "model/config.h"

namespace packbert::model {

// Which heads the model carries besides the encoder and pooler.
struct Heads {
  bool pretraining = true;  // MLM (transform + LayerNorm + decoder tied to word embeddings) + NSP
  bool classifier = false;  // sequence classification on the pooled [CLS]
  bool span = false;        // SQuAD start/end logits per token
};

// Block-sparse encoder weights (docs/DESIGN.md §7): every encoder linear weight (query, key,
// value, attention output, FFN up and down) keeps a fixed number of block x block blocks, the
// fraction 1 - sparsity of its blocks (kernels/sparse.h). block 0: dense.
struct Sparsity {
  int block = 0;
  double sparsity = 0;
  bool on() const { return block > 0; }
  bool operator==(const Sparsity&) const = default;
};

// One pipeline stage's share of the model (docs/DESIGN.md §7c): encoder layers [first, end); the
// embeddings on the first stage (first == 0); the pooler and the heads on the last (end == the
// layer count), with the word table as well where the MLM decoder reads it: BERT ties the
// decoder to the word embeddings, so the first and the last stage both hold the table and a
// pipeline sums its two gradient shares. The default, {0, -1}, is the whole model.
struct Stage {
  int first = 0, end = -1;  // end -1: through the last layer
  bool operator==(const Stage&) const = default;
};

struct TensorSpec {
  std::string name;  // Hugging Face name, e.g. bert.encoder.layer.0.attention.self.query.weight
  std::vector<int64_t> shape;  // PyTorch shape (Linear weights are [out, in]), dense
  size_t offset = 0;           // in elements, into the arena
  size_t numel = 0;            // elements held: the kept blocks' values when block-sparse
  int block = 0;               // block-sparse: the block size (0 = dense)
  int kept_blocks = 0;         // block-sparse: the blocks kept (numel = kept_blocks * block^2)
  // What the arena holds: `shape`, or [kept_blocks, block, block] when block-sparse.
  std::vector<int64_t> stored_shape() const {
    return block ? std::vector<int64_t>{kept_blocks, block, block} : shape;
  }
  bool no_decay = false;        // biases and LayerNorm: no weight decay, no LAMB trust ratio
  bool is_matrix_init = false;  // initialised N(0, initializer_range); else zeros / LayerNorm ones
  bool is_layernorm_weight = false;
  // The tensor's index and offset in the whole model's layout (a pipeline stage's tensors sit
  // elsewhere in their own arena): what keys its stochastic rounding, so a stage rounds as the
  // whole model does.
  size_t whole_index = 0, whole_offset = 0;
};

class ParamLayout {
 public:
  // Throws InputError when a sparse block size does not divide the encoder's weights.
  // With a stage, only that stage's tensors (under their whole-model names); InputError when
  // the stage's layers are not a non-empty range of the config's.
  ParamLayout(const BertConfig& config, Heads heads, Sparsity sparsity = {}, Stage stage = {});
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // The stage, its end resolved ({0, L} for the whole model), and what it holds.
  const Stage& stage() const { return stage_; }
  bool whole() const { return stage_.first == 0 && stage_.end == config_.num_hidden_layers; }
  bool has_embeddings() const { return stage_.first == 0; }
  bool has_heads() const { return stage_.end == config_.num_hidden_layers; }
  // What shapes the stage's step (its workspace, its FLOPs): config() with the stage's layer
  // count, and the heads it runs (heads() on the last stage, none before it).
  const BertConfig& stage_config() const { return stage_config_; }
  Heads stage_heads() const { return has_heads() ? heads_ : Heads{false, false, false}; }
  // A pipeline's first stage below the pretraining heads: it holds the word table tied to the
  // MLM decoder and forms the decoder's share of the table's gradient (model/heads.h,
  // mlm_decoder_weight_backward).
  bool forms_decoder_grad() const { return has_embeddings() && !has_heads() && heads_.pretraining; }
  // The heads whose records the stage's workspace holds: stage_heads(), and the MLM head's where
  // the stage forms the decoder's gradient.
  Heads workspace_heads() const {
    return forms_decoder_grad() ? Heads{true, false, false} : stage_heads();
  }
  size_t total() const { return total_; }
  const TensorSpec* find(const std::string& name) const;  // null if absent
  // The word table (tied to the MLM decoder), where this stage holds it; null elsewhere.
  const TensorSpec* word_table() const { return find(word_table_name(config_.family)); }
  // Its name in a family: bert.embeddings.word_embeddings.weight,
  // model.embeddings.tok_embeddings.weight.
  static const char* word_table_name(Family f);
  // Where layer l's tensors are named from: "bert.encoder.layer.<l>.", "model.layers.<l>.".
  static std::string layer_prefix(Family f, int l);
  const BertConfig& config() const { return config_; }
  const Heads& heads() const { return heads_; }
  const Sparsity& sparsity() const { return sparsity_; }

 private:
  void add(const std::string& name, std::vector<int64_t> shape, bool align = true,
           bool sparse = false);
  void add_heads();  // the pooler and the heads_ (a last stage's, or the whole model's)
  // ModernBERT's tensors under transformers' names (its embeddings, layers and heads).
  void add_modernbert();
  BertConfig config_;
  Heads heads_;
  Sparsity sparsity_;
  Stage stage_;
  BertConfig stage_config_;
  std::vector<TensorSpec> tensors_;
  size_t total_ = 0;
};

// Named views into an arena laid out by ParamLayout (weights, gradients, or the 16-bit copy of
// the weights: the arena's DType is theirs). Each View is the tensor as the ops read it: a
// dense weight as its PyTorch shape [out, in], a bias or norm as [1, n], a block-sparse weight's
// kept values as a vector; empty where the arena lacks it. qkv_w is the [3C, C] concatenation of
// query, key and value weights (adjacent in the arena), qkv_b the matching [1, 3C] biases, so one
// GEMM produces q | k | v per token.
struct LayerView {
  kernels::View qkv_w, qkv_b, attn_out_w, attn_out_b, ln1_w, ln1_b;
  kernels::View inter_w, inter_b, out_w, out_b, ln2_w, ln2_b;
};

// A ModernBERT layer's ln1 is its attention norm (before attention; absent in layer 0, whose
// input is the embeddings' norm) and ln2 its MLP norm; qkv is its Wqkv, inter its Wi [2I, C] (the
// GeGLU's two halves), out its Wo of the MLP; final_ln the norm after the last layer.
struct ParamView {
  kernels::View word, position, token_type, emb_ln_w, emb_ln_b;
  std::vector<LayerView> layers;
  kernels::View final_ln_w, final_ln_b;
  kernels::View pool_w, pool_b;
  kernels::View mlm_w, mlm_b, mlm_ln_w, mlm_ln_b, mlm_bias;
  kernels::View nsp_w, nsp_b;
  kernels::View cls_w, cls_b;
  kernels::View span_w, span_b;

  ParamView() = default;
  // Each tensor at its layout offset in `arena` (a vector of layout.total() elements).
  ParamView(const ParamLayout& layout, const kernels::View& arena);
  // Each tensor where `at` places it (an empty View: nowhere in this view).
  ParamView(const ParamLayout& layout, const std::function<kernels::View(const TensorSpec&)>& at);
};

// Elements one encoder layer's linear weights hold (query, key, value, attention output, FFN up
// and down): C x (3C + C + 2I) dense, their kept blocks' values when block-sparse. Every layer
// holds the same; the FLOP counts of plan, metrics and benchmarks derive from it.
size_t layer_linear_numel(const ParamLayout& layout);

// Whether a tensor is part of the embeddings or encoder (bert.embeddings.*, bert.encoder.*;
// ModernBERT's model.*): what every model needs from its source, where heads and the pooler may
// start fresh.
bool is_encoder_tensor(const std::string& name);

// Whether a 16-bit step reads tensor t only in 16 bits: the encoder layers' and the MLM
// transform's matrices (GEMM operands) and the word embeddings (the MLM decoder's operand, and
// the embedding gather under 16-bit master weights). Every other tensor (biases,
// LayerNorm, position and token-type embeddings, the pooler and the small heads) is also read
// in fp32.
bool read_only_in_16bit(const TensorSpec& t);

// Under 16-bit master weights the fp32 arena keeps only the tensors not read_only_in_16bit, in
// arena order: where each lies in the whole arena and in the kept one. A tensor that follows the
// previous kept one directly in the arena (the key and value biases after the query's) follows
// it in the kept arena too; the others start on a 64-byte boundary, as in the arena.
struct KeptPlace {
  size_t whole, kept, numel;
};
struct KeptArena {
  std::vector<KeptPlace> places;
  size_t total = 0;  // elements
};
KeptArena fp32_kept_arena(const ParamLayout& layout);

// How block-sparse weights start. dense: as the dense model's, N(0, initializer_range)
// (Graphcore's). fan_in: that times 1 / sqrt(kept fraction), so each output of a sparse layer
// starts with the dense layer's variance (an output sums about a tenth of the inputs at s = 0.9).
// Both draw the same numbers: fan_in's values are dense's scaled.
enum class SparseInit { dense, fan_in };
const char* sparse_init_name(SparseInit init);  // "dense" / "fan-in"
// "dense" or "fan-in"; InputError naming `flag` otherwise.
SparseInit parse_sparse_init(const std::string& name, const std::string& flag);
// The factor fan_in multiplies a block-sparse tensor's standard deviation by: 1 / sqrt(its kept
// elements / its dense elements); 1 for a dense tensor or under SparseInit::dense.
double sparse_init_factor(const TensorSpec& t, SparseInit init);

// Hugging Face initialisation: Linear and Embedding weights ~ N(0, initializer_range), biases 0,
// LayerNorm weight 1 and bias 0; block-sparse weights as `sparse` says. Deterministic for a seed,
// and a stage's layout gets the values the whole model's has in its tensors.
template <typename T>
void init_params(const ParamLayout& layout, T* params, uint64_t seed,
                 SparseInit sparse = SparseInit::dense);

}  // namespace packbert::model
