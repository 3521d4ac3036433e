#include "data/squad.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "error.h"
#include "io/input_file.h"
#include "io/json_error.h"

namespace packbert::data {

using json = nlohmann::json;

namespace {

int utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;  // a stray continuation byte counts as one character, as the tokenizer drops it
}

// Byte offset of each code point of s, plus s.size() at the end.
std::vector<size_t> code_points(const std::string& s) {
  std::vector<size_t> at;
  for (size_t i = 0; i < s.size(); i += utf8_length(static_cast<unsigned char>(s[i])))
    at.push_back(i);
  at.push_back(s.size());
  return at;
}

// Google's run_squad whitespace: space, tab, CR, LF and U+202F (narrow no-break space).
bool squad_space(const std::string& s, size_t i, size_t n) {
  const char c = s[i];
  if (n == 1) return c == ' ' || c == '\t' || c == '\r' || c == '\n';
  return n == 3 && s.compare(i, 3, "\xE2\x80\xAF") == 0;
}

// s split on SQuAD whitespace, and per code point of s the word it belongs to (a space: the
// word before it, -1 before the first word).
// With each word's byte offset past its end in s.
struct Words {
  std::vector<std::string> words;
  std::vector<int32_t> char_word;
  std::vector<size_t> word_end;
};
Words split_words(const std::string& s) {
  Words out;
  bool prev_space = true;
  for (size_t b = 0; b < s.size();) {
    const size_t n = std::min<size_t>(utf8_length(static_cast<unsigned char>(s[b])), s.size() - b);
    if (squad_space(s, b, n)) {
      prev_space = true;
    } else {
      if (prev_space) out.words.emplace_back(), out.word_end.emplace_back();
      out.words.back().append(s, b, n);
      out.word_end.back() = b + n;
      prev_space = false;
    }
    out.char_word.push_back(static_cast<int32_t>(out.words.size()) - 1);
    b += n;
  }
  return out;
}

std::string join(const std::vector<std::string>& words, size_t first, size_t last) {
  std::string out;
  for (size_t w = first; w <= last; ++w) {
    if (w > first) out += ' ';
    out += words[w];
  }
  return out;
}

// A byte-level BPE's pieces of context[from, to) (a word with the whitespace before it, so that
// the pieces of all words are those of the whole context, whose pre-tokenizer never joins
// whitespace to the text before it), each with the bytes of the context it stands for, leading
// and trailing whitespace left out (the tokenizers library's trim_offsets). Where the
// normaliser changed the text (the pieces' bytes are not the context's), each piece spans the
// whole word. A piece holding part of a character (byte-level BPE splits emoji) spans all of it.
void encode_with_spans(const Tokenizer& tok, const std::string& context, size_t from, size_t to,
                       SquadExample& e) {
  const std::vector<int32_t> ids = tok.encode(std::string_view(context).substr(from, to - from));
  std::vector<std::string> bytes;
  std::string joined;
  for (int32_t id : ids) joined += bytes.emplace_back(tok.token_bytes(id));
  const bool exact = context.compare(from, to - from, joined) == 0;
  auto continuation = [&](size_t i) {
    return (static_cast<unsigned char>(context[i]) & 0xC0) == 0x80;
  };
  // (whitespace: ASCII's and SQuAD's U+202F)
  auto space_at = [&](size_t i, size_t b) -> size_t {
    if (std::isspace(static_cast<unsigned char>(context[i]))) return 1;
    return b - i >= 3 && context.compare(i, 3, "\xE2\x80\xAF") == 0 ? 3 : 0;
  };
  auto space_before = [&](size_t a, size_t b) -> size_t {
    if (std::isspace(static_cast<unsigned char>(context[b - 1]))) return 1;
    return b - a >= 3 && context.compare(b - 3, 3, "\xE2\x80\xAF") == 0 ? 3 : 0;
  };
  size_t at = from;
  for (size_t k = 0; k < ids.size(); ++k) {
    size_t a = exact ? at : from, b = exact ? at + bytes[k].size() : to;
    at += bytes[k].size();
    while (a > from && continuation(a)) --a;  // whole characters (a piece may hold part of one)
    while (b < to && continuation(b)) ++b;
    for (size_t n; a < b && (n = space_at(a, b)) > 0;) a += n;
    for (size_t n; b > a && (n = space_before(a, b)) > 0;) b -= n;
    e.pieces.push_back(ids[k]);
    e.piece_begin.push_back(static_cast<int32_t>(a));
    e.piece_end.push_back(static_cast<int32_t>(b));
  }
}

// The first and last piece of `e` that the answer's bytes [begin, begin + size) overlap, within
// [first, last] (the pieces of the words it lies in); false when none does.
bool answer_pieces(const SquadExample& e, size_t begin, size_t size, int32_t& first,
                   int32_t& last) {
  const auto end = static_cast<int32_t>(begin + size), start = static_cast<int32_t>(begin);
  int32_t s = -1, t = -1;
  for (int32_t p = first; p <= last; ++p) {
    const size_t k = static_cast<size_t>(p);
    if (e.piece_end[k] <= e.piece_begin[k]) continue;  // (whitespace)
    if (e.piece_end[k] > start && e.piece_begin[k] < end) {
      if (s < 0) s = p;
      t = p;
    }
  }
  if (s < 0) return false;
  first = s, last = t;
  return true;
}

const json& field(const json& obj, const char* key, json::value_t type, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) throw InputError(where + ": missing '" + key + "'");
  const bool ok =
      type == json::value_t::number_integer ? it->is_number_integer() : it->type() == type;
  if (!ok) throw InputError(where + "." + key + ": wrong type (" + it->type_name() + ")");
  return *it;
}

std::string at(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

// Window index whose context around piece `pos` is largest (Google's _check_is_max_context:
// score = min(left, right) + 0.01 * window length).
struct Window {
  int32_t start, length;
};
size_t max_context_window(const std::vector<Window>& windows, int32_t pos) {
  size_t best = 0;
  double best_score = -1;
  for (size_t w = 0; w < windows.size(); ++w) {
    const int32_t end = windows[w].start + windows[w].length - 1;
    if (pos < windows[w].start || pos > end) continue;
    const double score = std::min(pos - windows[w].start, end - pos) + 0.01 * windows[w].length;
    if (score > best_score) best_score = score, best = w;
  }
  return best;
}

// Google's get_final_text (Hugging Face's run_qa keeps it): the detokenised prediction is
// located in the original words after BERT's basic tokenisation (the same lower-casing and
// accent stripping the pieces had), both without spaces and counted in characters, not bytes,
// and that stretch of the original returned: "(1990s)," predicted as "1990s" reads "1990s", and
// "Zürich." predicted as "zurich" reads "Zürich". When the two differ in length (a character
// the tokenizer drops or expands) or the prediction is not found ([UNK]), the whole words.
std::string final_text(const Tokenizer& tok, const std::string& tok_text,
                       const std::string& orig_text) {
  // The characters of s other than ' ', each as its bytes, with the byte offset of each.
  auto characters = [](const std::string& s, std::vector<size_t>* at) {
    std::vector<std::string> out;
    const std::vector<size_t> cp = code_points(s);
    for (size_t k = 0; k + 1 < cp.size(); ++k) {
      if (s[cp[k]] == ' ') continue;
      out.push_back(s.substr(cp[k], cp[k + 1] - cp[k]));
      if (at) at->push_back(cp[k]);
    }
    if (at) at->push_back(s.size());
    return out;
  };
  std::string basic;
  for (const std::string& w : tok.basic_tokens(orig_text)) basic += (basic.empty() ? "" : " ") + w;
  std::vector<size_t> orig_at;
  const std::vector<std::string> orig_ns = characters(orig_text, &orig_at);
  const std::vector<std::string> basic_ns = characters(basic, nullptr);
  const std::vector<std::string> pred_ns = characters(tok_text, nullptr);
  if (orig_ns.size() != basic_ns.size() || pred_ns.empty()) return orig_text;
  const auto hit = std::search(basic_ns.begin(), basic_ns.end(), pred_ns.begin(), pred_ns.end());
  if (hit == basic_ns.end()) return orig_text;
  const size_t first = static_cast<size_t>(hit - basic_ns.begin());
  const size_t last = first + pred_ns.size() - 1;
  const size_t a = orig_at[first], b = orig_at[last] + orig_ns[last].size();
  return orig_text.substr(a, b - a);
}

std::vector<std::string> normalized_tokens(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty() && cur != "a" && cur != "an" && cur != "the") out.push_back(cur);
    cur.clear();
  };
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && std::ispunct(u)) continue;  // Python's string.punctuation
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v')
      flush();
    else
      cur += u < 0x80 ? static_cast<char>(std::tolower(u)) : c;
  }
  flush();
  return out;
}

}  // namespace

std::vector<SquadExample> read_squad(const std::string& path, bool need_answers) {
  io::require_text_input(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open for reading");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw InputError(path + ": not valid JSON (byte " + std::to_string(e.byte) + ")");
  } catch (const json::exception& e) {  // a number out of range (out_of_range.406)
    throw InputError(path + ": " + io::json_error_text(e));
  }
  if (!j.is_object()) throw InputError(path + ": expected a JSON object with 'data'");
  std::vector<SquadExample> out;
  const json& data = field(j, "data", json::value_t::array, path);
  for (size_t d = 0; d < data.size(); ++d) {
    const std::string wd = path + ": " + at("data", d);
    const json& paragraphs = field(data[d], "paragraphs", json::value_t::array, wd);
    for (size_t p = 0; p < paragraphs.size(); ++p) {
      const std::string wp = wd + "." + at("paragraphs", p);
      const std::string context =
          field(paragraphs[p], "context", json::value_t::string, wp).get<std::string>();
      const int64_t context_chars = static_cast<int64_t>(code_points(context).size()) - 1;
      const json& qas = field(paragraphs[p], "qas", json::value_t::array, wp);
      for (size_t q = 0; q < qas.size(); ++q) {
        const std::string wq = wp + "." + at("qas", q);
        SquadExample e;
        e.id = field(qas[q], "id", json::value_t::string, wq).get<std::string>();
        e.question = field(qas[q], "question", json::value_t::string, wq).get<std::string>();
        e.context = context;
        if (qas[q].contains("is_impossible")) {
          if (!qas[q]["is_impossible"].is_boolean())
            throw InputError(wq + ".is_impossible: expected true or false");
          e.impossible = qas[q]["is_impossible"].get<bool>();
        }
        if (!need_answers && !qas[q].contains("answers")) {
          out.push_back(std::move(e));
          continue;
        }
        const json& answers = field(qas[q], "answers", json::value_t::array, wq);
        if (answers.empty()) e.impossible = true;
        for (size_t a = 0; a < answers.size() && !e.impossible; ++a) {
          const std::string wa = wq + "." + at("answers", a);
          SquadAnswer ans;
          ans.text = field(answers[a], "text", json::value_t::string, wa).get<std::string>();
          ans.start =
              field(answers[a], "answer_start", json::value_t::number_integer, wa).get<int64_t>();
          const int64_t len = static_cast<int64_t>(code_points(ans.text).size()) - 1;
          if (ans.start < 0 || ans.start + len > context_chars || len == 0)
            throw InputError(wa + ": answer_start " + std::to_string(ans.start) + " + " +
                             std::to_string(len) + " characters is outside the context (" +
                             std::to_string(context_chars) + " characters)");
          e.answers.push_back(std::move(ans));
        }
        out.push_back(std::move(e));
      }
    }
  }
  if (out.empty()) throw InputError(path + ": no questions");
  return out;
}

namespace {

// The context's words and pieces into e (each piece's word, and under a byte-level BPE its byte
// span); returns each word's first piece (one more entry: the pieces' count), and each
// character's word in char_word.
std::vector<int32_t> tokenize_context(SquadExample& e, const Tokenizer& tok,
                                      std::vector<int32_t>& char_word) {
  e.pieces.clear(), e.piece_word.clear(), e.piece_begin.clear(), e.piece_end.clear();
  Words split = split_words(e.context);
  e.words = std::move(split.words);
  char_word = std::move(split.char_word);
  std::vector<int32_t> word_first(e.words.size() + 1);
  for (size_t w = 0; w < e.words.size(); ++w) {
    word_first[w] = static_cast<int32_t>(e.pieces.size());
    if (tok.byte_level())
      encode_with_spans(tok, e.context, w == 0 ? 0 : split.word_end[w - 1], split.word_end[w], e);
    else
      for (int32_t id : tok.encode(e.words[w])) e.pieces.push_back(id);
    e.piece_word.resize(e.pieces.size(), static_cast<int32_t>(w));
  }
  word_first[e.words.size()] = static_cast<int32_t>(e.pieces.size());
  return word_first;
}

// The first answer's pieces [tok_start, tok_end] of the context; false when its text cannot be
// found there (the example is then skipped, as Google's and Hugging Face's scripts do).
bool locate_answer(const SquadExample& e, const Tokenizer& tok,
                   const std::vector<int32_t>& char_word, const std::vector<int32_t>& word_first,
                   int32_t& tok_start, int32_t& tok_end) {
  const SquadAnswer& a = e.answers[0];
  const int64_t len = static_cast<int64_t>(code_points(a.text).size()) - 1;
  const int32_t sw = std::max(char_word[a.start], 0);
  const int32_t ew = char_word[a.start + len - 1];
  std::vector<std::string> answer_words = split_words(a.text).words;
  if (ew < sw || answer_words.empty() ||
      join(e.words, sw, ew).find(join(answer_words, 0, answer_words.size() - 1)) ==
          std::string::npos)
    return false;
  tok_start = word_first[sw];
  tok_end = word_first[ew + 1] - 1;
  if (tok.byte_level())  // the pieces the answer's bytes overlap (Hugging Face's run_qa)
    return answer_pieces(e, code_points(e.context)[static_cast<size_t>(a.start)], a.text.size(),
                         tok_start, tok_end);
  // Tighten to the tokenised answer (Google's _improve_answer_span): "1895" in "(1895)".
  const std::vector<int32_t> want = tok.encode(a.text);
  for (int32_t s = tok_start; s <= tok_end; ++s)
    for (int32_t t = tok_end; t >= s; --t)
      if (static_cast<size_t>(t - s + 1) == want.size() &&
          std::equal(want.begin(), want.end(), e.pieces.begin() + s)) {
        tok_start = s, tok_end = t;
        return true;
      }
  return true;
}

// The windows of max_doc pieces over n, doc_stride apart, the last ending at n.
std::vector<Window> windows_of(int32_t n, int32_t max_doc, int32_t doc_stride) {
  std::vector<Window> windows;
  for (int32_t start = 0; start < n;) {
    const int32_t length = std::min(n - start, max_doc);
    windows.push_back({start, length});
    if (start + length == n) break;
    start += std::min(length, doc_stride);
  }
  return windows;
}

}  // namespace

SquadFeatures squad_features(std::vector<SquadExample>& examples, const Tokenizer& tok,
                             const SquadOptions& o, bool training) {
  const Vocab& v = tok.vocab();
  SquadFeatures out;
  for (size_t i = 0; i < examples.size(); ++i) {
    SquadExample& e = examples[i];
    std::vector<int32_t> char_word;
    const std::vector<int32_t> word_first = tokenize_context(e, tok, char_word);
    int32_t tok_start = -1, tok_end = -1;  // (an unanswerable question: every window at [CLS])
    if (training && !e.impossible &&
        !locate_answer(e, tok, char_word, word_first, tok_start, tok_end)) {
      ++out.unanswerable;
      continue;
    }
    std::vector<int32_t> query = tok.encode(e.question);
    if (static_cast<int>(query.size()) > o.max_query_length) query.resize(o.max_query_length);
    const int32_t max_doc = o.max_seq_len - static_cast<int32_t>(query.size()) - 3;
    if (max_doc < 1)
      throw InputError("`max_seq_len` " + std::to_string(o.max_seq_len) +
                       " leaves no room for the context after a " + std::to_string(query.size()) +
                       "-token question (lower `max_query_length`)");
    const std::vector<Window> windows =
        windows_of(static_cast<int32_t>(e.pieces.size()), max_doc, o.doc_stride);
    for (size_t w = 0; w < windows.size(); ++w) {
      SquadFeature f;
      f.example = static_cast<int64_t>(i);
      f.tokens.push_back(v.cls());
      f.tokens.insert(f.tokens.end(), query.begin(), query.end());
      f.tokens.push_back(v.sep());
      f.doc_offset = static_cast<int32_t>(f.tokens.size());
      f.doc_first = windows[w].start;
      for (int32_t k = 0; k < windows[w].length; ++k) {
        const int32_t piece = windows[w].start + k;
        f.tokens.push_back(e.pieces[piece]);
        f.max_context.push_back(max_context_window(windows, piece) == w);
      }
      f.tokens.push_back(v.sep());
      if (training && tok_start >= windows[w].start &&
          tok_end < windows[w].start + windows[w].length) {
        f.start = tok_start - windows[w].start + f.doc_offset;
        f.end = tok_end - windows[w].start + f.doc_offset;
      }
      out.features.push_back(std::move(f));
    }
  }
  return out;
}

std::vector<std::string> squad_predictions(const std::vector<SquadExample>& examples,
                                           const std::vector<SquadFeature>& features,
                                           const std::vector<std::vector<float>>& logits,
                                           const Tokenizer& tok, const SquadOptions& o,
                                           std::vector<double>* null_odds) {
  // An example's best span over all its windows, and (apart from it, so that a new best span
  // never resets it) its null score: the lowest [CLS] start + end over the same windows.
  struct Best {
    double score = -1e300;
    int64_t feature = -1;
    int32_t start = 0, end = 0;
  };
  std::vector<double> null(examples.size(), 1e300);
  std::vector<Best> best(examples.size());
  for (size_t f = 0; f < features.size(); ++f) {
    const SquadFeature& ft = features[f];
    const int L = static_cast<int>(ft.tokens.size());
    const std::vector<float>& lg = logits[f];
    null[ft.example] =
        std::min(null[ft.example], static_cast<double>(lg[0]) + static_cast<double>(lg[1]));
    auto top = [&](int e) {
      std::vector<int> idx(L);
      for (int i = 0; i < L; ++i) idx[i] = i;
      const int k = std::min(o.n_best, L);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return lg[2 * a + e] > lg[2 * b + e] || (lg[2 * a + e] == lg[2 * b + e] && a < b);
      });
      idx.resize(k);
      return idx;
    };
    const int doc_end = L - 1;  // the final [SEP]
    for (int s : top(0)) {
      if (s < ft.doc_offset || s >= doc_end || !ft.max_context[s - ft.doc_offset]) continue;
      for (int t : top(1)) {
        if (t < s || t >= doc_end || t - s + 1 > o.max_answer_length) continue;
        const double score = static_cast<double>(lg[2 * s]) + lg[2 * t + 1];
        Best& b = best[ft.example];
        if (score > b.score) b = {score, static_cast<int64_t>(f), s, t};
      }
    }
  }
  if (null_odds) {
    null_odds->assign(examples.size(), 0);
    for (size_t i = 0; i < examples.size(); ++i)
      if (null[i] < 1e300) (*null_odds)[i] = null[i] - (best[i].feature < 0 ? 0 : best[i].score);
  }
  std::vector<std::string> out(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    if (best[i].feature < 0) continue;
    if (o.v2 && null[i] > best[i].score + o.null_score_diff_threshold) continue;  // ""
    const SquadFeature& ft = features[best[i].feature];
    const SquadExample& e = examples[i];
    const int32_t ps = ft.doc_first + best[i].start - ft.doc_offset;
    const int32_t pe = ft.doc_first + best[i].end - ft.doc_offset;
    if (!e.piece_begin.empty()) {  // the context's own bytes from the first piece to the last
      const int32_t a = e.piece_begin[static_cast<size_t>(ps)];
      const int32_t b = e.piece_end[static_cast<size_t>(pe)];
      if (b > a) out[i] = e.context.substr(static_cast<size_t>(a), static_cast<size_t>(b - a));
      continue;
    }
    std::string tok_text;
    for (int32_t p = ps; p <= pe; ++p) {
      const std::string& piece = tok.vocab().token(e.pieces[p]);
      if (piece.rfind("##", 0) == 0) {
        tok_text += piece.substr(2);
      } else {
        if (p > ps) tok_text += ' ';
        tok_text += piece;
      }
    }
    out[i] = final_text(tok, tok_text, join(e.words, e.piece_word[ps], e.piece_word[pe]));
  }
  return out;
}

std::string squad_normalize(const std::string& text) {
  std::vector<std::string> t = normalized_tokens(text);
  return t.empty() ? std::string() : join(t, 0, t.size() - 1);
}

double squad_exact_match(const std::string& prediction, const std::string& truth) {
  return squad_normalize(prediction) == squad_normalize(truth) ? 1.0 : 0.0;
}

double squad_f1(const std::string& prediction, const std::string& truth) {
  std::vector<std::string> p = normalized_tokens(prediction), g = normalized_tokens(truth);
  std::map<std::string, int> count;
  for (const auto& w : g) ++count[w];
  int same = 0;
  for (const auto& w : p)
    if (count[w]-- > 0) ++same;
  if (same == 0) return 0.0;
  const double precision = static_cast<double>(same) / static_cast<double>(p.size());
  const double recall = static_cast<double>(same) / static_cast<double>(g.size());
  return 2 * precision * recall / (precision + recall);
}

bool squad_has_unanswerable(const std::vector<SquadExample>& examples) {
  for (const SquadExample& e : examples)
    if (e.impossible) return true;
  return false;
}

namespace {

// The official v2.0 script's compute_f1: an empty answer or prediction scores 1 only against
// an empty one.
double squad_v2_f1(const std::string& prediction, const std::string& truth) {
  const std::vector<std::string> p = normalized_tokens(prediction), g = normalized_tokens(truth);
  if (p.empty() || g.empty()) return p == g ? 1.0 : 0.0;
  return squad_f1(prediction, truth);
}

// The official v2.0 evaluation (get_raw_scores, make_eval_dict): every question, its gold
// answers those that normalise to something (else the one answer ""), exact and F1 the best
// over them; the totals also split by whether the question has an answer.
SquadScore squad_v2_score(const std::vector<SquadExample>& examples,
                          const std::vector<std::string>& predictions) {
  SquadScore s;
  s.v2 = true;
  for (size_t i = 0; i < examples.size(); ++i) {
    std::vector<std::string> gold;
    for (const SquadAnswer& a : examples[i].answers)
      if (!examples[i].impossible && !squad_normalize(a.text).empty()) gold.push_back(a.text);
    const bool has = !gold.empty();
    if (!has) gold.push_back("");
    double em = 0, f1 = 0;
    for (const std::string& g : gold) {
      em = std::max(em, squad_exact_match(predictions[i], g));
      f1 = std::max(f1, squad_v2_f1(predictions[i], g));
    }
    s.exact_match += em, s.f1 += f1, ++s.total;
    if (has)
      s.has_exact += em, s.has_f1 += f1, ++s.has_total;
    else
      s.no_exact += em, s.no_f1 += f1, ++s.no_total;
  }
  auto percent = [](double& v, int64_t n) { v = n ? 100.0 * v / static_cast<double>(n) : 0; };
  percent(s.exact_match, s.total), percent(s.f1, s.total);
  percent(s.has_exact, s.has_total), percent(s.has_f1, s.has_total);
  percent(s.no_exact, s.no_total), percent(s.no_f1, s.no_total);
  return s;
}

}  // namespace

SquadScore squad_score(const std::vector<SquadExample>& examples,
                       const std::vector<std::string>& predictions) {
  if (squad_has_unanswerable(examples)) return squad_v2_score(examples, predictions);
  SquadScore s;
  int64_t n = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    if (examples[i].answers.empty()) continue;
    double em = 0, f1 = 0;
    for (const SquadAnswer& a : examples[i].answers) {
      em = std::max(em, squad_exact_match(predictions[i], a.text));
      f1 = std::max(f1, squad_f1(predictions[i], a.text));
    }
    s.exact_match += em;
    s.f1 += f1;
    ++n;
  }
  if (n > 0)
    s.exact_match *= 100.0 / static_cast<double>(n), s.f1 *= 100.0 / static_cast<double>(n);
  return s;
}

}  // namespace packbert::data
