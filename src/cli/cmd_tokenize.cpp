// `packbert tokenize`: one line of WordPiece ids (or pieces) per input line.
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "data/casing.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "error.h"
#include "io/input_file.h"

namespace packbert::cli {

namespace {

struct TokenizeArgs {
  std::string vocab;
  std::string input;
  bool cased = false, tokens = false;
};

void run_tokenize(const TokenizeArgs& a) {
  data::Vocab vocab = data::Vocab::load(a.vocab);
  if (const data::Casing c = data::decide_casing(!a.cased, "", vocab, a.vocab); !c.warning.empty())
    std::cerr << "tokenize: warning: " << with_flags(c.warning) << '\n';
  data::Tokenizer tok(vocab, !a.cased);
  std::ifstream file;
  if (!a.input.empty()) {
    io::require_text_input(a.input);
    file.open(a.input, std::ios::binary);
    if (!file) throw InputError(a.input + ": cannot open for reading");
  }
  std::istream& in = a.input.empty() ? std::cin : file;
  std::string line, out;
  const std::string name = a.input.empty() ? "<stdin>" : a.input;
  size_t offset = 0, line_no = 0;
  while (std::getline(in, line)) {
    data::check_utf8(line, name + ":" + std::to_string(++line_no), offset);
    offset += line.size() + 1;
    out.clear();
    if (a.tokens) {
      for (const std::string& p : tok.pieces(line)) {
        if (!out.empty()) out += ' ';
        out += p;
      }
    } else {
      for (int32_t id : tok.encode(line)) {
        if (!out.empty()) out += ' ';
        out += std::to_string(id);
      }
    }
    std::cout << out << '\n';
  }
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "WordPiece-tokenize text, one output line per input line (ids or pieces)");
  cmd->add_option("input", args->input, "Text file (default: standard input)");
  vocab_option(cmd, args->vocab, "vocab.txt");
  cmd->add_flag("--cased", args->cased, "Keep case and accents (cased models)");
  cmd->add_flag("--tokens", args->tokens, "Print the pieces instead of ids");
  cmd->callback([args] { run_tokenize(*args); });
}

}  // namespace packbert::cli
