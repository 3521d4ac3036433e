// BERT's BasicTokenizer + WordPiece, id for id identical to Hugging Face `BertTokenizer`:
// clean text (drop NUL, U+FFFD and control characters; whitespace → space), split CJK
// characters, NFC, split on whitespace, lower-case + strip accents (uncased models), split on
// punctuation, then greedy longest-match WordPiece with "##" continuations; words over 100
// characters become [UNK]. Special tokens ([CLS] [SEP] [MASK] [PAD] [UNK]) written in the text
// are never split. Invalid UTF-8 is replaced (and so dropped), never a crash.
// A vocabulary read from a tokenizer.json (Vocab::json()) tokenises with that file's own
// normaliser, pre-tokenizer and model instead (its BertNormalizer deciding the casing of a
// WordPiece one; byte-level BPE keeping every byte, whitespace included).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/vocab.h"

namespace packbert::data {

class Tokenizer {
 public:
  Tokenizer(const Vocab& vocab, bool lower_case);

  // The ids of `text`, no special tokens added.
  std::vector<int32_t> encode(std::string_view text) const;
  std::vector<std::string> pieces(std::string_view text) const;
  // Basic tokenization only (words after cleaning, case folding and punctuation splits).
  std::vector<std::string> basic_tokens(std::string_view text) const;
  const Vocab& vocab() const { return vocab_; }
  // A byte-level BPE from a tokenizer.json: encode(a + b) is encode(a) then encode(b) wherever b
  // starts with whitespace, and token_bytes gives each token's bytes of the text.
  bool byte_level() const;
  std::string token_bytes(int32_t id) const;

 private:
  template <typename Emit>
  void run(std::string_view text, Emit&& emit) const;
  template <typename Emit>
  void wordpiece(const std::string& word, Emit&& emit) const;
  void basic(std::string_view text, std::vector<std::string>& words) const;

  const Vocab& vocab_;
  bool lower_case_;
};

}  // namespace packbert::data
