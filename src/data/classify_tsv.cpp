#include "data/classify_tsv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

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

// A classification file's header and rows, one row at a time: TSV (tabs, no quoting, as GLUE's
// files are), CSV (RFC 4180: fields in double quotes may hold commas, newlines and doubled quotes)
// or JSONL (an object a line, its keys the columns in the first line's order), by extension.
class RowReader {
 public:
  explicit RowReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    io::require_text_input(path);
    if (!in_) throw InputError(path + ": cannot open for reading");
    format_ = path.ends_with(".csv")                                ? Format::csv
              : path.ends_with(".jsonl") || path.ends_with(".json") ? Format::jsonl
                                                                    : Format::tsv;
    std::string line;
    if (!read_line(line)) throw InputError(path + ": empty file (expected a header line)");
    if (format_ == Format::jsonl) {
      const nlohmann::json j = parse_object(line);
      for (const auto& [k, v] : j.items()) head_.push_back(k);
      first_ = line;
    } else {
      head_ = split(line);
      // GLUE's own CoLA files have no header: source, label (0/1), the author's judgment ("*" or
      // nothing), sentence. Such a first line is a row, read under those names.
      if (format_ == Format::tsv && head_.size() == 4 && (head_[1] == "0" || head_[1] == "1") &&
          (head_[2].empty() || head_[2] == "*")) {
        head_ = {"cola_source", "label", "cola_judgment", "sentence"};
        first_ = line;
      }
    }
  }
  const std::vector<std::string>& head() const { return head_; }
  int line() const { return row_line_; }
  // The next row's fields (false at the end); blank lines are skipped.
  bool next(std::vector<std::string>& fields) {
    std::string line;
    if (!first_.empty()) {
      line = std::move(first_), first_.clear();
      row_line_ = 1;
    } else {
      do {
        if (!read_line(line)) return false;
      } while (line.empty() || line == "\r");
      row_line_ = line_no_;
    }
    if (format_ != Format::jsonl) {
      fields = split(line);
      return true;
    }
    const nlohmann::json j = parse_object(line);
    fields.clear();
    for (const std::string& k : head_) {
      if (!j.contains(k))
        throw InputError(where() + ": no \"" + k + "\" (the first line's keys are the columns)");
      const nlohmann::json& v = j[k];
      // A column holds a scalar; an array or object (a label nested 100,000 deep among them) is
      // refused before anything walks it.
      if (v.is_structured())
        throw InputError(where() + ": \"" + k + "\" is a JSON " +
                         (v.is_array() ? "array" : "object") +
                         "; a column holds a string, number or boolean");
      fields.push_back(v.is_string() ? v.get<std::string>() : v.dump());
    }
    return true;
  }

 private:
  enum class Format { tsv, csv, jsonl };
  std::string where() const { return path_ + ":" + std::to_string(row_line_); }
  bool read_line(std::string& line) {
    if (!std::getline(in_, line)) return false;
    ++line_no_;
    check_utf8(line, path_ + ":" + std::to_string(line_no_), offset_);
    offset_ += line.size() + 1;
    return true;
  }
  nlohmann::json parse_object(const std::string& line) {
    row_line_ = line_no_;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw InputError(path_ + ":" + std::to_string(line_no_) + ": not a JSON object");
    return j;
  }
  std::vector<std::string> split(std::string line) {
    if (format_ == Format::tsv) return split_tabs(line);
    std::vector<std::string> out;
    std::string cur;
    bool quoted = false;
    for (size_t i = 0;; ++i) {
      if (i == line.size()) {
        if (!quoted) break;
        std::string more;  // a quoted field goes on past the line's end
        if (!read_line(more))
          throw InputError(path_ + ":" + std::to_string(row_line_) + ": a quoted field never ends");
        line += "\n" + more;
      }
      const char c = line[i];
      if (quoted) {
        if (c != '"')
          cur += c;
        else if (i + 1 < line.size() && line[i + 1] == '"')
          cur += '"', ++i;
        else
          quoted = false;
      } else if (c == '"') {
        quoted = true;
      } else if (c == ',') {
        out.push_back(std::move(cur)), cur.clear();
      } else if (c != '\r') {
        cur += c;
      }
    }
    out.push_back(std::move(cur));
    return out;
  }

  std::string path_;
  std::ifstream in_;
  Format format_ = Format::tsv;
  std::vector<std::string> head_;
  std::string first_;  // JSONL: the first line is a row as well as the header
  int line_no_ = 0, row_line_ = 0;
  size_t offset_ = 0;
};

struct ColumnRoles {
  int label = -1, a = -1, b = -1;
};

// The GLUE tasks' layouts, and a few common ones: the text pair (or single text) by header name,
// first match wins (QNLI's question + sentence before SST-2's sentence alone).
constexpr std::pair<const char*, const char*> kTextColumns[] = {
    {"question", "sentence"},    // QNLI
    {"question1", "question2"},  // QQP
    {"#1 String", "#2 String"},  // MRPC
    {"sentence1", "sentence2"},  // RTE, WNLI, MNLI, STS-B
    {"premise", "hypothesis"},   // NLI datasets
    {"text_a", "text_b"},        // Google BERT's InputExample
    {"sentence", "sentence2"},  {"text", "text_b"}, {"sentence", nullptr},  // SST-2, CoLA
    {"text", nullptr},                                                      // most others
    {"sentence1", nullptr},     {"text_a", nullptr}};
constexpr const char* kLabelColumns[] = {"label", "gold_label", "Quality", "is_duplicate",
                                         "score"};  // score: STS-B's similarity (regression)
// Columns the GLUE files carry that are neither text nor label (ids, genres, parses, the
// annotators' individual labels).
bool ignorable(const std::string& name) {
  static const char* const kNames[] = {
      "index",     "idx",      "id",          "qid1",         "qid2",     "#1 ID",
      "#2 ID",     "promptID", "pairID",      "genre",        "filename", "year",
      "old_index", "source1",  "source2",     "label1",       "label2",   "label3",
      "label4",    "label5",   "cola_source", "cola_judgment"};
  for (const char* n : kNames)
    if (name == n) return true;
  return name.ends_with("_parse");
}

ColumnRoles column_roles(const std::vector<std::string>& head, const TsvColumns& given,
                         const std::string& path) {
  auto find = [&](const std::string& name) {
    for (size_t i = 0; i < head.size(); ++i)
      if (head[i] == name) return static_cast<int>(i);
    return -1;
  };
  ColumnRoles r;
  if (!given.text.empty() || !given.label.empty()) {  // the user's names; other columns unused
    auto need = [&](const std::string& name, const char* what) {
      const int i = find(name);
      if (i < 0)
        throw InputError(path + ":1: no column '" + name + "' (" + what + ") in the header");
      return i;
    };
    if (given.read_labels || !given.label.empty())
      r.label = need(given.label.empty() ? "label" : given.label, "`label_column`");
    if (given.text.empty()) throw InputError(path + ": `label_column` needs `text_columns` too");
    r.a = need(given.text[0], "`text_columns`");
    if (given.text.size() > 1) r.b = need(given.text[1], "`text_columns`");
    return r;
  }
  for (const char* l : kLabelColumns)
    if ((r.label = find(l)) >= 0) break;
  if (r.label < 0 && given.read_labels)
    throw InputError(path +
                     ":1: header needs a label column (label, gold_label, Quality, "
                     "is_duplicate or score), or give `label_column`");
  for (const auto& [a, b] : kTextColumns) {
    const int ia = find(a), ib = b ? find(b) : -1;
    if (ia >= 0 && (!b || ib >= 0)) {
      r.a = ia, r.b = ib;
      break;
    }
  }
  if (r.a < 0)
    throw InputError(path +
                     ":1: header needs a text column (sentence, text, sentence1/sentence2, "
                     "question/sentence, question1/question2, ...), or give "
                     "`text_columns`");
  // Every other column must be one known to carry nothing to learn from: a text column read
  // by no one would be a silent loss.
  for (size_t i = 0; i < head.size(); ++i) {
    const int c = static_cast<int>(i);
    if (c == r.label || c == r.a || c == r.b || ignorable(head[i])) continue;
    throw InputError(path + ":1: column '" + head[i] + "' is neither the text (" + head[r.a] +
                     (r.b >= 0 ? ", " + head[r.b] : std::string()) + ")" +
                     (r.label >= 0 ? ", the label (" + head[r.label] + ")" : std::string()) +
                     " nor a column known to be ignorable; name the columns with "
                     "`text_columns` A[,B]" +
                     (given.read_labels ? " and `label_column` L" : ""));
  }
  return r;
}

}  // namespace

std::vector<ClassifyExample> read_classification_tsv(const std::string& path, const Tokenizer& tok,
                                                     int max_seq_len,
                                                     std::map<std::string, int32_t>& labels,
                                                     bool grow_labels, const TsvColumns& columns) {
  RowReader rows(path);
  const std::vector<std::string>& head = rows.head();
  const ColumnRoles roles = column_roles(head, columns, path);
  const int c_label = roles.label, c_a = roles.a, c_b = roles.b;
  std::vector<ClassifyExample> out;
  const Vocab& v = tok.vocab();
  for (std::vector<std::string> f; rows.next(f);) {
    const int line_no = rows.line();
    const int need = std::max({c_label, c_a, c_b});
    if (static_cast<int>(f.size()) <= need)
      throw InputError(path + ":" + std::to_string(line_no) + ": " + std::to_string(f.size()) +
                       " columns, the header has " + std::to_string(head.size()));
    int32_t label = -1;
    if (columns.read_labels) {
      auto it = labels.find(f[c_label]);
      if (it == labels.end()) {
        if (!grow_labels)
          throw InputError(path + ":" + std::to_string(line_no) + ": label '" + f[c_label] +
                           "' is not one of the model's labels");
        it = labels.emplace(f[c_label], static_cast<int32_t>(labels.size())).first;
      }
      label = it->second;
    }
    std::vector<int32_t> a = tok.encode(f[c_a]), b;
    if (c_b >= 0) b = tok.encode(f[c_b]);
    const size_t budget = static_cast<size_t>(max_seq_len) - (c_b >= 0 ? 3 : 2);
    while (a.size() + b.size() > budget) (a.size() > b.size() ? a : b).pop_back();
    ClassifyExample e;
    e.label = label;
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

std::string glue_task(const std::string& path, const TsvColumns& columns) {
  static const char* const kTasks[] = {"cola", "sst2", "mrpc", "qqp", "stsb",
                                       "mnli", "qnli", "rte",  "wnli"};
  if (!columns.task_name.empty()) {
    for (const char* t : kTasks)
      if (columns.task_name == t) return t;
    throw InputError("`task_name` '" + columns.task_name +
                     "' is not a GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli)");
  }
  const RowReader rows(path);
  const std::vector<std::string>& head = rows.head();
  auto has = [&](const char* name) {
    return std::find(head.begin(), head.end(), name) != head.end();
  };
  if (has("Quality") && has("#1 String")) return "mrpc";
  if (has("is_duplicate")) return "qqp";
  if (has("cola_judgment")) return "cola";  // GLUE's headerless CoLA layout
  if (has("score")) return "stsb";
  if (has("gold_label")) return "mnli";
  if (has("question") && has("sentence")) return "qnli";
  return "";
}

std::string glue_metric(const std::string& task) {
  if (task == "cola") return "mcc";
  if (task == "mrpc" || task == "qqp") return "f1";
  if (task == "stsb") return "pearson";
  return "accuracy";
}

namespace {

// The finite number a label is written as, if it is one.
std::optional<double> number_of(const std::string& label) {
  double v = 0;
  const auto [end, ec] = std::from_chars(label.data(), label.data() + label.size(), v);
  if (label.empty() || ec != std::errc() || end != label.data() + label.size() || !std::isfinite(v))
    return std::nullopt;
  return v;
}

}  // namespace

bool decimal_labels(const std::map<std::string, int32_t>& seen) {
  bool decimal = false;
  for (const auto& [name, id] : seen) {
    if (!number_of(name)) return false;
    decimal = decimal || name.find_first_of(".eE") != std::string::npos;
  }
  return decimal;
}

void set_targets(std::vector<ClassifyExample>& examples, const std::map<std::string, int32_t>& seen,
                 const std::string& source) {
  std::vector<float> value(seen.size());
  for (const auto& [name, id] : seen) {
    const std::optional<double> v = number_of(name);
    if (!v)
      throw InputError(source + ": label '" + name +
                       "' is not a number (a regression task's labels are its targets)");
    value[static_cast<size_t>(id)] = static_cast<float>(*v);
  }
  for (ClassifyExample& e : examples) e.target = value[static_cast<size_t>(e.label)];
}

std::map<std::string, int32_t> sorted_label_ids(const std::map<std::string, int32_t>& seen) {
  std::vector<std::pair<double, std::string>> numbers;
  bool numeric = true;
  for (const auto& [name, id] : seen) {
    const std::optional<double> v = number_of(name);
    numeric = numeric && v.has_value();
    numbers.push_back({v.value_or(0), name});
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
