#include "io/memory.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

namespace packbert::io {

namespace {

// Per thread, so concurrent work cannot garble the report; only diagnostics live here. Plain
// types only: a thread_local with a destructor registers it at first use, which itself needs
// memory, and first use here may be inside a failed allocation on a new thread (glibc aborts).
thread_local const std::string* t_what = nullptr;
thread_local size_t t_failed_bytes = 0;
thread_local char t_failed_what[512];

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

AllocationScope::AllocationScope(std::string what) : what_(std::move(what)), previous_(t_what) {
  t_what = &what_;
}

AllocationScope::~AllocationScope() {
  t_what = previous_;
}

void note_failed_allocation(size_t bytes) noexcept {
  t_failed_bytes = bytes;
  const size_t n = t_what ? std::min(t_what->size(), sizeof t_failed_what - 1) : 0;
  if (n) std::memcpy(t_failed_what, t_what->data(), n);
  t_failed_what[n] = '\0';
}

FailedAllocation last_failed_allocation() {
  return {t_failed_bytes, t_failed_what[0] ? std::string(t_failed_what) : t_what ? *t_what : ""};
}

void set_failed_allocation(const FailedAllocation& f) {
  t_failed_bytes = f.bytes;
  const size_t n = std::min(f.what.size(), sizeof t_failed_what - 1);
  std::memcpy(t_failed_what, f.what.data(), n);
  t_failed_what[n] = '\0';
}

std::string describe_failed_allocation() {
  std::string out = t_failed_bytes ? "could not allocate " + human_bytes(t_failed_bytes)
                                   : std::string("an allocation failed");
  const std::string what = t_failed_what[0] ? std::string(t_failed_what) : t_what ? *t_what : "";
  if (!what.empty()) out += " for " + what;
  return out + " (free memory, lower `rows_per_batch`, or raise the memory limit)";
}

}  // namespace packbert::io
