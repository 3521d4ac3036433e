// `packbert export`: a checkpoint to the Hugging Face layout.
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "data/vocab.h"
#include "error.h"
#include "io/paths.h"
#include "train/model_files.h"
#include "train/trainer.h"

namespace packbert::cli {

void register_export(CLI::App& app) {
  auto x = std::make_shared<std::pair<std::string, std::string>>();
  auto xv = std::make_shared<std::string>();
  CLI::App* ex = app.add_subcommand(
      "export",
      "Write config.json + model.safetensors + the tokenizer files (Hugging Face layout)");
  ex->add_option("--checkpoint,--model", x->first,
                 "The model: a packbert checkpoint or a Hugging Face directory (--model is the "
                 "name every command takes)")
      ->required();
  ex->add_option("--out", x->second, "Directory to write")->required();
  model_vocab_option(ex, *xv, "vocab.txt (or tokenizer.json) to include");
  auto xo = std::make_shared<bool>(false);
  ex->add_flag("--overwrite", *xo, "Replace a model directory already at --out");
  auto dtype = std::make_shared<std::string>("fp32");
  ex->add_option("--dtype", *dtype,
                 "fp32 | bf16 | fp16: how model.safetensors stores the weights (bf16, fp16: "
                 "rounded to nearest, half the bytes, torch_dtype bfloat16 or float16 in "
                 "config.json)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  ex->callback([x, xv, xo, dtype] {
    const train::ModelLabels source = train::model_labels(x->first);
    // A model with a tokenizer.json beside it (a ModernBERT from the Hub) keeps it, copied as it
    // is; any other model's tokenizer is a vocab.txt (BERT's, or a ModernBERT trained here on a
    // WordPiece vocabulary).
    // A ModernBERT directory with neither beside it (and no --vocab) is written without one.
    const bool family = source.family == model::Family::modernbert;
    std::error_code ec;
    const bool bare = family && source.tokenizer_dir.empty() && xv->empty() &&
                      std::filesystem::is_directory(x->first, ec) &&
                      !std::filesystem::exists(std::filesystem::path(x->first) / "vocab.txt", ec);
    const bool modern = family && (!source.tokenizer_dir.empty() || bare);
    if (modern && !xv->empty())
      throw InputError("--vocab: " + x->first +
                       " is a ModernBERT model, whose tokenizer is the tokenizer.json beside it "
                       "(export copies it)");
    const std::string vocab = modern ? "" : model_vocab(*xv, x->first);
    io::refuse_directory_over_inputs({x->second, "--out"},
                                     {{x->first, "--checkpoint"}, {vocab, "--vocab"}});
    // A masked-LM model has no pooler or NSP head: they are filled for loading and left out.
    train::FreshTensors fresh{1, 0, {}};
    auto m = train::load_model(x->first, source.heads, {}, source.masked_lm ? &fresh : nullptr);
    train::ModelFiles files;
    files.vocab = vocab;
    if (!modern) files.lower_case = model_lower_case(x->first, vocab);
    if (modern) files.tokenizer_dir = source.tokenizer_dir;
    files.label_names = source.names;
    files.dtype = model::parse_precision(*dtype);
    files.masked_lm = source.masked_lm;
    files.pooler = source.pooler;
    train::export_model(*m, x->second, files, *xo);
    if (modern)
      std::cout << "wrote " << x->second << "/{config.json, model.safetensors"
                << (files.tokenizer_dir.empty() ? "" : ", tokenizer.json") << "} (" << *dtype
                << (files.tokenizer_dir.empty() ? ", no tokenizer.json beside the model" : "")
                << ")\n";
    else if (data::is_tokenizer_json(vocab))
      std::cout << "wrote " << x->second << "/{config.json, model.safetensors, tokenizer.json} ("
                << *dtype << ", tokenizer " << vocab << ")\n";
    else
      std::cout << "wrote " << x->second
                << "/{config.json, model.safetensors, vocab.txt, tokenizer_config.json, "
                   "special_tokens_map.json} ("
                << *dtype << ", vocabulary " << vocab << ")\n";
  });
}

}  // namespace packbert::cli
