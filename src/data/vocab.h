// WordPiece vocabulary: one token per line, id = line number (vocab.txt of any BERT model).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace packbert::data {

class JsonTokenizer;

// Whether `path` names a Hugging Face tokenizer.json (by its ".json" ending) rather than a
// vocab.txt.
bool is_tokenizer_json(const std::string& path);

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class Vocab {
 public:
  // Loads vocab.txt, or a tokenizer.json (is_tokenizer_json): its ids and tokens, the tokenizer
  // itself kept for Tokenizer to run (json()). Throws InputError (path:line) for an unreadable or
  // empty file, a duplicate token, or a missing special token ([PAD] [UNK] [CLS] [SEP] [MASK]:
  // BERT's and ModernBERT's tokenizers have them; RoBERTa's <s> </s> are not read).
  static Vocab load(const std::string& path);
  static Vocab from_tokens(std::vector<std::string> tokens, const std::string& source);

  int32_t id(std::string_view token) const;  // -1 if absent
  // The tokenizer.json this vocabulary came from; null for a vocab.txt.
  const JsonTokenizer* json() const { return json_.get(); }
  const std::string& token(int32_t id) const { return tokens_[id]; }
  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t pad() const { return pad_; }
  int32_t unk() const { return unk_; }
  int32_t cls() const { return cls_; }
  int32_t sep() const { return sep_; }
  int32_t mask() const { return mask_; }
  // 64-bit FNV-1a of the token list: files made with one vocabulary record it, and loading them
  // with another is an error.
  // format_version: the version of the file that records it (version 1 files used another
  // FNV offset basis, io/checksum.h).
  uint64_t fingerprint(uint32_t format_version = 2) const {
    return format_version == 1 ? fingerprint_v1_ : fingerprint_;
  }

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
  int32_t pad_ = -1, unk_ = -1, cls_ = -1, sep_ = -1, mask_ = -1;
  uint64_t fingerprint_ = 0, fingerprint_v1_ = 0;
  std::shared_ptr<const JsonTokenizer> json_;
};

}  // namespace packbert::data
