// A model's files: loading a model from a packbert checkpoint or a Hugging Face model, the labels
// and heads its config and weights say, and writing it as a Hugging Face model directory
// (config.json, model.safetensors and the tokenizer files).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/bert.h"

namespace packbert::train {

// Loads a model from a packbert checkpoint file or a Hugging Face model in any form
// model::import_model reads (a directory with model.safetensors or pytorch_model.bin, sharded or
// not, or a single weights file); throws InputError naming what is missing or mismatched. With
// `sparsity` on, dense weights are pruned to their largest blocks (L1) and a block-sparse
// checkpoint must have the same block and sparsity; without, a block-sparse checkpoint loads as
// its dense equivalent (zeros outside the pattern).
// With `fresh` (fine-tuning, or pre-training from an encoder): the model is first initialised
// from fresh->seed, `num_labels` (when > 0) sizes the classifier, and the tensors the source
// lacks outside the embeddings and encoder keep their initial values, named in `initialized`.
struct FreshTensors {
  uint64_t seed = 0;
  int num_labels = 0;
  std::vector<std::string> initialized;
  bool new_heads = false;  // the task heads start fresh even when the source has them
  // A pipeline stage's model: the stage of the source's config to load (the whole model unset).
  std::function<model::Stage(const model::BertConfig&)> stage = {};
};

// A model's classifier labels as its config says them (id2label, in id order; empty when it has
// none), and the heads its weights hold (pre-training, a classifier, a span head): what loading
// and exporting it as it is needs.
struct ModelLabels {
  std::vector<std::string> names;
  model::Heads heads;
  // A masked-LM model (BertForMaskedLM): the MLM head without the pooler and the NSP head.
  bool masked_lm = false;
  // The directory of its tokenizer.json, where the model has one beside it ("" otherwise).
  std::string tokenizer_dir;
  model::Family family = model::Family::bert;
  bool pooler = true;  // the weights hold bert.pooler.* (a QA model or a bare BertModel may not)
  std::string source;  // where the names came from (config.json, a checkpoint's config)
  // The classifier's outputs (its config's num_labels): 1 is a regression head.
  int num_labels = 0;
  bool regression() const { return heads.classifier && num_labels == 1; }
  // Names that say nothing (transformers' defaults LABEL_0, LABEL_1, ...).
  bool generic() const;
};
ModelLabels model_labels(const std::string& path);
std::unique_ptr<model::BertModel> load_model(const std::string& path, model::Heads heads,
                                             model::Sparsity sparsity = {},
                                             FreshTensors* fresh = nullptr);

// "" when every weight of `m` is finite; else how many are not and the first tensor holding one.
std::string non_finite_weights(const model::BertModel& m);

// What a model directory holds beside config.json and model.safetensors, and how it is stored.
struct ModelFiles {
  // vocab.txt to copy in ("" for none); with it, tokenizer_config.json (do_lower_case =
  // lower_case, model_max_length = max_position_embeddings) and special_tokens_map.json, as
  // transformers' BertTokenizer writes them.
  std::string vocab;
  bool lower_case = true;
  std::vector<std::string> label_names;  // a classifier's id2label, in id order
  // How model.safetensors stores the weights (model::storage_dtype: fp32, or a 16-bit type
  // rounded to nearest, 2 bytes each), config.json's torch_dtype saying which.
  model::Precision dtype = model::Precision::fp32;
  bool masked_lm = false;  // an MLM head without NSP: BertForMaskedLM
  bool pooler = true;      // a bare encoder's source had a pooler (BertModel's default)
  // A directory whose tokenizer.json (with tokenizer_config.json and special_tokens_map.json) to
  // copy in: a ModernBERT's tokenizer ("" for none).
  std::string tokenizer_dir;
};

// vocab.txt, tokenizer_config.json and special_tokens_map.json (f.vocab, f.lower_case) into dir;
// a tokenizer.json f.vocab is copied as dir/tokenizer.json (with the tokenizer_config.json and
// special_tokens_map.json beside it, if any).
void write_tokenizer_files(const std::string& dir, const ModelFiles& f, int model_max_length);

// Writes config.json + model.safetensors (+ the tokenizer files) in the Hugging Face layout into an
// existing directory (each file atomically). The architecture is the model's head, with the
// tensors that class has: BertForSequenceClassification (label_names to id2label),
// BertForQuestionAnswering (qa_outputs.*; no pooler, as transformers has none there),
// BertForMaskedLM when `masked_lm` (no pooler, no NSP head), BertForPreTraining (MLM + NSP), and
// BertModel for an encoder without heads (its tensors named without "bert.", as transformers
// saves a base model); a ModernBERT's as ModernBertForSequenceClassification,
// ModernBertForQuestionAnswering, ModernBertForMaskedLM or ModernBertModel (without "model.").
// Refused (InputError naming the tensor) when a 16-bit dtype cannot hold a weight (fp16 above
// 65,504 would become inf).
void write_model_files(const model::BertModel& m, const std::string& dir, const ModelFiles& f);
// The same as a whole: `dir` appears complete or not at all; an earlier model directory there
// is replaced only with `overwrite` (io::StagedDirectory). Refused (InputError, nothing
// written) when a weight is not finite or f.vocab's size is not the model's vocab_size.
void export_model(const model::BertModel& m, const std::string& dir, const ModelFiles& f = {},
                  bool overwrite = false);

}  // namespace packbert::train
