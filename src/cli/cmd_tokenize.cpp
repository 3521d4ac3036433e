// `packbert tokenize`: one line of WordPiece ids (or pieces) per input line.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "data/casing.h"
#include "data/tokenizer.h"
#include "data/tokenizer_json.h"
#include "data/utf8.h"
#include "error.h"
#include "io/input_file.h"

namespace packbert::cli {

namespace {

struct TokenizeArgs {
  std::string vocab, tokenizer;
  std::string input;
  bool cased = false, tokens = false, special = false;
};

// Each line of `in` through `encode` (ids), printed as ids or as the tokens `token` names.
template <typename Encode, typename Token>
void tokenize_lines(std::istream& in, const std::string& name, bool tokens, Encode encode,
                    Token token) {
  std::string line, out;
  size_t offset = 0, line_no = 0;
  while (std::getline(in, line)) {
    data::check_utf8(line, name + ":" + std::to_string(++line_no), offset);
    offset += line.size() + 1;
    out.clear();
    for (int32_t id : encode(line)) {
      if (!out.empty()) out += ' ';
      out += tokens ? token(id) : std::to_string(id);
    }
    std::cout << out << '\n';
  }
}

void run_tokenize(const TokenizeArgs& a) {
  std::ifstream file;
  if (!a.input.empty()) {
    io::require_text_input(a.input);
    file.open(a.input, std::ios::binary);
    if (!file) throw InputError(a.input + ": cannot open for reading");
  }
  std::istream& in = a.input.empty() ? std::cin : file;
  const std::string name = a.input.empty() ? "<stdin>" : a.input;
  if (!a.tokenizer.empty()) {
    const std::string path =
        std::filesystem::is_directory(a.tokenizer) ? a.tokenizer + "/tokenizer.json" : a.tokenizer;
    const data::JsonTokenizer tok = data::JsonTokenizer::load(path);
    tokenize_lines(
        in, name, a.tokens, [&](const std::string& l) { return tok.encode(l, a.special); },
        [&](int32_t id) { return tok.token(id); });
    return;
  }
  if (a.special)
    throw OptionError("special", "is for a tokenizer.json's post-processor (`tokenizer`)");
  data::Vocab vocab = data::Vocab::load(a.vocab);
  if (const data::Casing c = data::decide_casing(!a.cased, "", vocab, a.vocab); !c.warning.empty())
    std::cerr << "tokenize: warning: " << with_flags(c.warning) << '\n';
  data::Tokenizer tok(vocab, !a.cased);
  tokenize_lines(
      in, name, a.tokens, [&](const std::string& l) { return tok.encode(l); },
      [&](int32_t id) { return vocab.token(id); });
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize text with BERT's WordPiece (a vocab.txt) or a Hugging Face tokenizer.json (BPE "
      "or WordPiece), one output line per input line (ids or pieces)");
  cmd->add_option("input", args->input, "Text file (default: standard input)");
  vocab_option(cmd, args->vocab, "vocab.txt");
  cmd->add_flag("--cased", args->cased, "Keep case and accents (cased models)");
  cmd->add_flag("--tokens", args->tokens, "Print the pieces instead of ids");
  CLI::Option* json_file =
      cmd->add_option("--tokenizer", args->tokenizer,
                      "A Hugging Face tokenizer.json (or a model directory holding one) instead "
                      "of --vocab: its normalizer, pre-tokenizer, BPE or WordPiece model and "
                      "added tokens");
  json_file->excludes(cmd->get_option("--cased"));
  cmd->add_flag("--special", args->special,
                "With --tokenizer: add its post-processor's special tokens ([CLS] ... [SEP], "
                "<s> ... </s>), as tokenizer(text) does");
  cmd->callback([args] { run_tokenize(*args); });
}

}  // namespace packbert::cli
