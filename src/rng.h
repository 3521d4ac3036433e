// The project's random numbers, in one place (docs/DESIGN.md §7). Two kinds:
// - SplitMix64, a seeded sequential stream with an unbiased bounded draw: shuffles,
//   initialisation, pre-training data. Portable: the same numbers on every platform.
// - Counter-based draws, a pure function of (seed, key, index): dropout masks, the stochastic
//   rounding of bf16 master weights, random sparse regrowth. Nothing depends on which thread
//   draws, on whether a layer is recomputed, or on how many ranks share the work.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace packbert {

// splitmix64's finaliser: a strong 64-bit bijection.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden64 = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio, the stream step

struct SplitMix64 {
  uint64_t state;
  explicit SplitMix64(uint64_t seed) : state(seed) {}
  uint64_t next() { return mix64(state += kGolden64); }
  // Uniform in [0, n), n > 0: Lemire's multiply-shift with rejection (exactly uniform).
  uint64_t below(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = -n % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

// Fisher-Yates with SplitMix64::below: the project's portable shuffle.
template <typename T>
void shuffle(std::vector<T>& v, SplitMix64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

// Counter-based: 64 random bits for element i of the stream (seed, key). A loop over the
// elements of one stream takes its per-stream half once (CounterStream), which leaves a
// multiply-xor chain per element that vectorises.
struct CounterStream {
  uint64_t base;
  CounterStream(uint64_t seed, uint64_t key) : base(mix64(seed ^ key)) {}
  uint64_t operator()(uint64_t i) const { return mix64(base + i * kGolden64); }
};

inline uint64_t counter_bits(uint64_t seed, uint64_t key, uint64_t i) {
  return CounterStream(seed, key)(i);
}

}  // namespace packbert
