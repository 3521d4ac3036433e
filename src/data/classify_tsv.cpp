#include "data/classify_tsv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>

#include "data/utf8.h"
#include "error.h"
#include "io/input_file.h"

namespace packbert::data {

namespace {

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == '\t')
      out.push_back(std::move(cur)), cur.clear();
    else if (c != '\r')
      cur += c;
  }
  out.push_back(std::move(cur));
  return out;
}

}  // namespace

std::vector<ClassifyExample> read_classification_tsv(const std::string& path, const Tokenizer& tok,
                                                     int max_seq_len,
                                                     std::map<std::string, int32_t>& labels,
                                                     bool grow_labels) {
  io::require_text_input(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open for reading");
  std::string line;
  if (!std::getline(in, line)) throw InputError(path + ": empty file (expected a header line)");
  size_t offset = line.size() + 1;  // of the next line in the file
  check_utf8(line, path + ":1");
  std::vector<std::string> head = split_tabs(line);
  auto col = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      for (size_t i = 0; i < head.size(); ++i)
        if (head[i] == n) return static_cast<int>(i);
    return -1;
  };
  const int c_label = col({"label"}), c_a = col({"sentence", "sentence1", "text", "text_a"}),
            c_b = col({"sentence2", "text_b"});
  if (c_label < 0 || c_a < 0)
    throw InputError(
        path + ":1: header needs a 'label' and a 'sentence' (or sentence1/text/text_a) column");
  std::vector<ClassifyExample> out;
  int line_no = 1;
  const Vocab& v = tok.vocab();
  while (std::getline(in, line)) {
    ++line_no;
    check_utf8(line, path + ":" + std::to_string(line_no), offset);
    offset += line.size() + 1;
    if (line.empty() || line == "\r") continue;
    std::vector<std::string> f = split_tabs(line);
    const int need = std::max({c_label, c_a, c_b});
    if (static_cast<int>(f.size()) <= need)
      throw InputError(path + ":" + std::to_string(line_no) + ": " + std::to_string(f.size()) +
                       " columns, the header has " + std::to_string(head.size()));
    auto it = labels.find(f[c_label]);
    if (it == labels.end()) {
      if (!grow_labels)
        throw InputError(path + ":" + std::to_string(line_no) + ": label '" + f[c_label] +
                         "' is not one of the model's labels");
      it = labels.emplace(f[c_label], static_cast<int32_t>(labels.size())).first;
    }
    std::vector<int32_t> a = tok.encode(f[c_a]), b;
    if (c_b >= 0) b = tok.encode(f[c_b]);
    const size_t budget = static_cast<size_t>(max_seq_len) - (c_b >= 0 ? 3 : 2);
    while (a.size() + b.size() > budget) (a.size() > b.size() ? a : b).pop_back();
    ClassifyExample e;
    e.label = it->second;
    e.tokens.push_back(v.cls());
    e.tokens.insert(e.tokens.end(), a.begin(), a.end());
    e.tokens.push_back(v.sep());
    e.b_start = static_cast<int32_t>(e.tokens.size());
    if (c_b >= 0) {
      e.tokens.insert(e.tokens.end(), b.begin(), b.end());
      e.tokens.push_back(v.sep());
    }
    out.push_back(std::move(e));
  }
  if (out.empty()) throw InputError(path + ": no examples");
  return out;
}

std::map<std::string, int32_t> sorted_label_ids(const std::map<std::string, int32_t>& seen) {
  std::vector<std::pair<double, std::string>> numbers;
  bool numeric = true;
  for (const auto& [name, id] : seen) {
    double v = 0;
    const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
    numeric = numeric && ec == std::errc() && end == name.data() + name.size() && std::isfinite(v);
    numbers.push_back({v, name});
  }
  std::map<std::string, int32_t> ids;
  if (numeric) {  // (a map is in string order already)
    std::sort(numbers.begin(), numbers.end());
    for (const auto& [v, name] : numbers) ids.emplace(name, static_cast<int32_t>(ids.size()));
  } else {
    for (const auto& [name, id] : seen) ids.emplace(name, static_cast<int32_t>(ids.size()));
  }
  return ids;
}

void relabel(std::vector<ClassifyExample>& examples, const std::map<std::string, int32_t>& from,
             const std::map<std::string, int32_t>& to, const std::string& source) {
  std::vector<int32_t> id_of(from.size(), -1);
  for (const auto& [name, id] : from) {
    auto it = to.find(name);
    if (it == to.end())
      throw InputError(source + ": label '" + name + "' is not one of the model's labels");
    id_of[static_cast<size_t>(id)] = it->second;
  }
  for (ClassifyExample& e : examples) e.label = id_of[static_cast<size_t>(e.label)];
}

}  // namespace packbert::data
