#include "model/config.h"

#include <algorithm>
#include <fstream>

#include "error.h"
#include "io/input_file.h"
#include "io/json_error.h"

namespace packbert::model {

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
  need(type_vocab_size > 0, "type_vocab_size must be positive");
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

std::string ShapeRequest::name() const {
  std::string base = config.empty() ? "bert-" + preset : config;
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
  BertConfig c = r.config.empty() ? bert_preset(r.preset) : config_from_file(r.config);
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
    c.intermediate_size = 4 * r.hidden;
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

BertConfig config_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source + ": config is not a JSON object");
  // Another architecture's config (RoBERTa, DistilBERT, ELECTRA, ...) is refused by its name here,
  // not later by the first BERT tensor its weights lack.
  if (j.contains("model_type") &&
      (!j["model_type"].is_string() || j["model_type"].get<std::string>() != "bert"))
    throw InputError(source + ": model_type " + j["model_type"].dump() +
                     " is not BERT; packbert reads BERT models (model_type \"bert\")");
  BertConfig c;
  auto get_int = [&](const char* key, int& field) {
    if (!j.contains(key)) return;
    if (!j[key].is_number_integer()) throw InputError(source + ": " + key + " must be an integer");
    const bool fits =
        j[key].is_number_unsigned()
            ? j[key].get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
            : j[key].get<int64_t>() >= INT32_MIN && j[key].get<int64_t>() <= INT32_MAX;
    if (!fits)
      throw InputError(source + ": " + key + " " + j[key].dump() + " does not fit a 32-bit int");
    field = j[key].get<int>();
  };
  auto get_num = [&](const char* key, double& field) {
    if (!j.contains(key)) return;
    if (!j[key].is_number()) throw InputError(source + ": " + key + " must be a number");
    field = j[key].get<double>();
  };
  get_int("vocab_size", c.vocab_size);
  get_int("hidden_size", c.hidden_size);
  get_int("num_hidden_layers", c.num_hidden_layers);
  get_int("num_attention_heads", c.num_attention_heads);
  get_int("intermediate_size", c.intermediate_size);
  get_int("max_position_embeddings", c.max_position_embeddings);
  get_int("type_vocab_size", c.type_vocab_size);
  get_num("layer_norm_eps", c.layer_norm_eps);
  get_num("hidden_dropout_prob", c.hidden_dropout_prob);
  get_num("attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  get_num("initializer_range", c.initializer_range);
  if (j.contains("id2label") && j["id2label"].is_object())
    c.num_labels = static_cast<int>(j["id2label"].size());
  get_int("num_labels", c.num_labels);
  if (j.contains("problem_type") && !j["problem_type"].is_null()) {
    const nlohmann::json& pt = j["problem_type"];
    const bool regression = pt == "regression";
    if (!regression && pt != "single_label_classification")
      throw InputError(source + ": problem_type " + pt.dump() +
                       " is not supported (\"single_label_classification\" or \"regression\")");
    if (regression != (c.num_labels == 1))
      throw InputError(source + ": problem_type " + pt.dump() + " with num_labels " +
                       std::to_string(c.num_labels) +
                       (regression ? " (a regression head here has one output)"
                                   : " (one output is a regression head)"));
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "gelu")
    throw InputError(source + ": hidden_act " + j["hidden_act"].dump() +
                     " is not supported, expected \"gelu\" (exact erf GELU)");
  if (j.contains("position_embedding_type") && j["position_embedding_type"] != "absolute")
    throw InputError(source + ": position_embedding_type " + j["position_embedding_type"].dump() +
                     " is not supported, expected \"absolute\"");
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
