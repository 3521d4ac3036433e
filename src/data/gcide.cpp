#include "data/gcide.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "data/corpus.h"
#include "data/utf8.h"
#include "error.h"
#include "io/input_file.h"

namespace packbert::data {

namespace {

int64_t dictd_b64(const std::string& s, const std::string& path, int line) {
  static const std::string digits =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  int64_t v = 0;
  for (char c : s) {
    size_t d = digits.find(c);
    if (d == std::string::npos || s.empty())
      throw InputError(path + ":" + std::to_string(line) + ": bad offset field '" + s + "'");
    v = v * 64 + static_cast<int64_t>(d);
  }
  return v;
}

std::string gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw InputError(path + ": cannot open (install dict-gcide: make setup)");
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  bool bad = n < 0;
  gzclose(f);
  if (bad) throw InputError(path + ": corrupt gzip/dictzip data");
  return out;
}

bool is_source_tag(const std::string& inner) {
  for (const char* tag : {"Webster", "WordNet", "PJC", "Century", "Note", "Obs", "R.", "Chambers"})
    if (inner.find(tag) != std::string::npos) return true;
  return false;
}

// One entry's text → plain paragraphs.
std::string clean_entry(const std::string& raw) {
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c == '{' || c == '}') continue;
    if (c == '\\') {  // \pronunciation\ : skip to the closing backslash on this line
      size_t j = raw.find_first_of("\\\n", i + 1);
      if (j != std::string::npos && raw[j] == '\\') {
        i = j;
        continue;
      }
      continue;
    }
    if (c == '[') {
      size_t j = raw.find(']', i + 1);
      if (j != std::string::npos && j - i <= 60) {
        std::string inner = raw.substr(i + 1, j - i - 1);
        bool escape = inner.size() <= 4 && inner.find(' ') == std::string::npos;
        if (escape) {  // accent escape like [a^] or [ae]: keep the letters
          for (char ch : inner)
            if (std::isalpha(static_cast<unsigned char>(ch))) out += ch;
          i = j;
          continue;
        }
        if (is_source_tag(inner)) {
          i = j;
          continue;
        }
      }
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string gcide_to_text(const std::string& index_path, const std::string& dict_path,
                          size_t* entries) {
  io::require_regular_file(index_path);
  io::require_regular_file(dict_path);
  std::ifstream idx(index_path, std::ios::binary);
  if (!idx) throw InputError(index_path + ": cannot open (install dict-gcide: make setup)");
  std::string data = gunzip(dict_path);
  std::set<std::pair<int64_t, int64_t>> seen;
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::string line;
  int line_no = 0;
  while (std::getline(idx, line)) {
    ++line_no;
    size_t a = line.find('\t'), b = line.rfind('\t');
    if (a == std::string::npos || a == b)
      throw InputError(index_path + ":" + std::to_string(line_no) +
                       ": expected 'headword<TAB>offset<TAB>length'");
    if (line.rfind("00-", 0) == 0 || line.rfind("00database", 0) == 0) continue;
    int64_t off = dictd_b64(line.substr(a + 1, b - a - 1), index_path, line_no);
    int64_t len = dictd_b64(line.substr(b + 1), index_path, line_no);
    if (off < 0 || len < 0 || off + len > static_cast<int64_t>(data.size()))
      throw InputError(index_path + ":" + std::to_string(line_no) +
                       ": entry outside the dictionary data");
    if (seen.insert({off, len}).second) spans.push_back({off, len});
  }
  std::sort(spans.begin(), spans.end());
  std::string out;
  size_t n = 0;
  for (auto [off, len] : spans) {
    // A few entries of Debian's GCIDE hold Windows-1252 bytes (0x92 for ’): repaired to UTF-8.
    std::string text = repair_cp1252_bytes(
        clean_entry(data.substr(static_cast<size_t>(off), static_cast<size_t>(len))));
    // Paragraphs are separated by blank lines inside an entry; sentences are split per paragraph.
    std::istringstream in(text);
    std::string paragraph, l, doc;
    auto flush = [&] {
      for (const std::string& s : split_sentences(paragraph)) doc += s + "\n";
      paragraph.clear();
    };
    while (std::getline(in, l)) {
      size_t p = l.find_first_not_of(" \t\r");
      if (p == std::string::npos) {
        flush();
        continue;
      }
      if (!paragraph.empty()) paragraph += ' ';
      paragraph.append(l, p, std::string::npos);
    }
    flush();
    if (doc.empty()) continue;
    out += doc;
    out += "\n";
    ++n;
  }
  if (entries) *entries = n;
  return out;
}

void gcide_pos_tsv(const std::string& corpus_text, std::string& train, std::string& dev) {
  train = dev = "label\tsentence\n";
  std::istringstream in(corpus_text);
  std::string line;
  bool first = true;
  size_t n = 0;
  while (std::getline(in, line)) {
    if (line.empty()) {
      first = true;
      continue;
    }
    if (!first) continue;
    first = false;
    // "Headword ..., pos. Definition": the first part-of-speech marker within the head.
    static const std::pair<const char*, const char*> kPos[] = {
        {" n. ", "n"},     {" v. t. ", "v"}, {" v. i. ", "v"}, {" v. ", "v"},
        {" adj. ", "adj"}, {" a. ", "adj"},  {" adv. ", "adv"}};
    size_t best = std::string::npos;
    const char* label = nullptr;
    size_t marker = 0;
    for (auto [m, l] : kPos) {
      size_t at = line.find(m);
      if (at != std::string::npos && at < 60 && at < best)
        best = at, label = l, marker = std::strlen(m);
    }
    if (!label) continue;
    std::string text = line.substr(best + marker);
    // Drop a leading sense number ("1. ") and anything that is not the definition's words.
    while (!text.empty() &&
           (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.' || text[0] == ' '))
      text.erase(text.begin());
    for (char& c : text)
      if (c == '\t') c = ' ';
    if (text.size() < 8) continue;
    if (text.size() > 300) text.resize(300);
    ((n++ % 10 == 9) ? dev : train) += std::string(label) + "\t" + text + "\n";
  }
}

}  // namespace packbert::data
