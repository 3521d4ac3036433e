#include "data/tokenizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "data/tokenizer_json.h"

namespace packbert::data {

namespace {

using Cp = char32_t;

bool is_whitespace(Cp c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return true;
  return c >= 0x80 && utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ZS;
}

bool is_control(Cp c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  if (c < 0x80) return c < 0x20 || c == 0x7f;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
      return true;
    default:
      return false;
  }
}

bool is_punctuation(Cp c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126))
    return true;
  if (c < 0x80) return false;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool is_cjk(Cp c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_cased_letter(Cp c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

// UTF-8 → code points; each invalid byte becomes U+FFFD.
std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t n = static_cast<utf8proc_ssize_t>(s.size()), i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      out.push_back(p[i++]);
      continue;
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
    if (len <= 0) {
      out.push_back(0xFFFD);
      ++i;
    } else {
      out.push_back(static_cast<Cp>(cp));
      i += len;
    }
  }
  return out;
}

void append_utf8(std::string& out, Cp c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
    return;
  }
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<char*>(buf), static_cast<size_t>(n));
}

std::u32string normalize(const std::u32string& s, bool decompose) {
  std::string utf8;
  for (Cp c : s) append_utf8(utf8, c);
  auto* raw = decompose ? utf8proc_NFD(reinterpret_cast<const utf8proc_uint8_t*>(utf8.c_str()))
                        : utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(utf8.c_str()));
  if (!raw) return s;
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(raw, &std::free);
  return decode(reinterpret_cast<const char*>(raw));
}

// Python's str.lower(): simple mappings plus the final-sigma rule; then accents stripped (NFD,
// drop nonspacing marks), as BERT's uncased BasicTokenizer does.
std::u32string lower_and_strip(const std::u32string& w) {
  std::u32string low;
  low.reserve(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    Cp c = w[i];
    if (c == 0x3A3) {  // Σ: final form when it ends a word after a cased letter
      bool after = i > 0 && is_cased_letter(w[i - 1]);
      bool before = i + 1 < w.size() && is_cased_letter(w[i + 1]);
      low.push_back(after && !before ? 0x3C2 : 0x3C3);
    } else if (c == 0x130) {  // İ lowers to i + combining dot (stripped below)
      low.push_back('i');
      low.push_back(0x307);
    } else {
      low.push_back(c < 0x80 ? static_cast<Cp>(c >= 'A' && c <= 'Z' ? c + 32 : c)
                             : static_cast<Cp>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  bool ascii = true;
  for (Cp c : low) ascii &= c < 0x80;
  if (ascii) return low;
  std::u32string nfd = normalize(low, true), out;
  for (Cp c : nfd)
    if (utf8proc_category(static_cast<utf8proc_int32_t>(c)) != UTF8PROC_CATEGORY_MN)
      out.push_back(c);
  return out;
}

constexpr const char* kSpecial[] = {"[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]"};

}  // namespace

void Tokenizer::basic(std::string_view text, std::vector<std::string>& words) const {
  std::u32string cps = decode(text), clean;
  clean.reserve(cps.size());
  bool ascii = true;
  for (Cp c : cps) {
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    if (is_whitespace(c)) {
      clean.push_back(' ');
    } else if (is_cjk(c)) {
      clean.push_back(' ');
      clean.push_back(c);
      clean.push_back(' ');
    } else {
      clean.push_back(c);
    }
    ascii &= c < 0x80;
  }
  if (!ascii) clean = normalize(clean, false);  // NFC, as BasicTokenizer does
  size_t i = 0;
  while (i < clean.size()) {
    while (i < clean.size() && clean[i] == ' ') ++i;
    size_t j = i;
    while (j < clean.size() && clean[j] != ' ') ++j;
    if (j == i) break;
    std::u32string word = clean.substr(i, j - i);
    i = j;
    if (lower_case_) word = lower_and_strip(word);
    std::string cur;
    for (Cp c : word) {
      if (is_punctuation(c)) {
        if (!cur.empty()) words.push_back(std::move(cur)), cur.clear();
        std::string p;
        append_utf8(p, c);
        words.push_back(std::move(p));
      } else {
        append_utf8(cur, c);
      }
    }
    if (!cur.empty()) words.push_back(std::move(cur));
  }
}

template <typename Emit>
void Tokenizer::wordpiece(const std::string& word, Emit&& emit) const {
  // Code point boundaries (byte offsets).
  std::vector<size_t> cut;
  for (size_t b = 0; b < word.size(); ++b)
    if ((static_cast<unsigned char>(word[b]) & 0xC0) != 0x80) cut.push_back(b);
  cut.push_back(word.size());
  const size_t n = cut.size() - 1;
  if (n > 100) {
    emit(vocab_.unk());
    return;
  }
  std::vector<int32_t> ids;
  std::string probe;
  size_t start = 0;
  while (start < n) {
    int32_t found = -1;
    size_t end = n;
    for (; end > start; --end) {
      std::string_view sub(word.data() + cut[start], cut[end] - cut[start]);
      if (start == 0) {
        found = vocab_.id(sub);
      } else {
        probe.assign("##");
        probe.append(sub);
        found = vocab_.id(probe);
      }
      if (found >= 0) break;
    }
    if (found < 0) {
      emit(vocab_.unk());
      return;
    }
    ids.push_back(found);
    start = end;
  }
  for (int32_t id : ids) emit(id);
}

template <typename Emit>
void Tokenizer::run(std::string_view text, Emit&& emit) const {
  // Special tokens written in the text are split out first and never touched.
  size_t pos = 0;
  std::vector<std::string> words;
  while (pos <= text.size()) {
    size_t best = std::string_view::npos;
    std::string_view best_tok;
    for (const char* s : kSpecial) {
      size_t at = text.find(s, pos);
      if (at < best) best = at, best_tok = s;
    }
    std::string_view chunk =
        text.substr(pos, best == std::string_view::npos ? text.size() - pos : best - pos);
    words.clear();
    basic(chunk, words);
    for (const std::string& w : words) wordpiece(w, emit);
    if (best == std::string_view::npos) break;
    emit(vocab_.id(best_tok));
    pos = best + best_tok.size();
  }
}

Tokenizer::Tokenizer(const Vocab& vocab, bool lower_case)
    : vocab_(vocab),
      lower_case_(vocab.json() && vocab.json()->lower_case() ? *vocab.json()->lower_case()
                                                             : lower_case) {}

bool Tokenizer::byte_level() const {
  return vocab_.json() && vocab_.json()->byte_level();
}

std::string Tokenizer::token_bytes(int32_t id) const {
  return vocab_.json() ? vocab_.json()->token_bytes(id) : vocab_.token(id);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (vocab_.json()) return vocab_.json()->encode(text, false);
  std::vector<int32_t> ids;
  run(text, [&](int32_t id) { ids.push_back(id); });
  return ids;
}

std::vector<std::string> Tokenizer::pieces(std::string_view text) const {
  std::vector<std::string> out;
  if (vocab_.json()) {
    for (int32_t id : encode(text)) out.push_back(vocab_.token(id));
    return out;
  }
  run(text, [&](int32_t id) { out.push_back(vocab_.token(id)); });
  return out;
}

std::vector<std::string> Tokenizer::basic_tokens(std::string_view text) const {
  std::vector<std::string> words;
  basic(text, words);
  return words;
}

}  // namespace packbert::data
