// Sequence-length histograms: how many sequences of each length a dataset holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace packbert::pack {

// count[l] = number of sequences of length l, for l in [0, max_len]; count[0] is always 0.
struct Histogram {
  int max_len = 0;
  std::vector<int64_t> count;

  explicit Histogram(int max_len_ = 0) : max_len(max_len_), count(max_len_ + 1, 0) {}
  int64_t sequences() const;
  int64_t tokens() const;
};

// Parses `length count` lines ('#' starts a comment, blank lines ignored). Lengths must be in
// [1, max_len] and appear once; counts are non-negative integers. Throws InputError naming
// source:line on the first violation, and for an input holding no sequences at all.
Histogram parse_histogram(const std::string& text, const std::string& source, int max_len);
Histogram read_histogram(const std::string& path, int max_len);

// The histogram of a list of sequence lengths (each in [1, max_len]).
Histogram histogram_of(const std::vector<int>& lengths, int max_len);

}  // namespace packbert::pack
