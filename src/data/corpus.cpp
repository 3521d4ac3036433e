#include "data/corpus.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>

#include "data/utf8.h"
#include "error.h"
#include "io/input_file.h"

namespace packbert::data {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return std::string(s.substr(a, b - a));
}

const std::set<std::string, std::less<>>& abbreviations() {
  static const std::set<std::string, std::less<>> a = {
      "mr",  "mrs", "ms",  "dr",     "prof", "sr",   "jr",  "st",  "vs",  "etc", "e.g",  "i.e",
      "cf",  "al",  "inc", "ltd",    "co",   "corp", "no",  "nos", "vol", "fig", "figs", "p",
      "pp",  "ed",  "eds", "approx", "dept", "est",  "gen", "gov", "lt",  "col", "capt", "sgt",
      "rev", "mt",  "jan", "feb",    "mar",  "apr",  "jun", "jul", "aug", "sep", "sept", "oct",
      "nov", "dec", "a.m", "p.m",    "u.s",  "u.k",  "ca",  "viz", "esp", "lit", "pl",   "sing",
      "adj", "adv", "n",   "v",      "prep", "conj", "obs", "syn", "see"};
  return a;
}

}  // namespace

std::vector<std::string> split_sentences(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c != '.' && c != '!' && c != '?') continue;
    size_t end = i + 1;
    while (end < text.size() &&
           (text[end] == '"' || text[end] == '\'' || text[end] == ')' || text[end] == ']' ||
            text[end] == '.' || text[end] == '!' || text[end] == '?'))
      ++end;
    if (end >= text.size() || !is_space(text[end])) continue;
    size_t next = end;
    while (next < text.size() && is_space(text[next])) ++next;
    if (next >= text.size()) break;
    unsigned char n = static_cast<unsigned char>(text[next]);
    if (!(std::isupper(n) || std::isdigit(n) || n == '"' || n == '\'' || n == '(' || n == '[' ||
          n >= 0x80))
      continue;
    if (c == '.') {  // the word before the dot: an abbreviation or an initial does not end it
      size_t w = i;
      while (w > start && !is_space(text[w - 1])) --w;
      std::string word(text.substr(w, i - w));
      while (!word.empty() && (word.front() == '(' || word.front() == '"' || word.front() == '\''))
        word.erase(word.begin());
      std::string lower = word;
      for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (word.size() == 1 && std::isalpha(static_cast<unsigned char>(word[0]))) continue;
      if (abbreviations().count(lower)) continue;
    }
    std::string s = trim(text.substr(start, end - start));
    if (!s.empty()) out.push_back(std::move(s));
    start = next;
    i = next - 1;
  }
  std::string tail = trim(text.substr(std::min(start, text.size())));
  if (!tail.empty()) out.push_back(std::move(tail));
  return out;
}

std::vector<Document> read_corpus(const std::vector<std::string>& paths, const Tokenizer& tok,
                                  const CorpusOptions& options, size_t* skipped_lines) {
  const bool split = options.split_sentences;
  size_t skipped = 0;
  // First the sentences as text, with document boundaries; then tokenize them in parallel.
  std::vector<std::string> sentences;
  std::vector<size_t> doc_start;  // index of each document's first sentence
  for (const std::string& path : paths) {
    io::require_text_input(path);
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError(path + ": cannot open for reading");
    std::string line, paragraph;
    bool open = false;
    auto close_doc = [&] {
      if (split && !paragraph.empty()) {
        for (std::string& s : split_sentences(paragraph)) sentences.push_back(std::move(s));
        paragraph.clear();
      }
      open = false;
    };
    size_t offset = 0, line_no = 0;  // of the line in the file
    while (std::getline(in, line)) {
      const size_t line_offset = offset;
      offset += line.size() + 1;
      ++line_no;
      if (invalid_utf8_offset(line) != kValidUtf8) {
        if (options.skip_invalid_utf8) {
          ++skipped;
          continue;
        }
        check_utf8(line, path + ":" + std::to_string(line_no), line_offset);
      }
      std::string t = trim(line);
      if (t.empty()) {
        close_doc();
        continue;
      }
      if (!open) doc_start.push_back(sentences.size()), open = true;
      if (split)
        (paragraph.empty() ? paragraph : paragraph += ' ') += t;
      else
        sentences.push_back(std::move(t));
    }
    if (in.bad()) throw InputError(path + ": read failed");
    close_doc();
  }
  if (skipped_lines) *skipped_lines = skipped;
  std::vector<Sentence> ids(sentences.size());
#pragma omp parallel for schedule(dynamic, 256)
  for (size_t i = 0; i < sentences.size(); ++i) ids[i] = tok.encode(sentences[i]);
  std::vector<Document> docs;
  doc_start.push_back(sentences.size());
  for (size_t d = 0; d + 1 < doc_start.size(); ++d) {
    Document doc;
    for (size_t s = doc_start[d]; s < doc_start[d + 1]; ++s)
      if (!ids[s].empty()) doc.push_back(std::move(ids[s]));
    if (!doc.empty()) docs.push_back(std::move(doc));
  }
  return docs;
}

}  // namespace packbert::data
