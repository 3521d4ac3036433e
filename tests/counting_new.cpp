// A global operator new that counts calls while `counting` is set (tests/test_alloc.cpp); with
// PACKBERT_ALLOC_TRACE set it also prints the stacks of the first counted ones (to find them).
// Not under AddressSanitizer, which owns operator new there. libstdc++'s operator delete frees
// with free(), so it pairs with this (as in src/cli/main.cpp).
#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0};

#if !defined(__SANITIZE_ADDRESS__)
void* operator new(std::size_t bytes) {
  if (counting.load(std::memory_order_relaxed)) {
    static const bool trace = std::getenv("PACKBERT_ALLOC_TRACE") != nullptr;
    if (allocations.fetch_add(1) < 8 && trace) {
      void* frames[24];
      backtrace_symbols_fd(frames, backtrace(frames, 24), STDERR_FILENO);
      (void)!write(STDERR_FILENO, "--\n", 3);
    }
  }
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
#endif
