#include <cstdlib>
#include <new>

#include "cli/commands.h"
#include "io/memory.h"

// The binary's allocation entry point: the same as the default (malloc, then the new-handler
// loop) except that a failure records its size, so the CLI can say what did not fit; libstdc++'s
// operator delete frees with free(), so it pairs with this. Not under the sanitizers, which
// bring their own.
#if !defined(__SANITIZE_ADDRESS__)
void* operator new(std::size_t bytes) {
  for (;;) {
    if (void* p = std::malloc(bytes ? bytes : 1)) return p;
    if (std::new_handler h = std::get_new_handler())
      h();
    else
      break;
  }
  packbert::io::note_failed_allocation(bytes);
  throw std::bad_alloc();
}
#endif

int main(int argc, char** argv) {
  return packbert::cli::run(argc, argv);
}
