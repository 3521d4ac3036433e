// A BERT in the forms users have one in, read into one shape: a Hugging Face directory
// (config.json beside model.safetensors or pytorch_model.bin, or their sharded *.index.json),
// a single .safetensors or torch.save .bin file, or a shard index. Tensor names are brought to
// BertForPreTraining's (a bare BertModel's "embeddings.*" gains "bert.", an old checkpoint's
// LayerNorm gamma/beta become weight/bias, as transformers does when it loads them); values
// and dtypes are kept exactly as stored. A packbert checkpoint is not read here
// (train::load_model reads those).
#pragma once

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"

namespace packbert::model {

struct ImportedModel {
  BertConfig config;
  std::string config_json;      // the source's config.json as written ("" when inferred)
  std::string config_from;      // the file it came from, or "inferred from the tensor shapes"
  io::SafetensorsFile weights;  // every tensor of the source, Hugging Face names
  std::string format;           // "safetensors" or "torch.save", and "N shards" when sharded
  std::string vocab;            // vocab.txt beside the source, "" when there is none
  int renamed = 0;              // tensors whose names were brought to BertForPreTraining's
  std::string architecture;     // config.json's first `architectures` entry ("" when none)
  // A tokenizer.json beside the source (ModernBERT's tokenizer), "" when there is none.
  std::string tokenizer_json;
};

// `config_path` (when not empty) replaces the config.json found beside the source. Without
// either, `infer` takes the shape from the tensors (heads = hidden / 64, the rule every published
// BERT follows); else that is an error. Throws InputError naming the file and what is wrong.
ImportedModel import_model(const std::string& src, const std::string& config_path = "",
                           bool infer = false);

// The heads whose tensors the weights hold (classifier: classifier.weight, span: qa_outputs.*,
// pretraining: the MLM transform): a BERT's, as a packbert checkpoint holds them.
Heads heads_present(const io::SafetensorsFile& weights);
// The same for an imported model of either family: a ModernBERT's prediction head (head.dense)
// with no classifier is its masked-LM head; its classifier is the span head when the config
// names ModernBertForQuestionAnswering, else the sequence classifier.
Heads heads_present(const ImportedModel& m);
// What transformers instantiates for a model of `config`'s family with these heads:
// BertForPreTraining / BertForMaskedLM / ..., ModernBertForMaskedLM / ... (`masked_lm`: a BERT
// masked-LM model, without NSP).
std::string architecture_of(const BertConfig& config, const Heads& heads, bool masked_lm = false);

// Checks the weights against the layout of `config` and `heads`: every tensor present has the
// layout's shape, and the embeddings and encoder are whole. Returns the layout's tensors that
// are absent (a BertForMaskedLM has no pooler or NSP head); throws InputError otherwise.
std::vector<std::string> check_imported(const ImportedModel& m, const Heads& heads);

// Writes config.json (the source's as written, or the inferred config with the architecture of
// the heads present) and model.safetensors (every tensor, bytes and dtype as read, sorted by
// name) into the existing directory `dir`, each file atomically; and the source's tokenizer.json
// with its tokenizer_config.json and special_tokens_map.json, where it has one.
void write_imported(const ImportedModel& m, const std::string& dir);

// Copies tokenizer.json, tokenizer_config.json and special_tokens_map.json, those of them that
// are in directory `from`, into the existing directory `dir`, each atomically.
void copy_tokenizer_files(const std::string& from, const std::string& dir);

// True when `path` is a file written by packbert (a checkpoint: safetensors with a "config" in
// its metadata).
bool is_packbert_checkpoint(const std::string& path);

}  // namespace packbert::model
