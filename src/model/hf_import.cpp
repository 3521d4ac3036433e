#include "model/hf_import.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "error.h"
#include "io/atomic_file.h"
#include "io/input_file.h"
#include "io/json_error.h"
#include "io/torch_file.h"

namespace packbert::model {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Whether `b` is a safetensors file: its first 8 bytes give a header length that fits the file,
// and the header starts as JSON does. A torch.save zip ("PK") or pickle (0x80) can begin with
// bytes that also start a valid length (about 1 file in 32), so this is asked first, by content
// the other formats cannot have; `why_not` says what failed.
bool is_safetensors(std::string_view b, std::string* why_not = nullptr) {
  auto no = [&](const std::string& why) {
    if (why_not) *why_not = why;
    return false;
  };
  if (b.size() < 10) return no("shorter than a safetensors header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(b[i]);
  if (n > b.size() - 8)
    return no("its first 8 bytes, read as a safetensors header length, say " + std::to_string(n) +
              " bytes; the file has " + std::to_string(b.size()));
  const std::string_view header = b.substr(8, n);
  const size_t first = header.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || (header[first] != '{' && header[first] != '['))
    return no("no JSON header after its first 8 bytes");
  return true;
}

// One file's tensors, as torch_file reads them (safetensors files are copied into the same form);
// `format` says which the file was, by its content.
std::vector<io::TorchTensor> read_tensors(const std::string& path, std::string& format) {
  io::FileBytes bytes = io::FileBytes::map(path);
  format = "torch.save";
  std::string why_not;
  if (!is_safetensors(bytes.view(), &why_not)) {
    const std::string_view b = bytes.view();
    if (b.starts_with("PK") || (!b.empty() && static_cast<uint8_t>(b[0]) == 0x80))
      return io::parse_torch_file(std::move(bytes), path);
    throw InputError(path + ": not a model file: not safetensors (" + why_not +
                     "), nor a PyTorch zip archive or pickle");
  }
  format = "safetensors";
  const io::SafetensorsFile f = io::SafetensorsFile::parse(std::move(bytes), path);
  std::vector<io::TorchTensor> out;
  for (const auto& [name, e] : f.tensors())
    out.push_back({name, e.dtype, e.shape, std::string(f.raw(name))});
  return out;
}

json read_json(const std::string& path) {
  io::require_text_input(path);
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open");
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw InputError(path + ": not a JSON object");
  return j;
}

// The tensors of a shard index ({"weight_map": {tensor: shard file}}), each shard read once;
// every tensor the map names must be in its shard.
std::vector<io::TorchTensor> read_shards(const std::string& index, int& shards,
                                         std::string& format) {
  const json j = read_json(index);
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    throw InputError(index + ": no \"weight_map\" object (not a shard index)");
  std::map<std::string, std::set<std::string>> by_shard;
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos)
      throw InputError(index + ": weight_map entry '" + tensor + "' is not a file name");
    by_shard[shard.get<std::string>()].insert(tensor);
  }
  std::vector<io::TorchTensor> out;
  for (auto& [shard, names] : by_shard) {
    const std::string path = (fs::path(index).parent_path() / shard).string();
    for (io::TorchTensor& t : read_tensors(path, format)) {
      names.erase(t.name);
      out.push_back(std::move(t));
    }
    if (!names.empty())
      throw InputError(path + ": has no tensor '" + *names.begin() + "' (" + index +
                       " places it there)");
  }
  shards = static_cast<int>(by_shard.size());
  return out;
}

// What a file's tensor names say of it: a bare BertModel's (no "bert."), a bare ModernBertModel's
// ("embeddings.tok_embeddings.weight").
struct Bare {
  bool bert = true, modernbert = false;
  void see(const std::string& name) {
    bert = bert && !name.starts_with("bert.");
    modernbert = modernbert || name == "embeddings.tok_embeddings.weight";
  }
};

// BertForPreTraining's (ModernBertForMaskedLM's) name for a tensor (see the header).
std::string hf_name(std::string n, const Bare& bare) {
  if (bare.modernbert) {
    if (n.starts_with("embeddings.") || n.starts_with("layers.") || n.starts_with("final_norm."))
      n = "model." + n;
    return n;
  }
  if (n.ends_with(".gamma")) n.replace(n.size() - 6, 6, ".weight");
  if (n.ends_with(".beta")) n.replace(n.size() - 5, 5, ".bias");
  if (bare.bert &&
      (n.starts_with("embeddings.") || n.starts_with("encoder.") || n.starts_with("pooler.")))
    n = "bert." + n;
  return n;
}

int dim(const io::SafetensorsFile& w, const std::string& name, size_t d) {
  const io::TensorEntry& e = w.entry(name);
  if (e.shape.size() <= d)
    throw InputError(w.source() + ": tensor '" + name + "' has too few dimensions");
  return static_cast<int>(e.shape[d]);
}

BertConfig infer_config(const io::SafetensorsFile& w) {
  BertConfig c;
  c.vocab_size = dim(w, "bert.embeddings.word_embeddings.weight", 0);
  c.hidden_size = dim(w, "bert.embeddings.word_embeddings.weight", 1);
  c.max_position_embeddings = dim(w, "bert.embeddings.position_embeddings.weight", 0);
  c.type_vocab_size = dim(w, "bert.embeddings.token_type_embeddings.weight", 0);
  c.num_hidden_layers = 0;
  while (w.has("bert.encoder.layer." + std::to_string(c.num_hidden_layers) +
               ".attention.self.query.weight"))
    ++c.num_hidden_layers;
  c.intermediate_size = dim(w, "bert.encoder.layer.0.intermediate.dense.weight", 0);
  if (c.hidden_size % 64)
    throw InputError(w.source() + ": hidden size " + std::to_string(c.hidden_size) +
                     " is not a multiple of 64, so the head count cannot be inferred; give "
                     "`config`");
  c.num_attention_heads = c.hidden_size / 64;
  if (w.has("classifier.weight")) c.num_labels = dim(w, "classifier.weight", 0);
  c.validate(w.source() + " (inferred config)");
  return c;
}

}  // namespace

namespace {

// The config (beside the weights, given, or inferred) and vocabulary of an imported model.
ImportedModel finish_import(ImportedModel m, const std::string& src, const std::string& dir,
                            const std::string& config_path, bool infer) {
  const std::string beside = (fs::path(dir) / "config.json").string();
  m.config_from = !config_path.empty() ? config_path : fs::exists(beside) ? beside : "";
  if (m.config_from.empty()) {
    if (!infer)
      throw InputError(beside + ": cannot open (a model's config.json; packbert convert " + src +
                       " can infer one from the tensor shapes, or take `config`)");
    m.config = infer_config(m.weights);
    m.config_from = "inferred from the tensor shapes";
  } else {
    m.config_json = io::read_file(m.config_from);
    json j;
    try {
      j = json::parse(m.config_json);
    } catch (const json::exception& e) {
      throw InputError(m.config_from + ": not valid JSON: " + io::json_error_text(e));
    }
    if (!j.is_object()) throw InputError(m.config_from + ": not a JSON object");
    m.config = config_from_json(j, m.config_from);
    if (j.contains("architectures") && j["architectures"].is_array() &&
        !j["architectures"].empty() && j["architectures"][0].is_string())
      m.architecture = j["architectures"][0].get<std::string>();
  }
  const std::string vocab = (fs::path(dir) / "vocab.txt").string();
  if (fs::exists(vocab)) m.vocab = vocab;
  const std::string tokenizer = (fs::path(dir) / "tokenizer.json").string();
  if (fs::exists(tokenizer)) m.tokenizer_json = tokenizer;
  return m;
}

}  // namespace

ImportedModel import_model(const std::string& src, const std::string& config_path, bool infer) {
  ImportedModel m;
  std::string dir = src, weights = src;
  int shards = 0;
  if (fs::is_directory(src)) {
    weights.clear();
    for (const char* name : {"model.safetensors", "model.safetensors.index.json",
                             "pytorch_model.bin", "pytorch_model.bin.index.json"})
      if (fs::exists(fs::path(src) / name)) {
        weights = (fs::path(src) / name).string();
        break;
      }
    if (weights.empty())
      throw InputError(src +
                       ": no model.safetensors or pytorch_model.bin (or their "
                       ".index.json) in the directory");
  } else {
    if (!fs::exists(src)) throw InputError(src + ": cannot open (no such file or directory)");
    dir = fs::path(src).parent_path().string();
    if (dir.empty()) dir = ".";
  }
  // A safetensors file whose names need no change is used where it lies, mapped: nothing is
  // read but its header until a tensor is asked for (by name and checked shape).
  if (!weights.ends_with(".json")) {
    io::FileBytes bytes = io::FileBytes::map(weights);
    if (is_safetensors(bytes.view())) {
      io::SafetensorsFile f = io::SafetensorsFile::parse(std::move(bytes), weights);
      Bare bare;
      bool same = true;
      for (const auto& [name, e] : f.tensors()) bare.see(name);
      for (const auto& [name, e] : f.tensors()) same = same && hf_name(name, bare) == name;
      if (same) {
        m.format = "safetensors";
        m.weights = std::move(f);
        return finish_import(std::move(m), src, dir, config_path, infer);
      }
    }
  }
  std::vector<io::TorchTensor> tensors = weights.ends_with(".json")
                                             ? read_shards(weights, shards, m.format)
                                             : read_tensors(weights, m.format);
  if (shards) m.format += ", " + std::to_string(shards) + " shards";

  Bare bare;
  for (const io::TorchTensor& t : tensors) bare.see(t.name);
  std::vector<io::TensorToWrite> out;
  std::set<std::string> seen;
  for (io::TorchTensor& t : tensors) {
    std::string name = hf_name(t.name, bare);
    if (name != t.name) ++m.renamed;
    if (!seen.insert(name).second)
      throw InputError(weights + ": two tensors named '" + name + "' (after bringing '" + t.name +
                       "' to Hugging Face's name)");
    out.push_back({name, t.dtype, t.shape, t.data.data(), t.data.size()});
  }
  m.weights =
      io::SafetensorsFile::parse(io::serialize_safetensors(out, {{"format", "pt"}}), weights);
  return finish_import(std::move(m), src, dir, config_path, infer);
}

Heads heads_present(const io::SafetensorsFile& w) {
  Heads h;
  if (w.has(ParamLayout::word_table_name(Family::modernbert))) {  // a ModernBERT's names
    h.classifier = w.has("classifier.weight");  // (its QA head is told by its architecture)
    h.pretraining = !h.classifier && w.has("head.dense.weight");
    return h;
  }
  h.pretraining = w.has("cls.predictions.transform.dense.weight");
  h.classifier = w.has("classifier.weight");
  h.span = w.has("qa_outputs.weight");
  return h;
}

Heads heads_present(const ImportedModel& m) {
  if (m.config.family != Family::modernbert) return heads_present(m.weights);
  Heads h;
  const bool task = m.weights.has("classifier.weight");
  h.span = task && m.architecture == "ModernBertForQuestionAnswering";
  h.classifier = task && !h.span;
  h.pretraining = !task && m.weights.has("head.dense.weight");
  return h;
}

std::string architecture_of(const BertConfig& config, const Heads& h, bool masked_lm) {
  const bool modern = config.family == Family::modernbert;
  const char* task = h.classifier    ? "ForSequenceClassification"
                     : h.span        ? "ForQuestionAnswering"
                     : h.pretraining ? (masked_lm || modern ? "ForMaskedLM" : "ForPreTraining")
                                     : "Model";
  return std::string(modern ? "ModernBert" : "Bert") + task;
}

std::vector<std::string> check_imported(const ImportedModel& m, const Heads& heads) {
  const ParamLayout layout(m.config, heads);
  std::vector<std::string> absent;
  for (const TensorSpec& t : layout.tensors()) {
    if (!m.weights.has(t.name)) {
      if (is_encoder_tensor(t.name))
        throw InputError(m.weights.source() + ": missing tensor '" + t.name + "' (config from " +
                         m.config_from + ")");
      absent.push_back(t.name);
      continue;
    }
    (void)m.weights.floats(t.name, &t.shape);  // shape and dtype, named on failure
  }
  return absent;
}

void write_imported(const ImportedModel& m, const std::string& dir) {
  std::string config = m.config_json;
  if (config.empty())
    config = config_to_json(m.config, architecture_of(m.config, heads_present(m))).dump(2) + "\n";
  io::write_file_atomic(dir + "/config.json", config);
  std::vector<io::TensorToWrite> out;
  for (const auto& [name, e] : m.weights.tensors()) {
    const std::string_view raw = m.weights.raw(name);
    out.push_back({name, e.dtype, e.shape, raw.data(), raw.size()});
  }
  io::write_safetensors(dir + "/model.safetensors", out, {{"format", "pt"}});
  if (!m.tokenizer_json.empty())
    copy_tokenizer_files(fs::path(m.tokenizer_json).parent_path(), dir);
}

void copy_tokenizer_files(const std::string& from, const std::string& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path file = fs::path(from) / name;
    if (fs::exists(file)) io::write_file_atomic(dir + "/" + name, io::read_file(file.string()));
  }
}

bool is_packbert_checkpoint(const std::string& path) {
  return !fs::is_directory(path) && io::read_safetensors_metadata(path).count("config") != 0;
}

}  // namespace packbert::model
