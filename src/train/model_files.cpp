// A model's files: loading (load_model, model_labels) and writing the Hugging Face layout.
#include "train/model_files.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/vocab.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/paths.h"
#include "io/safetensors.h"
#include "model/hf_import.h"
#include "model/weights.h"
#include "train/checkpoint.h"

namespace packbert::train {

using json = nlohmann::json;

std::unique_ptr<model::BertModel> load_model(const std::string& path, model::Heads heads,
                                             model::Sparsity sparsity, FreshTensors* fresh) {
  model::BertConfig config;
  io::SafetensorsFile f;
  if (!model::is_packbert_checkpoint(path)) {  // a Hugging Face model, in any of its forms
    model::ImportedModel hf = model::import_model(path);
    config = hf.config;
    f = std::move(hf.weights);
  } else {
    f = io::SafetensorsFile::read(path);
    config = checkpoint_config(f);
    const model::Sparsity was = sparsity_of(f);
    if (was.on() && !sparsity.on()) {  // a sparse checkpoint, wanted dense: its dense equivalent
      model::BertModel sparse(config, model::heads_present(f), was);
      model::load_model_weights(sparse, f);
      const model::OwnedTensors dense = model::dense_weight_tensors(sparse, sparse.params().data());
      f = io::SafetensorsFile::parse(io::serialize_safetensors(dense.tensors, f.metadata()), path);
    } else if (was.on() && !(was == sparsity)) {
      throw InputError(path + ": was trained with " + sparsity_text(was) + ", not " +
                       sparsity_text(sparsity) + " (a dense model can be pruned to any pattern)");
    }
  }
  if (fresh && fresh->num_labels > 0) config.num_labels = fresh->num_labels;
  const model::Stage stage = fresh && fresh->stage ? fresh->stage(config) : model::Stage{};
  auto m = std::make_unique<model::BertModel>(config, heads, sparsity, kernels::DType::f32, stage);
  if (fresh) model::init_params(m->layout(), m->params().data(), fresh->seed);
  model::load_model_weights(*m, f, fresh ? &fresh->initialized : nullptr,
                            fresh && fresh->new_heads);
  return m;
}

bool ModelLabels::generic() const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] != "LABEL_" + std::to_string(i)) return false;
  return true;
}

namespace {

// id2label of a config.json object, in id order: empty when it has none; InputError naming
// `source` when it is not a map of the ids 0..n-1 to names.
std::vector<std::string> id2label_of(const json& config, const std::string& source) {
  if (!config.is_object() || !config.contains("id2label") || !config["id2label"].is_object())
    return {};
  const json& m = config["id2label"];
  std::vector<std::string> names(m.size());
  std::vector<bool> seen(m.size(), false);
  for (const auto& [key, value] : m.items()) {
    size_t id = 0;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id >= names.size() || seen[id] ||
        !value.is_string())
      throw InputError(source + ": id2label is not a map of the ids 0.." +
                       std::to_string(names.size() - 1) + " to names (at \"" + key + "\")");
    names[id] = value.get<std::string>(), seen[id] = true;
  }
  return names;
}

}  // namespace

ModelLabels model_labels(const std::string& path) {
  ModelLabels out;
  if (model::is_packbert_checkpoint(path)) {
    const io::SafetensorsFile f = io::SafetensorsFile::read(path);
    out.heads = model::heads_present(f);
    out.source = path + " (its config)";
    const json config = json::parse(f.metadata().at("config"), nullptr, false);
    out.names = id2label_of(config, out.source);
    if (config.is_object()) {
      const model::BertConfig c = model::config_from_json(config, out.source);
      out.num_labels = c.num_labels;
      out.family = c.family;
    }
    return out;
  }
  const model::ImportedModel hf = model::import_model(path);
  out.heads = model::heads_present(hf);
  out.masked_lm = out.heads.pretraining && !hf.weights.has("cls.seq_relationship.weight") &&
                  !hf.weights.has("bert.pooler.dense.weight");
  out.pooler = hf.weights.has("bert.pooler.dense.weight");
  out.family = hf.config.family;
  if (!hf.tokenizer_json.empty())
    out.tokenizer_dir = std::filesystem::path(hf.tokenizer_json).parent_path().string();
  out.source = hf.config_from;
  out.num_labels = hf.config.num_labels;
  if (!hf.config_json.empty())
    out.names = id2label_of(json::parse(hf.config_json, nullptr, false), out.source);
  return out;
}

void write_tokenizer_files(const std::string& dir, const ModelFiles& f, int model_max_length) {
  if (data::is_tokenizer_json(f.vocab)) {  // as it is, with the files beside it that go with it
    const std::filesystem::path json(f.vocab);
    if (json.filename() == "tokenizer.json")
      model::copy_tokenizer_files(json.parent_path().string(), dir);
    else
      io::write_file_atomic(dir + "/tokenizer.json", io::read_file(f.vocab));
    return;
  }
  io::write_file_atomic(dir + "/vocab.txt", io::read_file(f.vocab));
  const json special = {{"unk_token", "[UNK]"},
                        {"sep_token", "[SEP]"},
                        {"pad_token", "[PAD]"},
                        {"cls_token", "[CLS]"},
                        {"mask_token", "[MASK]"}};
  json config = special;
  config["do_lower_case"] = f.lower_case;
  config["do_basic_tokenize"] = true;
  config["tokenize_chinese_chars"] = true;
  config["strip_accents"] = nullptr;  // (follows do_lower_case, as BertTokenizer's default)
  config["model_max_length"] = model_max_length;
  config["tokenizer_class"] = "BertTokenizer";
  io::write_file_atomic(dir + "/tokenizer_config.json", config.dump(2) + "\n");
  io::write_file_atomic(dir + "/special_tokens_map.json", special.dump(2) + "\n");
}

void write_model_files(const model::BertModel& m, const std::string& dir, const ModelFiles& f) {
  const model::Heads& h = m.layout().heads();
  const bool bare = !h.classifier && !h.span && !h.pretraining;
  const std::string architecture = model::architecture_of(m.config(), h, f.masked_lm);
  // A base model's tensors go without their prefix, as transformers saves one.
  const std::string prefix = m.config().family == model::Family::modernbert ? "model." : "bert.";
  const bool pooler = h.classifier || (h.pretraining && !f.masked_lm) || (bare && f.pooler);
  const kernels::DTypeTraits& stored = kernels::traits(model::storage_dtype(f.dtype));
  json config = model::config_to_json(m.config(), architecture, f.label_names);
  config["torch_dtype"] = stored.torch;
  std::vector<float> widened;  // (under 16-bit master weights)
  const float* w = m.weights_fp32(widened);
  // Block-sparse weights go out dense, zeros outside their pattern: loadable anywhere.
  model::OwnedTensors out = model::dense_weight_tensors(m, w);
  std::vector<io::TensorToWrite>& tensors = out.tensors;
  std::erase_if(tensors, [&](const io::TensorToWrite& t) {
    return (!pooler && t.name.starts_with("bert.pooler.")) ||
           (f.masked_lm && t.name.starts_with("cls.seq_relationship."));
  });
  std::vector<std::string> names;  // a base model's names, without "bert."
  if (bare) {
    names.reserve(tensors.size());
    for (io::TensorToWrite& t : tensors)
      if (t.name.starts_with(prefix))
        names.push_back(t.name.substr(prefix.size())), t.name = names.back();
  }
  std::vector<std::vector<uint16_t>> narrow;
  if (stored.is_16bit) {
    narrow.reserve(tensors.size());
    for (io::TensorToWrite& t : tensors) {
      const size_t n = t.bytes / sizeof(float);
      narrow.emplace_back(n);
      const float* x = static_cast<const float*>(t.data);
      stored.narrow(narrow.back().data(), x, static_cast<int64_t>(n));
      // A finite weight the type cannot hold (fp16's largest is 65,504) would load as inf.
      std::vector<float> back(n);
      stored.widen(back.data(), narrow.back().data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i)
        if (std::isinf(back[i]) && std::isfinite(x[i]))
          throw InputError(dir + ": not written: " + t.name + "[" + std::to_string(i) +
                           "] = " + std::to_string(x[i]) + " does not fit " + stored.torch +
                           " (it would become inf); export it as fp32 or bf16");
      t.dtype = stored.safetensors, t.data = narrow.back().data(), t.bytes = n * stored.bytes;
    }
  }
  io::write_file_atomic(dir + "/config.json", config.dump(2) + "\n");
  io::write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  if (!f.vocab.empty()) write_tokenizer_files(dir, f, m.config().max_position_embeddings);
  if (!f.tokenizer_dir.empty()) model::copy_tokenizer_files(f.tokenizer_dir, dir);
}

std::string non_finite_weights(const model::BertModel& m) {
  std::vector<float> widened;
  const float* w = m.weights_fp32(widened);
  size_t bad = 0;
  std::string first;
  for (const model::TensorSpec& t : m.layout().tensors()) {
    size_t here = 0;
    for (size_t i = 0; i < t.numel; ++i) here += !std::isfinite(w[t.offset + i]);
    if (here && first.empty()) first = t.name;
    bad += here;
  }
  return bad ? std::to_string(bad) + " weights are not finite (the first in " + first + ")" : "";
}

void export_model(const model::BertModel& m, const std::string& dir, const ModelFiles& f,
                  bool overwrite) {
  const std::string bad = non_finite_weights(m);
  if (!bad.empty())
    throw InputError(dir + ": not written: " + bad + "; a model that computes NaN is not exported");
  if (!f.vocab.empty()) {
    const data::Vocab v = data::Vocab::load(f.vocab);
    if (static_cast<int>(v.size()) != m.config().vocab_size)
      throw InputError(f.vocab + ": " + std::to_string(v.size()) +
                       " tokens, but the model's vocab_size is " +
                       std::to_string(m.config().vocab_size));
  }
  io::StagedDirectory out(dir, "`out_dir`", overwrite);
  write_model_files(m, out.path(), f);
  out.publish();
}

}  // namespace packbert::train
