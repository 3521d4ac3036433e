// Aligned text tables (terminal) and Markdown tables (docs/BENCHMARKS.md) from one description.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "text.h"

namespace packbert::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add_row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Columns whose cells all look numeric are right-aligned.
  void print(std::ostream& out) const;
  void print_markdown(std::ostream& out) const;

 private:
  bool numeric_column(size_t c) const;
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

std::string with_commas(int64_t n);  // 8135727 -> "8,135,727"
using packbert::fixed;               // fixed-point text (text.h)
// A dev metric's name as tables print it: accuracy, F1, MCC, Pearson, Spearman.
std::string metric_title(const std::string& key);
std::string seconds_text(double s);  // "0.0123" / "12.3"

}  // namespace packbert::cli
