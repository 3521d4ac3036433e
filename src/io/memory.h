// Out-of-memory reporting: what was being allocated, and how many bytes, for the one-line error
// the CLI prints (exit 2) instead of "std::bad_alloc".
#pragma once

#include <cstddef>
#include <string>

namespace packbert::io {

// Names what the current thread is allocating while it lives (scopes nest; the innermost
// names the failure).
class AllocationScope {
 public:
  explicit AllocationScope(std::string what);
  ~AllocationScope();
  AllocationScope(const AllocationScope&) = delete;
  AllocationScope& operator=(const AllocationScope&) = delete;

 private:
  std::string what_;
  const std::string* previous_;
};

// Called by the binary's operator new when an allocation of `bytes` fails.
void note_failed_allocation(size_t bytes) noexcept;

// "<bytes> bytes for <what>" for the last failure on this thread (parts unknown are left out).
std::string describe_failed_allocation();

// The last failure on this thread, to hand to the thread that reports it (a worker's failed
// allocation surfaces as std::bad_alloc on the thread it passes its exception to).
struct FailedAllocation {
  size_t bytes = 0;
  std::string what;
};
FailedAllocation last_failed_allocation();
void set_failed_allocation(const FailedAllocation& f);

}  // namespace packbert::io
