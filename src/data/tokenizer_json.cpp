#include "data/tokenizer_json.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/tokenizer.h"
#include "error.h"
#include "io/atomic_file.h"

namespace packbert::data {

namespace {

using json = nlohmann::json;
using Cp = char32_t;

std::u32string decode(std::string_view s) {
  std::u32string out;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  const auto n = static_cast<utf8proc_ssize_t>(s.size());
  for (utf8proc_ssize_t i = 0; i < n;) {
    utf8proc_int32_t cp;
    const utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
    if (len <= 0) {  // (invalid bytes: the caller has checked; never loop)
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(static_cast<Cp>(cp));
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, Cp c) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string to_utf8(std::u32string_view s) {
  std::string out;
  for (Cp c : s) append_utf8(out, c);
  return out;
}

utf8proc_category_t category(Cp c) {
  return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(c)));
}
bool is_letter(Cp c) {
  const auto k = category(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool is_number(Cp c) {
  const auto k = category(c);
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
// Unicode's White_Space property (what \s matches in the tokenizers library's regexes).
bool is_space(Cp c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}
// \w: letters, marks, numbers and connector punctuation.
bool is_word(Cp c) {
  const auto k = category(c);
  return is_letter(c) || is_number(c) || (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) ||
         k == UTF8PROC_CATEGORY_PC;
}
bool is_punct(Cp c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126))
    return true;
  const auto k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

// GPT-2's pre-tokenizer: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::u32string> gpt2_split(const std::u32string& s) {
  std::vector<std::u32string> out;
  const size_t n = s.size();
  size_t i = 0;
  auto run = [&](size_t from, auto pred) {
    size_t j = from;
    while (j < n && pred(s[j])) ++j;
    return j;
  };
  auto other = [](Cp c) { return !is_space(c) && !is_letter(c) && !is_number(c); };
  while (i < n) {
    size_t end = i;
    if (s[i] == '\'' && i + 1 < n) {
      static const std::u32string kContractions[] = {U"s", U"t", U"re", U"ve", U"m", U"ll", U"d"};
      for (const std::u32string& c : kContractions)
        if (s.compare(i + 1, c.size(), c) == 0) {
          end = i + 1 + c.size();
          break;
        }
    }
    if (end == i) {
      const size_t at = s[i] == ' ' && i + 1 < n ? i + 1 : i;  // the optional leading space
      if (is_letter(s[at]))
        end = run(at, is_letter);
      else if (is_number(s[at]))
        end = run(at, is_number);
      else if (other(s[at]))
        end = run(at, other);
    }
    if (end == i) {  // whitespace: \s+(?!\S), else \s+
      const size_t ws = run(i, is_space);
      end = ws == n || ws - i == 1 ? ws : ws - 1;
    }
    out.emplace_back(s.substr(i, end - i));
    i = end;
  }
  return out;
}

// GPT-2's reversible map of bytes to printable code points.
const std::array<Cp, 256>& byte_chars() {
  static const std::array<Cp, 256> table = [] {
    std::array<Cp, 256> t{};
    Cp next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[static_cast<size_t>(b)] = printable ? static_cast<Cp>(b) : next++;
    }
    return t;
  }();
  return table;
}

std::string string_field(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

struct AddedToken {
  std::u32string content;
  int32_t id = 0;
  bool lstrip = false, rstrip = false, single_word = false;
};

enum class Norm { nfc, nfd, nfkc, nfkd, lowercase, strip_accents };
enum class Split { byte_level, bert, whitespace, whitespace_split };

}  // namespace

struct JsonTokenizer::Impl {
  std::string path, type;
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids;
  std::vector<AddedToken> added;
  std::vector<Norm> norms;
  std::vector<Split> splits;
  bool prefix_space = false;
  // BPE
  std::unordered_map<std::string, int32_t> ranks;  // "a\0b" -> merge rank
  std::optional<int32_t> unk;
  bool ignore_merges = false;
  // WordPiece (BERT's normaliser and pre-tokeniser with it: the BERT tokenizer itself)
  std::optional<Vocab> vocab;
  std::optional<Tokenizer> wordpiece;
  // The post-processor's ids around the sequence.
  std::vector<int32_t> before, after;

  [[noreturn]] void refuse(const std::string& what) const {
    throw InputError(path + ": " + what + " is not supported (packbert reads BPE and WordPiece " +
                     "tokenizer.json files: docs/FORMATS.md)");
  }
  // Ids run from 0 with no more gaps than tokens (a hostile id of 2^31 - 1 would ask for
  // billions of entries): at most the vocab's size plus the added tokens'.
  size_t max_ids = 0;
  void check_id(int64_t id, const char* part) const {
    if (id < 0 || static_cast<size_t>(id) >= max_ids)
      throw InputError(path + ": " + part + " gives id " + std::to_string(id) + ", outside 0 .. " +
                       std::to_string(max_ids - 1) + " (its tokens and added tokens)");
  }
  int32_t id_of(const std::string& token, const char* part) const {
    auto it = ids.find(token);
    if (it == ids.end())
      throw InputError(path + ": " + part + " names '" + token + "', which is not in the vocab");
    return it->second;
  }

  void read_normalizer(const json& n) {
    if (n.is_null()) return;
    const std::string t = string_field(n, "type");
    if (t == "Sequence") {
      for (const json& x : n.value("normalizers", json::array())) read_normalizer(x);
    } else if (t == "NFC") {
      norms.push_back(Norm::nfc);
    } else if (t == "NFD") {
      norms.push_back(Norm::nfd);
    } else if (t == "NFKC") {
      norms.push_back(Norm::nfkc);
    } else if (t == "NFKD") {
      norms.push_back(Norm::nfkd);
    } else if (t == "Lowercase") {
      norms.push_back(Norm::lowercase);
    } else if (t == "StripAccents") {
      norms.push_back(Norm::strip_accents);
    } else if (t == "BertNormalizer" && type == "WordPiece") {
      const bool lower = n.value("lowercase", true);
      const json sa = n.value("strip_accents", json());
      if (!n.value("clean_text", true) || !n.value("handle_chinese_chars", true) ||
          (!sa.is_null() && sa.get<bool>() != lower))
        refuse(
            "a BertNormalizer other than BERT's (clean_text, handle_chinese_chars, "
            "strip_accents as lowercase)");
      bert_lower = lower;
    } else {
      refuse("the normalizer '" + t + "'" + (t == "BertNormalizer" ? " on a BPE model" : ""));
    }
  }
  std::optional<bool> bert_lower;

  void read_pre_tokenizer(const json& p) {
    if (p.is_null()) return;
    const std::string t = string_field(p, "type");
    if (t == "Sequence") {
      for (const json& x : p.value("pretokenizers", json::array())) read_pre_tokenizer(x);
    } else if (t == "ByteLevel") {
      if (!p.value("use_regex", true)) refuse("a ByteLevel pre-tokenizer without its regex");
      prefix_space = p.value("add_prefix_space", false);
      splits.push_back(Split::byte_level);
    } else if (t == "BertPreTokenizer") {
      splits.push_back(Split::bert);
    } else if (t == "Whitespace") {
      splits.push_back(Split::whitespace);
    } else if (t == "WhitespaceSplit") {
      splits.push_back(Split::whitespace_split);
    } else {
      refuse("the pre_tokenizer '" + t + "'");
    }
  }

  // The special tokens a post-processor puts around one sequence.
  void read_post_processor(const json& p) {
    if (p.is_null()) return;
    const std::string t = string_field(p, "type");
    auto pair_id = [&](const char* key) {
      const json& v = p.at(key);
      return v.is_array() && v.size() == 2 ? v[1].get<int32_t>() : id_of(v.get<std::string>(), key);
    };
    if (t == "Sequence") {
      for (const json& x : p.value("processors", json::array())) read_post_processor(x);
    } else if (t == "ByteLevel") {
      // (offsets only)
    } else if (t == "BertProcessing" || t == "RobertaProcessing") {
      before.push_back(pair_id("cls"));
      after.push_back(pair_id("sep"));
    } else if (t == "TemplateProcessing") {
      const json& special = p.value("special_tokens", json::object());
      bool seen_sequence = false;
      for (const json& item : p.at("single")) {
        if (item.contains("Sequence")) {
          seen_sequence = true;
          continue;
        }
        const std::string name = item.at("SpecialToken").at("id").get<std::string>();
        std::vector<int32_t> these;
        if (special.contains(name))
          these = special[name].at("ids").get<std::vector<int32_t>>();
        else
          these.push_back(id_of(name, "the post_processor"));
        auto& side = seen_sequence ? after : before;
        side.insert(side.end(), these.begin(), these.end());
      }
    } else {
      refuse("the post_processor '" + t + "'");
    }
  }

  void read_model(const json& m) {
    type = string_field(m, "type");
    if (type != "BPE" && type != "WordPiece") refuse("the model '" + type + "'");
    const json& v = m.at("vocab");
    if (!v.is_object()) refuse("a vocab that is not an object of token: id");
    int32_t most = -1;
    for (const auto& [token, id] : v.items()) {
      if (!id.is_number_integer()) refuse("a vocab id that is not an integer");
      check_id(id.get<int64_t>(), "the vocab");
      most = std::max(most, id.get<int32_t>());
    }
    tokens.assign(static_cast<size_t>(most) + 1, std::string());
    for (const auto& [token, id] : v.items()) {
      const int32_t i = id.get<int32_t>();
      tokens[static_cast<size_t>(i)] = token;
      ids.emplace(token, i);
    }
    if (type == "WordPiece") {
      if (m.value("continuing_subword_prefix", std::string("##")) != "##" ||
          m.value("max_input_chars_per_word", 100) != 100)
        refuse("a WordPiece model other than BERT's (## continuations, 100 characters a word)");
      return;
    }
    if (!m.value("dropout", json()).is_null()) refuse("BPE dropout");
    if (m.value("byte_fallback", false)) refuse("BPE byte_fallback");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (!string_field(m, k).empty()) refuse(std::string("a BPE ") + k);
    ignore_merges = m.value("ignore_merges", false);
    const std::string u = string_field(m, "unk_token");
    if (!u.empty()) unk = id_of(u, "unk_token");
    int32_t rank = 0;
    for (const json& merge : m.at("merges")) {
      std::string a, b;
      if (merge.is_string()) {
        const std::string s = merge.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) throw InputError(path + ": merge '" + s + "' has no space");
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else {
        a = merge.at(0).get<std::string>(), b = merge.at(1).get<std::string>();
      }
      ranks.emplace(a + '\0' + b, rank++);
    }
  }

  std::u32string normalize(std::u32string s) const {
    for (Norm n : norms) {
      if (n == Norm::lowercase) {
        for (Cp& c : s) c = static_cast<Cp>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
        continue;
      }
      int options = UTF8PROC_STABLE;
      if (n == Norm::nfc || n == Norm::nfkc) options |= UTF8PROC_COMPOSE;
      if (n == Norm::nfd || n == Norm::nfkd || n == Norm::strip_accents)
        options |= UTF8PROC_DECOMPOSE;
      if (n == Norm::nfkc || n == Norm::nfkd) options |= UTF8PROC_COMPAT;
      const std::string bytes = to_utf8(s);
      utf8proc_uint8_t* mapped = nullptr;
      const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(bytes.data()),
                                    static_cast<utf8proc_ssize_t>(bytes.size()), &mapped,
                                    static_cast<utf8proc_option_t>(options));
      if (len < 0) continue;  // (valid input never fails)
      s = decode(std::string_view(reinterpret_cast<char*>(mapped), static_cast<size_t>(len)));
      std::free(mapped);
      if (n == Norm::strip_accents)
        std::erase_if(s, [](Cp c) { return category(c) == UTF8PROC_CATEGORY_MN; });
    }
    return s;
  }

  std::vector<std::u32string> pre_tokenize(std::u32string s) const {
    std::vector<std::u32string> words{std::move(s)};
    for (Split how : splits) {
      std::vector<std::u32string> next;
      for (std::u32string& w : words) {
        if (how == Split::byte_level) {
          if (prefix_space && (w.empty() || w[0] != ' ')) w.insert(w.begin(), ' ');
          for (std::u32string& piece : gpt2_split(w)) next.push_back(std::move(piece));
          continue;
        }
        std::u32string cur;
        auto flush = [&] {
          if (!cur.empty()) next.push_back(std::move(cur));
          cur.clear();
        };
        for (size_t i = 0; i < w.size(); ++i) {
          const Cp c = w[i];
          if (is_space(c)) {
            flush();
          } else if (how == Split::bert && is_punct(c)) {
            flush();
            next.push_back(std::u32string(1, c));
          } else if (how == Split::whitespace && !cur.empty() &&
                     is_word(cur.back()) != is_word(c)) {
            flush();
            cur.push_back(c);
          } else {
            cur.push_back(c);
          }
        }
        flush();
      }
      words = std::move(next);
    }
    if (std::find(splits.begin(), splits.end(), Split::byte_level) != splits.end())
      for (std::u32string& w : words) {  // bytes to GPT-2's printable code points
        std::u32string mapped;
        for (unsigned char b : to_utf8(w)) mapped.push_back(byte_chars()[b]);
        w = std::move(mapped);
      }
    return words;
  }

  void bpe(const std::u32string& word, std::vector<int32_t>& out) const {
    const std::string whole = to_utf8(word);
    if (ignore_merges)
      if (auto it = ids.find(whole); it != ids.end()) return out.push_back(it->second);
    std::vector<std::string> parts;
    for (Cp c : word) parts.push_back(to_utf8(std::u32string_view(&c, 1)));
    while (parts.size() > 1) {
      int32_t best = INT32_MAX;
      size_t at = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i)
        if (auto it = ranks.find(parts[i] + '\0' + parts[i + 1]);
            it != ranks.end() && it->second < best)
          best = it->second, at = i;
      if (best == INT32_MAX) break;
      const std::string a = parts[at], b = parts[at + 1];
      std::vector<std::string> merged;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i + 1 < parts.size() && parts[i] == a && parts[i + 1] == b) {
          merged.push_back(a + b);
          ++i;
        } else {
          merged.push_back(parts[i]);
        }
      }
      parts = std::move(merged);
    }
    for (const std::string& p : parts) {
      auto it = ids.find(p);
      if (it != ids.end())
        out.push_back(it->second);
      else if (unk)
        out.push_back(*unk);
      else
        throw InputError(path + ": '" + p + "' is not in the vocab and the model has no unk_token");
    }
  }

  // The text between added tokens.
  void encode_segment(const std::u32string& segment, std::vector<int32_t>& out) const {
    if (segment.empty()) return;
    if (wordpiece) {
      for (int32_t id : wordpiece->encode(to_utf8(segment))) out.push_back(id);
      return;
    }
    for (const std::u32string& w : pre_tokenize(normalize(segment))) bpe(w, out);
  }

  // The added token that matches at `i` (the longest), or null.
  const AddedToken* added_at(const std::u32string& s, size_t i) const {
    const AddedToken* best = nullptr;
    for (const AddedToken& t : added) {
      if (t.content.empty() || s.compare(i, t.content.size(), t.content) != 0) continue;
      if (t.single_word && ((i > 0 && is_word(s[i - 1])) ||
                            (i + t.content.size() < s.size() && is_word(s[i + t.content.size()]))))
        continue;
      if (!best || t.content.size() > best->content.size()) best = &t;
    }
    return best;
  }

  std::vector<int32_t> run(std::string_view text, bool special) const {
    std::vector<int32_t> out;
    if (special) out = before;
    const std::u32string s = decode(text);
    std::u32string segment;
    for (size_t i = 0; i < s.size();) {
      const AddedToken* t = added_at(s, i);
      if (!t) {
        segment.push_back(s[i++]);
        continue;
      }
      if (t->lstrip)
        while (!segment.empty() && is_space(segment.back())) segment.pop_back();
      encode_segment(segment, out);
      segment.clear();
      out.push_back(t->id);
      i += t->content.size();
      if (t->rstrip)
        while (i < s.size() && is_space(s[i])) ++i;
    }
    encode_segment(segment, out);
    if (special) out.insert(out.end(), after.begin(), after.end());
    return out;
  }
};

JsonTokenizer::JsonTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JsonTokenizer::JsonTokenizer(JsonTokenizer&&) noexcept = default;
JsonTokenizer& JsonTokenizer::operator=(JsonTokenizer&&) noexcept = default;
JsonTokenizer::~JsonTokenizer() = default;

JsonTokenizer JsonTokenizer::load(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  const json j = json::parse(io::read_file(path), nullptr, false);
  if (!j.is_object() || !j.contains("model"))
    throw InputError(path + ": not a tokenizer.json (a JSON object with a model)");
  try {
    impl->max_ids = j.at("model").value("vocab", json::object()).size() +
                    j.value("added_tokens", json::array()).size();
    impl->read_model(j.at("model"));
    impl->read_normalizer(j.value("normalizer", json()));
    impl->read_pre_tokenizer(j.value("pre_tokenizer", json()));
    for (const json& a : j.value("added_tokens", json::array())) {
      AddedToken t;
      t.content = decode(a.at("content").get<std::string>());
      t.id = a.at("id").get<int32_t>();
      t.lstrip = a.value("lstrip", false), t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      impl->check_id(a.at("id").get<int64_t>(), "an added token");
      if (static_cast<size_t>(t.id) >= impl->tokens.size())
        impl->tokens.resize(static_cast<size_t>(t.id) + 1);
      impl->tokens[static_cast<size_t>(t.id)] = a.at("content").get<std::string>();
      impl->ids.emplace(a.at("content").get<std::string>(), t.id);
      impl->added.push_back(std::move(t));
    }
    impl->read_post_processor(j.value("post_processor", json()));
  } catch (const json::exception& e) {
    throw InputError(path + ": a field is missing or of the wrong type (" + e.what() + ")");
  }
  if (impl->type == "WordPiece") {
    if (!impl->bert_lower || impl->splits != std::vector<Split>{Split::bert})
      impl->refuse("WordPiece without BERT's normalizer and pre-tokenizer");
    impl->vocab.emplace(Vocab::from_tokens(impl->tokens, path));
    impl->wordpiece.emplace(*impl->vocab, *impl->bert_lower);
  }
  return JsonTokenizer(std::move(impl));
}

std::vector<int32_t> JsonTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->run(text, add_special_tokens);
}

std::vector<std::string> JsonTokenizer::pieces(std::string_view text,
                                               bool add_special_tokens) const {
  std::vector<std::string> out;
  for (int32_t id : encode(text, add_special_tokens)) out.push_back(token(id));
  return out;
}

const std::string& JsonTokenizer::token(int32_t id) const {
  return impl_->tokens.at(static_cast<size_t>(id));
}
int32_t JsonTokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->tokens.size());
}
const std::string& JsonTokenizer::model_type() const {
  return impl_->type;
}
bool JsonTokenizer::byte_level() const {
  const auto& s = impl_->splits;
  return std::find(s.begin(), s.end(), Split::byte_level) != s.end();
}
std::string JsonTokenizer::token_bytes(int32_t id) const {
  const std::string& t = token(id);
  for (const AddedToken& a : impl_->added)
    if (a.id == id) return t;
  static const std::unordered_map<Cp, unsigned char> byte_of = [] {
    std::unordered_map<Cp, unsigned char> m;
    for (int b = 0; b < 256; ++b) m.emplace(byte_chars()[static_cast<size_t>(b)], b);
    return m;
  }();
  std::string out;
  for (Cp c : decode(t)) {
    auto it = byte_of.find(c);
    if (it == byte_of.end()) return t;  // (not a byte-level token: as written)
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}
std::optional<bool> JsonTokenizer::lower_case() const {
  return impl_->bert_lower;
}

}  // namespace packbert::data
