// `packbert convert`: any form of a BERT model (Hugging Face directory with safetensors or
// pytorch_model.bin, sharded or not, a single weights file, a packbert checkpoint) to one
// Hugging Face directory: config.json + model.safetensors (+ vocab.txt when known).
#include <iostream>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "data/vocab.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/paths.h"
#include "model/hf_import.h"
#include "train/model_files.h"
#include "train/trainer.h"

namespace packbert::cli {

namespace {

struct ConvertArgs {
  std::string src, out, config, vocab;
  bool overwrite = false;
};

void check_vocab(const std::string& vocab, int vocab_size) {
  const data::Vocab v = data::Vocab::load(vocab);
  if (static_cast<int>(v.size()) != vocab_size)
    throw InputError(vocab + ": " + std::to_string(v.size()) + " tokens, the model's vocab_size " +
                     "is " + std::to_string(vocab_size));
}

void run_convert(const ConvertArgs& a) {
  io::refuse_directory_over_inputs(
      {a.out, "--out"}, {{a.src, "the model"}, {a.config, "--config"}, {a.vocab, "--vocab"}});
  if (model::is_packbert_checkpoint(a.src)) {
    if (!a.config.empty())
      throw InputError("--config: " + a.src + " is a packbert checkpoint, which holds its config");
    const train::ModelLabels source = train::model_labels(a.src);
    auto m = train::load_model(a.src, source.heads);
    // (export_model checks --vocab's size and the weights' finiteness)
    train::ModelFiles files;
    files.vocab = a.vocab, files.label_names = source.names;
    if (!a.vocab.empty()) files.lower_case = model_lower_case(a.src, a.vocab);
    train::export_model(*m, a.out, files, a.overwrite);
    std::cout << "converted packbert checkpoint " << a.src << " -> " << a.out
              << "/{config.json, model.safetensors" << (a.vocab.empty() ? "" : ", vocab.txt")
              << "} (" << m->layout().tensors().size() << " tensors, F32)\n";
    return;
  }
  const model::ImportedModel m = model::import_model(a.src, a.config, /*infer=*/true);
  const model::Heads heads = model::heads_present(m);
  const std::vector<std::string> absent = model::check_imported(m, heads);
  const std::string vocab = a.vocab.empty() ? m.vocab : a.vocab;
  if (!vocab.empty()) check_vocab(vocab, m.config.vocab_size);
  io::StagedDirectory out(a.out, "--out", a.overwrite);
  model::write_imported(m, out.path());
  if (!vocab.empty()) {
    train::ModelFiles files;
    files.vocab = vocab;
    files.lower_case = model_lower_case(a.src, vocab);
    train::write_tokenizer_files(out.path(), files, m.config.max_position_embeddings);
  }
  out.publish();

  std::map<std::string, int> dtypes;
  for (const auto& [name, e] : m.weights.tensors()) ++dtypes[e.dtype];
  std::string dtype_text;
  for (const auto& [d, n] : dtypes)
    dtype_text += (dtype_text.empty() ? "" : ", ") + std::to_string(n) + " " + d;
  std::cout << "converted " << a.src << " (" << m.format << ") -> " << a.out
            << "/{config.json, model.safetensors"
            << (vocab.empty() ? "" : ", vocab.txt, tokenizer_config.json, special_tokens_map.json")
            << (m.tokenizer_json.empty() ? "" : ", tokenizer.json") << "}\n"
            << "  tensors: " << m.weights.tensors().size() << " (" << dtype_text
            << "; values as stored)";
  if (m.renamed) std::cout << ", " << m.renamed << " renamed to BertForPreTraining's names";
  std::string head_text;
  for (const auto& [on, name] : {std::pair{heads.pretraining, "pre-training"},
                                 {heads.classifier, "classifier"},
                                 {heads.span, "span (SQuAD)"}})
    if (on) head_text += (head_text.empty() ? "" : ", ") + std::string(name);
  std::cout << "\n  config:  " << m.config_from
            << "\n  heads:   " << (head_text.empty() ? "none (encoder only)" : head_text) << "\n";
  if (!absent.empty()) {
    std::cout << "  absent:  " << absent.size()
              << " tensor(s) of packbert's layout for these heads (" << absent.front()
              << (absent.size() > 1 ? ", ..." : "") << "); --init needs them for those heads\n";
  }
  if (!m.tokenizer_json.empty() && vocab.empty())
    std::cout << "  tokenizer: " << m.tokenizer_json << " (copied)\n";
  else if (m.config.family == model::Family::modernbert)
    std::cout << "  tokenizer: no tokenizer.json beside the source\n";
  else if (vocab.empty())
    std::cout << "  vocab:   none beside the source; give --vocab to include one\n";
}

}  // namespace

void register_convert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* c = app.add_subcommand(
      "convert",
      "Any BERT model (Hugging Face directory with model.safetensors or pytorch_model.bin, "
      "sharded or not; a single .bin or .safetensors file; a packbert checkpoint) to a Hugging "
      "Face directory: config.json + model.safetensors (+ vocab.txt). PyTorch files are read "
      "without Python and nothing in them is executed");
  c->add_option("SRC", a->src,
                "The model: a directory, a .bin / .safetensors / .index.json "
                "file, or a packbert checkpoint")
      ->required();
  c->add_option("--out", a->out, "Directory to write")->required();
  c->add_option("--config", a->config,
                "config.json to use (default: the one beside SRC; without one the shape is "
                "inferred from the tensors, heads = hidden / 64)");
  c->add_option("--vocab", a->vocab,
                "vocab.txt to include (default: the one beside SRC; none for a checkpoint)");
  c->add_flag("--overwrite", a->overwrite, "Replace a model directory already at --out");
  c->callback([a] { run_convert(*a); });
}

}  // namespace packbert::cli
