#include "data/vocab.h"

#include <fstream>

#include "data/tokenizer_json.h"
#include "data/utf8.h"
#include "error.h"
#include "io/checksum.h"
#include "io/input_file.h"

namespace packbert::data {

bool is_tokenizer_json(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

Vocab Vocab::load(const std::string& path) {
  io::require_text_input(path);
  if (is_tokenizer_json(path)) {
    auto json = std::make_shared<const JsonTokenizer>(JsonTokenizer::load(path));
    std::vector<std::string> tokens;
    for (int32_t i = 0; i < json->vocab_size(); ++i) tokens.push_back(json->token(i));
    Vocab v = from_tokens(std::move(tokens), path);
    v.json_ = std::move(json);
    return v;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open vocabulary for reading");
  std::vector<std::string> tokens;
  std::string line;
  size_t offset = 0;  // of the line in the file
  while (std::getline(in, line)) {
    check_utf8(line, path + ":" + std::to_string(tokens.size() + 1), offset);
    offset += line.size() + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    tokens.push_back(line);
  }
  return from_tokens(std::move(tokens), path);
}

Vocab Vocab::from_tokens(std::vector<std::string> tokens, const std::string& source) {
  Vocab v;
  if (tokens.empty()) throw InputError(source + ": vocabulary is empty");
  v.tokens_ = std::move(tokens);
  uint64_t h = io::kFnvOffsetBasis, h1 = io::kFnvOffsetBasisV1;
  const unsigned char separator = 0xff;
  for (size_t i = 0; i < v.tokens_.size(); ++i) {
    const std::string& t = v.tokens_[i];
    h = io::fnv1a(&separator, 1, io::fnv1a(t.data(), t.size(), h));
    h1 = io::fnv1a(&separator, 1, io::fnv1a(t.data(), t.size(), h1));
    if (t.empty()) continue;  // blank lines keep their id but match nothing
    auto [it, fresh] = v.ids_.emplace(t, static_cast<int32_t>(i));
    if (!fresh)
      throw InputError(source + ":" + std::to_string(i + 1) + ": token '" + t + "' repeats line " +
                       std::to_string(it->second + 1));
  }
  v.fingerprint_ = h;
  v.fingerprint_v1_ = h1;
  struct Special {
    const char* name;
    int32_t* id;
  } specials[] = {{"[PAD]", &v.pad_},
                  {"[UNK]", &v.unk_},
                  {"[CLS]", &v.cls_},
                  {"[SEP]", &v.sep_},
                  {"[MASK]", &v.mask_}};
  for (const Special& s : specials) {
    *s.id = v.id(s.name);
    if (*s.id < 0)
      throw InputError(source + ": vocabulary has no " + s.name +
                       (is_tokenizer_json(source)
                            ? " token (packbert tokenises with BERT's special tokens, which "
                              "BERT's and ModernBERT's tokenizers have)"
                            : " token (is this a BERT vocab.txt?)"));
  }
  return v;
}

int32_t Vocab::id(std::string_view token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

}  // namespace packbert::data
