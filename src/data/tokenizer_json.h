// Hugging Face's tokenizer.json (the `tokenizers` library's file): the byte-level BPE that GPT-2,
// RoBERTa and ModernBERT use, and BERT's WordPiece, with the file's added tokens (split out of
// the text before anything else, by longest match) and its post-processor (the [CLS] ... [SEP]
// template). What a file may hold (docs/FORMATS.md):
// - model: BPE (vocab, merges as "a b" strings or [a, b] pairs, unk_token, ignore_merges) or
//   WordPiece (vocab, unk_token, "##" continuations, max_input_chars_per_word);
// - normalizer: null, NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, BertNormalizer, Sequence;
// - pre_tokenizer: ByteLevel (GPT-2's split, add_prefix_space), BertPreTokenizer, Whitespace,
//   WhitespaceSplit, Sequence;
// - post_processor: null, TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel,
//   Sequence.
// Anything else (BPE dropout, byte fallback, subword prefixes on BPE, Unigram, Split with a
// regex, ...) is refused in one line naming the part and its type: never a silent difference.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/vocab.h"

namespace packbert::data {

class JsonTokenizer {
 public:
  // Reads `path`; InputError naming the file and the part it cannot read.
  static JsonTokenizer load(const std::string& path);
  JsonTokenizer(JsonTokenizer&&) noexcept;
  JsonTokenizer& operator=(JsonTokenizer&&) noexcept;
  ~JsonTokenizer();

  // The ids of `text` (valid UTF-8), with the post-processor's special tokens when
  // add_special_tokens (HF's tokenizer(text) default).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // The tokens of those ids.
  std::vector<std::string> pieces(std::string_view text, bool add_special_tokens = true) const;
  const std::string& token(int32_t id) const;
  int32_t vocab_size() const;
  const std::string& model_type() const;  // "BPE" | "WordPiece"
  // Whether the pre-tokenizer is GPT-2's ByteLevel: every token stands for bytes of the text
  // (after normalisation), in order, whitespace included.
  bool byte_level() const;
  // The bytes a token of a byte-level tokenizer stands for (an added token: its content).
  std::string token_bytes(int32_t id) const;
  // A WordPiece tokenizer's BertNormalizer lowercase (and strips accents); nullopt for BPE.
  std::optional<bool> lower_case() const;

 private:
  struct Impl;
  explicit JsonTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace packbert::data
