// BertConfig: the model's shape, read from and written to Hugging Face's config.json.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace packbert::model {

// The model families packbert reads (docs/DESIGN.md §7c): BERT (2018) and ModernBERT (2024). A
// family is its config.json fields, its tensor names (model/params.cpp) and its layer recipe.
enum class Family { bert, modernbert };
// config.json's model_type: "bert", "modernbert".
const char* family_name(Family f);

// ModernBERT's fields of config.json beyond BERT's, as transformers' ModernBertConfig reads them
// (the older keys global_attn_every_n_layers / global_rope_theta / local_rope_theta, or the newer
// layer_types / rope_parameters).
struct ModernBertFields {
  int global_attn_every_n_layers = 3;  // layer l attends globally when l % n == 0
  int local_attention = 128;           // the other layers' window: local_attention / 2 each side
  double global_rope_theta = 160000, local_rope_theta = 10000;
  bool norm_bias = false, attention_bias = false, mlp_bias = false, classifier_bias = false;
  bool decoder_bias = true;
  std::string classifier_pooling = "cls";  // or "mean"
  double embedding_dropout = 0, mlp_dropout = 0, classifier_dropout = 0;
  double initializer_cutoff_factor = 2.0;
  // Inference switches of transformers' ModernBERT, kept for the config packbert writes back.
  bool deterministic_flash_attn = false, sparse_prediction = false;
  int sparse_pred_ignore_index = -100;
  int pad_token_id = 50283, eos_token_id = 50282, bos_token_id = 50281, cls_token_id = 50281,
      sep_token_id = 50282;

  // A pipeline stage's config (ParamLayout::stage_config) counts its layers from 0: its layer l
  // is the model's first_layer + l, whose kind it has. 0 in a whole model's config, never read
  // from or written to config.json.
  int first_layer = 0;
  bool global_layer(int l) const { return (first_layer + l) % global_attn_every_n_layers == 0; }
  // The classifier pools each sequence's mean (else its first token).
  bool mean_pooling() const { return classifier_pooling == "mean"; }
  // The attention window of layer l: 0 (global) or local_attention.
  int window(int l) const { return global_layer(l) ? 0 : local_attention; }
  double rope_theta(int l) const { return global_layer(l) ? global_rope_theta : local_rope_theta; }
  bool operator==(const ModernBertFields&) const = default;
};

struct BertConfig {
  Family family = Family::bert;
  int vocab_size = 30522;
  int hidden_size = 768;
  int num_hidden_layers = 12;
  int num_attention_heads = 12;
  int intermediate_size = 3072;
  int max_position_embeddings = 512;
  int type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  double initializer_range = 0.02;
  // The classification head's outputs; one output is a regression head (Hugging Face's rule for
  // BertForSequenceClassification: num_labels 1 is problem_type "regression", MSE loss).
  int num_labels = 2;
  // ModernBERT's own fields (family modernbert; layer_norm_eps is its norm_eps and
  // attention_probs_dropout_prob its attention_dropout; it has no token types).
  ModernBertFields modern;

  bool regression() const { return num_labels == 1; }

  int head_size() const { return hidden_size / num_attention_heads; }
  // The local layers' attention window (ModernBERT's local_attention), 0 for a family without.
  int local_window() const { return family == Family::modernbert ? modern.local_attention : 0; }
  // Throws InputError naming `source` and the offending field if the shape is unusable.
  void validate(const std::string& source) const;
};

// Presets by name: tiny 2/128/2, mini 4/256/4, small 4/512/8, medium 8/512/8, base 12/768/12,
// large 24/1024/16 (layers/hidden/heads; intermediate = 4 x hidden). Throws InputError.
BertConfig bert_preset(const std::string& name);
// ModernBERT's presets of the same names (model/config.cpp says their shapes).
BertConfig modernbert_preset(const std::string& name);

// A model shape as the flags ask for it (pretrain, plan, demo): a preset or a Hugging Face
// config.json, with any of the four sizes overridden (0 = as the preset or file has it). When
// --hidden overrides a preset's width, its heads and intermediate size follow BERT's rule (head
// size 64, intermediate 4 x hidden) unless they are given too; a config file's stay as written.
struct ShapeRequest {
  std::string family = "bert";  // the preset's family: bert or modernbert
  std::string preset = "mini";
  std::string config;  // a config.json path, used instead of the preset when set
  int layers = 0, hidden = 0, heads = 0, intermediate = 0;

  bool overridden() const { return layers || hidden || heads || intermediate; }
  // Whether anything beyond the preset was asked for (a config file or an override).
  bool custom() const { return !config.empty() || overridden(); }
  // What to call the model in messages: "bert-mini", "bert-mini (8 layers)", "cfg.json".
  std::string name() const;
};
// The validated shape (InputError naming the preset, file or flag at fault).
BertConfig resolve_shape(const ShapeRequest& r);

// A config.json read from `path` (InputError when it cannot be opened or parsed).
BertConfig config_from_file(const std::string& path);

// Hugging Face config.json <-> BertConfig, for model_type "bert" (or none) and "modernbert".
// Unknown keys are ignored; keys that packbert cannot honour (hidden_act other than gelu,
// position_embedding_type other than absolute; ModernBERT's rope scaling, untied decoder, a layer
// pattern other than a global layer every n) are errors naming the key.
BertConfig config_from_json(const nlohmann::json& j, const std::string& source);
// `architecture` is what transformers instantiates (BertForPreTraining,
// BertForSequenceClassification, BertForQuestionAnswering; ModernBertForMaskedLM, ...); with
// ModernBERT the keys every transformers since 4.48 reads; `label_names`, in id order, name the
// classifier's outputs in id2label / label2id (LABEL_<i> when empty).
nlohmann::json config_to_json(const BertConfig& c,
                              const std::string& architecture = "BertForPreTraining",
                              const std::vector<std::string>& label_names = {});

}  // namespace packbert::model
