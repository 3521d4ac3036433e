#include "train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

namespace packbert::train {

std::string clock_text(double seconds) {
  const int s = static_cast<int>(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

ProgressLine::ProgressLine(std::string command, std::string what, int64_t first, int64_t total,
                           std::string unit, int64_t every)
    : command_(std::move(command)),
      what_(std::move(what)),
      unit_(std::move(unit)),
      first_(first),
      total_(total),
      last_(first),
      every_(std::max<int64_t>(1, every)),
      tty_(::isatty(2)) {}

void ProgressLine::update(int64_t done, double amount, double seconds, const std::string& fields) {
  amount_ += amount, seconds_ += seconds;
  const bool crossed = done / every_ != last_ / every_;  // (work may come in uneven lumps)
  last_ = done;
  if (!tty_ && !crossed && done != total_) return;
  const double rate = amount_ / std::max(seconds_, 1e-9);
  const double eta = seconds_ / static_cast<double>(std::max<int64_t>(done - first_, 1)) *
                     static_cast<double>(total_ - done);
  char head[160];
  std::snprintf(head, sizeof head, "%s %lld/%lld", what_.c_str(), static_cast<long long>(done),
                static_cast<long long>(total_));
  std::string line = command_ + ": " + head + (fields.empty() ? "" : "  " + fields);
  char tail[96];
  std::snprintf(tail, sizeof tail, "  %.0f %s/s  ETA %s", rate, unit_.c_str(),
                clock_text(eta).c_str());
  line += tail;
  if (tty_) {
    std::cerr << '\r' << line << "\033[K" << std::flush;
    open_ = true;
  } else {
    std::cerr << line << '\n';
  }
}

void ProgressLine::finish() {
  if (open_) std::cerr << '\n';
  open_ = false;
}

}  // namespace packbert::train
