#include "cli/table.h"

#include <algorithm>
#include <cstdio>

namespace packbert::cli {

namespace {

bool looks_numeric(const std::string& s) {
  if (s.empty() || s == "-") return true;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == ',' || c == '.' || c == '-' || c == '+' || c == '%' ||
           c == 'x' || c == 'e';
  });
}

}  // namespace

bool Table::numeric_column(size_t c) const {
  return std::all_of(rows_.begin(), rows_.end(),
                     [&](const auto& r) { return c >= r.size() || looks_numeric(r[c]); });
}

void Table::print(std::ostream& out) const {
  std::vector<size_t> width(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    width[c] = header_[c].size();
    for (const auto& r : rows_)
      if (c < r.size()) width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < header_.size(); ++c) {
      const std::string& s = c < cells.size() ? cells[c] : std::string();
      std::string pad(width[c] - s.size(), ' ');
      bool right = c > 0 && numeric_column(c);
      out << (c ? "  " : "") << (right ? pad + s : s + (c + 1 < header_.size() ? pad : ""));
    }
    out << '\n';
  };
  line(header_);
  size_t total = 0;
  for (size_t w : width) total += w;
  out << std::string(total + 2 * (header_.size() - 1), '-') << '\n';
  for (const auto& r : rows_) line(r);
}

void Table::print_markdown(std::ostream& out) const {
  out << '|';
  for (const auto& h : header_) out << ' ' << h << " |";
  out << "\n|";
  for (size_t c = 0; c < header_.size(); ++c)
    out << (numeric_column(c) && c > 0 ? "---:|" : "---|");
  out << '\n';
  for (const auto& r : rows_) {
    out << '|';
    for (size_t c = 0; c < header_.size(); ++c) out << ' ' << (c < r.size() ? r[c] : "") << " |";
    out << '\n';
  }
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string metric_title(const std::string& key) {
  if (key == "f1") return "F1";
  if (key == "mcc") return "MCC";
  if (key == "pearson") return "Pearson";
  if (key == "spearman") return "Spearman";
  return key;
}

std::string seconds_text(double s) {
  return s < 1 ? fixed(s, 4) : fixed(s, 2);
}

}  // namespace packbert::cli
