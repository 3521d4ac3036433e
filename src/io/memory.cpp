#include "io/memory.h"

#include <cstdio>
#include <utility>

namespace packbert::io {

namespace {

// Per thread, so concurrent work cannot garble the report; only diagnostics live here.
thread_local std::string t_what;
thread_local size_t t_failed_bytes = 0;
thread_local std::string t_failed_what;

std::string human_bytes(size_t b) {
  const char* unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
  return buf;
}

}  // namespace

AllocationScope::AllocationScope(std::string what) : previous_(std::move(t_what)) {
  t_what = std::move(what);
}

AllocationScope::~AllocationScope() {
  t_what = std::move(previous_);
}

void note_failed_allocation(size_t bytes) noexcept {
  t_failed_bytes = bytes;
  try {
    t_failed_what = t_what;
  } catch (...) {
    t_failed_what.clear();
  }
}

std::string describe_failed_allocation() {
  std::string out = t_failed_bytes ? "could not allocate " + human_bytes(t_failed_bytes)
                                   : std::string("an allocation failed");
  const std::string& what = t_failed_what.empty() ? t_what : t_failed_what;
  if (!what.empty()) out += " for " + what;
  return out + " (free memory, lower --batch-rows, or raise the memory limit)";
}

}  // namespace packbert::io
