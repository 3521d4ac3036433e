// Whether to lowercase (and strip accents) when tokenising for a model: the user's flag, else the
// model's tokenizer_config.json (do_lower_case), else its vocabulary (entries with capitals mean
// a cased model). A choice that contradicts the model or the vocabulary gets a warning, never
// silence: a cased model fine-tuned on lowercased text, or an uncased vocabulary asked to keep
// case (every capitalised word becomes [UNK]), trains on the wrong tokens.
#pragma once

#include <optional>
#include <string>

#include "data/vocab.h"

namespace packbert::data {

struct Casing {
  bool lower_case = true;
  std::string note;     // how it was decided, for a one-line note ("" when the flag said it)
  std::string warning;  // a contradiction ("" when none)
};

// Vocabulary entries with an ASCII capital letter, bracketed specials ([CLS], [unused0]) aside.
int capitalised_entries(const Vocab& v);

// The vocabulary a command that reads `model` (a directory, or a file whose directory holds its
// tokenizer files) tokenises with: `given` (--vocab) when not empty, else the model's own
// vocab.txt, else its tokenizer.json, else `fallback` (the bundled bert-base-uncased). `warning` is
// set when `given` overrides a model vocabulary that differs from it (its size and casing named).
struct VocabChoice {
  std::string path, warning;
};
VocabChoice choose_vocab(const std::string& given, const std::string& model,
                         const std::string& fallback);

// `flag`: --cased (false) / --uncased (true) when given. `model`: the model directory or file
// whose directory may hold tokenizer_config.json ("" for none).
Casing decide_casing(std::optional<bool> flag, const std::string& model, const Vocab& vocab,
                     const std::string& vocab_name);

}  // namespace packbert::data
