// Wall-clock timing for progress lines, metrics and benchmarks (steady clock).
#pragma once

#include <chrono>

namespace packbert {

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  // Seconds since construction.
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Seconds on the steady clock from an arbitrary origin: only differences mean anything.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace packbert
