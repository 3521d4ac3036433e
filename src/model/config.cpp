#include "model/config.h"

#include <algorithm>
#include <fstream>

#include "error.h"
#include "io/input_file.h"
#include "io/json_error.h"

namespace packbert::model {

const char* family_name(Family f) {
  return f == Family::modernbert ? "modernbert" : "bert";
}

void BertConfig::validate(const std::string& source) const {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw InputError(source + ": " + what);
  };
  need(vocab_size > 0, "vocab_size must be positive");
  need(hidden_size > 0, "hidden_size must be positive");
  need(num_hidden_layers > 0, "num_hidden_layers must be positive");
  need(num_attention_heads > 0 && hidden_size % num_attention_heads == 0,
       "hidden_size " + std::to_string(hidden_size) + " is not a multiple of num_attention_heads " +
           std::to_string(num_attention_heads));
  need(intermediate_size > 0, "intermediate_size must be positive");
  need(max_position_embeddings > 0, "max_position_embeddings must be positive");
  if (family == Family::bert) need(type_vocab_size > 0, "type_vocab_size must be positive");
  if (family == Family::modernbert) {
    need(modern.global_attn_every_n_layers > 0, "global_attn_every_n_layers must be positive");
    need(modern.local_attention > 0 && modern.local_attention % 2 == 0,
         "local_attention " + std::to_string(modern.local_attention) +
             " must be positive and even (local_attention / 2 each side)");
    need(modern.global_rope_theta > 0 && modern.local_rope_theta > 0,
         "the rope thetas must be positive");
    need(head_size() % 2 == 0, "the head size must be even for rotary embeddings");
    need(modern.classifier_pooling == "cls" || modern.classifier_pooling == "mean",
         "classifier_pooling \"" + modern.classifier_pooling + "\": expected \"cls\" or \"mean\"");
  }
  need(layer_norm_eps > 0, "layer_norm_eps must be positive");
  need(hidden_dropout_prob >= 0 && hidden_dropout_prob < 1, "hidden_dropout_prob outside [0, 1)");
  need(attention_probs_dropout_prob >= 0 && attention_probs_dropout_prob < 1,
       "attention_probs_dropout_prob outside [0, 1)");
  need(num_labels > 0, "num_labels must be positive");
}

BertConfig bert_preset(const std::string& name) {
  struct Preset {
    const char* name;
    int layers, hidden, heads;
  } presets[] = {{"tiny", 2, 128, 2},   {"mini", 4, 256, 4},   {"small", 4, 512, 8},
                 {"medium", 8, 512, 8}, {"base", 12, 768, 12}, {"large", 24, 1024, 16}};
  for (const Preset& p : presets)
    if (name == p.name) {
      BertConfig c;
      c.num_hidden_layers = p.layers;
      c.hidden_size = p.hidden;
      c.num_attention_heads = p.heads;
      c.intermediate_size = 4 * p.hidden;
      return c;
    }
  throw InputError("unknown model preset '" + name +
                   "', expected tiny|mini|small|medium|base|large");
}

// ModernBERT's shapes: base and large are answerdotai's (22 x 768, 28 x 1024, intermediate 1152
// and 2624); the smaller ones keep base's proportions (head size 64, intermediate 1.5 x hidden)
// with BERT's presets' widths, mini at about bert-mini's encoder parameters (6 layers of 3.3M in
// all, against bert-mini's 4 layers of 3.1M). Everything else is ModernBERT's defaults: a global
// layer every 3rd, a 128-token window, rotary thetas 160,000 and 10,000, no biases but the
// decoder's, norm eps 1e-5, no dropout.
BertConfig modernbert_preset(const std::string& name) {
  struct Preset {
    const char* name;
    int layers, hidden, heads, intermediate;
  } presets[] = {{"tiny", 3, 128, 2, 192},    {"mini", 6, 256, 4, 384},
                 {"small", 6, 512, 8, 768},   {"medium", 12, 512, 8, 768},
                 {"base", 22, 768, 12, 1152}, {"large", 28, 1024, 16, 2624}};
  for (const Preset& p : presets)
    if (name == p.name) {
      BertConfig c;
      c.family = Family::modernbert;
      c.num_hidden_layers = p.layers;
      c.hidden_size = p.hidden;
      c.num_attention_heads = p.heads;
      c.intermediate_size = p.intermediate;
      c.type_vocab_size = 0;
      c.layer_norm_eps = 1e-5;
      c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
      c.max_position_embeddings = 8192;
      return c;
    }
  throw InputError("unknown model preset '" + name +
                   "', expected tiny|mini|small|medium|base|large");
}

std::string ShapeRequest::name() const {
  std::string base = config.empty() ? family + "-" + preset : config;
  std::string sizes;
  auto add = [&](int value, const char* what) {
    if (value) sizes += (sizes.empty() ? "" : ", ") + std::to_string(value) + " " + what;
  };
  add(layers, "layers");
  add(hidden, "hidden");
  add(heads, "heads");
  add(intermediate, "intermediate");
  return sizes.empty() ? base : base + " (" + sizes + ")";
}

BertConfig resolve_shape(const ShapeRequest& r) {
  if (r.config.empty() && r.preset.empty())
    throw InputError("give a model shape: `preset` or `config`");
  if (r.family != "bert" && r.family != "modernbert")
    throw InputError("unknown model family '" + r.family + "', expected bert|modernbert");
  if (!r.config.empty() && r.family != "bert")
    throw InputError("`family` is a preset's: a config.json names its own (model_type)");
  const bool modern = r.family == "modernbert";
  BertConfig c = !r.config.empty() ? config_from_file(r.config)
                 : modern          ? modernbert_preset(r.preset)
                                   : bert_preset(r.preset);
  const bool follow = r.config.empty() && r.hidden;  // a preset's heads and FFN follow its width
  if (r.layers) c.num_hidden_layers = r.layers;
  if (r.hidden) c.hidden_size = r.hidden;
  if (r.heads)
    c.num_attention_heads = r.heads;
  else if (follow)
    c.num_attention_heads = std::max(1, r.hidden / 64);
  if (r.intermediate)
    c.intermediate_size = r.intermediate;
  else if (follow)
    c.intermediate_size = modern ? 3 * r.hidden / 2 : 4 * r.hidden;
  c.validate(r.name());
  return c;
}

BertConfig config_from_file(const std::string& path) {
  io::require_text_input(path);
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(path + ": not valid JSON (byte " + std::to_string(e.byte) + ")");
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": " + io::json_error_text(e));
  }
  return config_from_json(j, path);
}

namespace {

// Reads config.json's keys into fields, naming the source and key on a wrong type.
struct JsonFields {
  const nlohmann::json& j;
  const std::string& source;
  void integer(const char* key, int& field) const {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number_integer()) throw InputError(source + ": " + key + " must be an integer");
    const bool fits =
        j[key].is_number_unsigned()
            ? j[key].get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
            : j[key].get<int64_t>() >= INT32_MIN && j[key].get<int64_t>() <= INT32_MAX;
    if (!fits)
      throw InputError(source + ": " + key + " " + j[key].dump() + " does not fit a 32-bit int");
    field = j[key].get<int>();
  }
  void number(const char* key, double& field) const {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number()) throw InputError(source + ": " + key + " must be a number");
    field = j[key].get<double>();
  }
  void boolean(const char* key, bool& field) const {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_boolean()) throw InputError(source + ": " + key + " must be true or false");
    field = j[key].get<bool>();
  }
  void text(const char* key, std::string& field) const {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_string()) throw InputError(source + ": " + key + " must be a string");
    field = j[key].get<std::string>();
  }
  // A key packbert runs one value of: refused, named, with any other.
  void only(const char* key, const nlohmann::json& value, const std::string& why) const {
    if (j.contains(key) && !j[key].is_null() && j[key] != value)
      throw InputError(source + ": " + key + " " + j[key].dump() + " is not supported, expected " +
                       value.dump() + why);
  }
};

// num_labels (or id2label's size) and problem_type, as transformers reads them for any family.
void read_labels(const JsonFields& f, BertConfig& c) {
  const nlohmann::json& j = f.j;
  if (j.contains("id2label") && j["id2label"].is_object())
    c.num_labels = static_cast<int>(j["id2label"].size());
  f.integer("num_labels", c.num_labels);
  if (j.contains("problem_type") && !j["problem_type"].is_null()) {
    const nlohmann::json& pt = j["problem_type"];
    const bool regression = pt == "regression";
    if (!regression && pt != "single_label_classification")
      throw InputError(f.source + ": problem_type " + pt.dump() +
                       " is not supported (\"single_label_classification\" or \"regression\")");
    if (regression != (c.num_labels == 1))
      throw InputError(f.source + ": problem_type " + pt.dump() + " with num_labels " +
                       std::to_string(c.num_labels) +
                       (regression ? " (a regression head here has one output)"
                                   : " (one output is a regression head)"));
  }
}

// layer_types (transformers 5's form of the attention pattern): a global ("full_attention")
// layer every n layers from layer 0, the others "sliding_attention", is what packbert runs.
int global_every_n(const nlohmann::json& types, int layers, const std::string& source) {
  auto refuse = [&](const std::string& why) -> int {
    throw InputError(source + ": layer_types " + why +
                     "; packbert runs a global layer every n layers from layer 0 "
                     "(global_attn_every_n_layers)");
  };
  if (!types.is_array() || static_cast<int>(types.size()) != layers)
    return refuse("is not a list of num_hidden_layers entries");
  int n = 0;
  for (int l = 0; l < layers; ++l) {
    if (types[l] != "full_attention" && types[l] != "sliding_attention")
      return refuse("entry " + types[l].dump() +
                    " is neither \"full_attention\" nor "
                    "\"sliding_attention\"");
    if (l > 0 && n == 0 && types[l] == "full_attention") n = l;
  }
  if (types[0] != "full_attention") return refuse("starts with a sliding layer");
  if (n == 0) n = layers;  // one global layer, the first: every n >= layers says the same
  for (int l = 0; l < layers; ++l)
    if ((types[l] == "full_attention") != (l % n == 0))
      return refuse("is not periodic (layer " + std::to_string(l) + ")");
  return n;
}

void read_modernbert(const JsonFields& f, BertConfig& c) {
  const nlohmann::json& j = f.j;
  ModernBertFields& m = c.modern;
  c.family = Family::modernbert;
  c.vocab_size = 50368, c.hidden_size = 768, c.intermediate_size = 1152;
  c.num_hidden_layers = 22, c.num_attention_heads = 12, c.max_position_embeddings = 8192;
  c.layer_norm_eps = 1e-5, c.attention_probs_dropout_prob = 0, c.hidden_dropout_prob = 0;
  c.type_vocab_size = 0;
  f.integer("vocab_size", c.vocab_size);
  f.integer("hidden_size", c.hidden_size);
  f.integer("intermediate_size", c.intermediate_size);
  f.integer("num_hidden_layers", c.num_hidden_layers);
  f.integer("num_attention_heads", c.num_attention_heads);
  f.integer("max_position_embeddings", c.max_position_embeddings);
  f.number("initializer_range", c.initializer_range);
  f.number("initializer_cutoff_factor", m.initializer_cutoff_factor);
  f.number("norm_eps", c.layer_norm_eps);
  f.number("attention_dropout", c.attention_probs_dropout_prob);
  f.number("embedding_dropout", m.embedding_dropout);
  f.number("mlp_dropout", m.mlp_dropout);
  f.number("classifier_dropout", m.classifier_dropout);
  f.boolean("norm_bias", m.norm_bias);
  f.boolean("attention_bias", m.attention_bias);
  f.boolean("mlp_bias", m.mlp_bias);
  f.boolean("classifier_bias", m.classifier_bias);
  f.boolean("decoder_bias", m.decoder_bias);
  f.text("classifier_pooling", m.classifier_pooling);
  f.boolean("deterministic_flash_attn", m.deterministic_flash_attn);
  f.boolean("sparse_prediction", m.sparse_prediction);
  f.integer("sparse_pred_ignore_index", m.sparse_pred_ignore_index);
  f.integer("local_attention", m.local_attention);
  f.integer("global_attn_every_n_layers", m.global_attn_every_n_layers);
  f.number("global_rope_theta", m.global_rope_theta);
  f.number("local_rope_theta", m.local_rope_theta);
  for (auto [key, field] : {std::pair{"pad_token_id", &m.pad_token_id},
                            {"eos_token_id", &m.eos_token_id},
                            {"bos_token_id", &m.bos_token_id},
                            {"cls_token_id", &m.cls_token_id},
                            {"sep_token_id", &m.sep_token_id}})
    f.integer(key, *field);
  read_labels(f, c);
  const std::string gelu = " (exact erf GELU)";
  f.only("hidden_activation", "gelu", gelu);
  f.only("classifier_activation", "gelu", gelu);
  f.only("tie_word_embeddings", true, " (the MLM decoder is the token embeddings)");
  f.only("rope_scaling", nullptr, " (rotary embeddings without scaling)");
  if (j.contains("layer_types") && !j["layer_types"].is_null())
    m.global_attn_every_n_layers = global_every_n(j["layer_types"], c.num_hidden_layers, f.source);
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const nlohmann::json& rp = j["rope_parameters"];
    for (auto [kind, theta] : {std::pair{"full_attention", &m.global_rope_theta},
                               {"sliding_attention", &m.local_rope_theta}}) {
      if (!rp.is_object() || !rp.contains(kind)) continue;
      const JsonFields r{rp[kind], f.source};
      r.only("rope_type", "default", " (rotary embeddings without scaling)");
      r.number("rope_theta", *theta);
    }
  }
}

}  // namespace

BertConfig config_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source + ": config is not a JSON object");
  // Another architecture's config (RoBERTa, DistilBERT, ELECTRA, ...) is refused by its name here,
  // not later by the first tensor its weights lack.
  const nlohmann::json type = j.contains("model_type") ? j["model_type"] : nlohmann::json("bert");
  if (type != "bert" && type != "modernbert")
    throw InputError(source + ": model_type " + type.dump() +
                     " is not BERT or ModernBERT; packbert reads model_type \"bert\" and "
                     "\"modernbert\"");
  BertConfig c;
  const JsonFields f{j, source};
  if (type == "modernbert") {
    read_modernbert(f, c);
    c.validate(source);
    return c;
  }
  f.integer("vocab_size", c.vocab_size);
  f.integer("hidden_size", c.hidden_size);
  f.integer("num_hidden_layers", c.num_hidden_layers);
  f.integer("num_attention_heads", c.num_attention_heads);
  f.integer("intermediate_size", c.intermediate_size);
  f.integer("max_position_embeddings", c.max_position_embeddings);
  f.integer("type_vocab_size", c.type_vocab_size);
  f.number("layer_norm_eps", c.layer_norm_eps);
  f.number("hidden_dropout_prob", c.hidden_dropout_prob);
  f.number("attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  f.number("initializer_range", c.initializer_range);
  read_labels(f, c);
  f.only("hidden_act", "gelu", " (exact erf GELU)");
  f.only("position_embedding_type", "absolute", "");
  c.validate(source);
  return c;
}

nlohmann::json config_to_json(const BertConfig& c, const std::string& architecture,
                              const std::vector<std::string>& label_names) {
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (int i = 0; i < c.num_labels; ++i) {
    const std::string name = static_cast<size_t>(i) < label_names.size()
                                 ? label_names[static_cast<size_t>(i)]
                                 : "LABEL_" + std::to_string(i);
    id2label[std::to_string(i)] = name;
    label2id[name] = i;
  }
  if (c.family == Family::modernbert) {
    const ModernBertFields& m = c.modern;
    nlohmann::json out = {{"architectures", {architecture}},
                          {"model_type", "modernbert"},
                          {"num_labels", c.num_labels},
                          {"vocab_size", c.vocab_size},
                          {"hidden_size", c.hidden_size},
                          {"intermediate_size", c.intermediate_size},
                          {"num_hidden_layers", c.num_hidden_layers},
                          {"num_attention_heads", c.num_attention_heads},
                          {"hidden_activation", "gelu"},
                          {"max_position_embeddings", c.max_position_embeddings},
                          {"initializer_range", c.initializer_range},
                          {"initializer_cutoff_factor", m.initializer_cutoff_factor},
                          {"norm_eps", c.layer_norm_eps},
                          {"norm_bias", m.norm_bias},
                          {"pad_token_id", m.pad_token_id},
                          {"eos_token_id", m.eos_token_id},
                          {"bos_token_id", m.bos_token_id},
                          {"cls_token_id", m.cls_token_id},
                          {"sep_token_id", m.sep_token_id},
                          {"global_rope_theta", m.global_rope_theta},
                          {"attention_bias", m.attention_bias},
                          {"attention_dropout", c.attention_probs_dropout_prob},
                          {"global_attn_every_n_layers", m.global_attn_every_n_layers},
                          {"local_attention", m.local_attention},
                          {"local_rope_theta", m.local_rope_theta},
                          {"embedding_dropout", m.embedding_dropout},
                          {"mlp_bias", m.mlp_bias},
                          {"mlp_dropout", m.mlp_dropout},
                          {"decoder_bias", m.decoder_bias},
                          {"classifier_pooling", m.classifier_pooling},
                          {"classifier_dropout", m.classifier_dropout},
                          {"classifier_bias", m.classifier_bias},
                          {"classifier_activation", "gelu"},
                          {"deterministic_flash_attn", m.deterministic_flash_attn},
                          {"sparse_prediction", m.sparse_prediction},
                          {"sparse_pred_ignore_index", m.sparse_pred_ignore_index},
                          {"tie_word_embeddings", true},
                          {"id2label", id2label},
                          {"label2id", label2id}};
    if (architecture == "ModernBertForSequenceClassification")
      out["problem_type"] = c.regression() ? "regression" : "single_label_classification";
    return out;
  }
  nlohmann::json out = {{"architectures", {architecture}},
                        {"num_labels", c.num_labels},
                        {"model_type", "bert"},
                        {"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"intermediate_size", c.intermediate_size},
                        {"hidden_act", "gelu"},
                        {"hidden_dropout_prob", c.hidden_dropout_prob},
                        {"attention_probs_dropout_prob", c.attention_probs_dropout_prob},
                        {"max_position_embeddings", c.max_position_embeddings},
                        {"type_vocab_size", c.type_vocab_size},
                        {"initializer_range", c.initializer_range},
                        {"layer_norm_eps", c.layer_norm_eps},
                        {"position_embedding_type", "absolute"},
                        {"pad_token_id", 0},
                        {"id2label", id2label},
                        {"label2id", label2id}};
  if (architecture == "BertForSequenceClassification")
    out["problem_type"] = c.regression() ? "regression" : "single_label_classification";
  return out;
}

}  // namespace packbert::model
