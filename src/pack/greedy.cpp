// Graphcore's greedy histogram packers (Krell et al., "Efficient sequence packing without
// cross-contamination", 2021), reproduced decision for decision so that the pack counts match
// the published ones exactly:
//   SPFHP: lengths longest first; each goes into the open pack with the MOST space left that
//          still fits it (worst fit), a whole histogram bin at a time.
//   LPFHP: lengths longest first; each goes into the open pack with the LEAST space left that
//          fits it (best fit), and repeats the length inside one pack while it still fits.
// "Open" packs are bucketed by remaining space, each bucket a stack of (count, recipe) groups;
// a group is split when only part of it receives the current length. Cost is O(max_len^2 +
// recipes), independent of the number of sequences.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "pack/plan.h"

namespace packbert::pack {

namespace {

struct Group {
  int64_t count;
  std::vector<int> lengths;
};

// Open groups keyed by remaining space; closed ones (full, or at the depth cap) are final.
struct Buckets {
  int max_len;
  int64_t depth;
  std::vector<std::vector<Group>> open;
  std::vector<Group> closed;

  Buckets(int max_len_, int64_t depth_) : max_len(max_len_), depth(depth_), open(max_len_ + 2) {}

  bool has(int remaining) const { return remaining <= max_len && !open[remaining].empty(); }
  Group pop(int remaining) {
    Group g = std::move(open[remaining].back());
    open[remaining].pop_back();
    return g;
  }
  void add(std::vector<int> lengths, int64_t count, int remaining) {
    if (static_cast<int64_t>(lengths.size()) == depth || remaining == 0)
      closed.push_back({count, std::move(lengths)});
    else
      open[remaining].push_back({count, std::move(lengths)});
  }
  PackPlan to_plan(const char* algo, const PackOptions& options) {
    PackPlan plan = empty_plan(algo, options);
    for (Group& g : closed) plan.recipes.push_back({std::move(g.lengths), g.count});
    for (auto& bucket : open)
      for (Group& g : bucket) plan.recipes.push_back({std::move(g.lengths), g.count});
    return plan;
  }
};

std::vector<int> with(std::vector<int> lengths, int len, int64_t times) {
  lengths.insert(lengths.end(), static_cast<size_t>(times), len);
  return lengths;
}

}  // namespace

PackPlan pack_spfhp(const Histogram& h, const PackOptions& options) {
  const int S = options.max_len;
  Buckets b(S, options.depth());
  for (int i = 0; i < S; ++i) {  // i = space a pack of this length leaves
    const int len = S - i;
    int64_t n = h.count[len];
    int offset = i + 1;  // remaining space of the target pack, minus len
    while (n > 0) {
      if (b.has(len + offset)) {
        Group g = b.pop(len + offset);
        int64_t count = std::min(g.count, n);
        std::vector<int> grown = with(g.lengths, len, 1);
        if (g.count > n) {
          b.open[len + offset].push_back({g.count - n, std::move(g.lengths)});
          n = 0;
        } else {
          n -= g.count;
        }
        b.add(std::move(grown), count, offset);
      } else {
        --offset;
      }
      if (offset < 0) {
        b.add({len}, n, i);
        n = 0;
      }
    }
  }
  return b.to_plan("spfhp", options);
}

PackPlan pack_lpfhp(const Histogram& h, const PackOptions& options) {
  const int S = options.max_len;
  const int64_t depth = options.depth();
  Buckets b(S, depth);
  for (int i = 0; i < S; ++i) {
    const int len = S - i;
    int64_t n = h.count[len];
    int offset = 0;  // smallest extra space first: best fit
    while (n > 0) {
      if (b.has(len + offset)) {
        Group g = b.pop(len + offset);
        // How often this length fits into that pack, limited by depth and by what is left.
        int64_t repeat =
            std::min<int64_t>(1 + offset / len, depth - static_cast<int64_t>(g.lengths.size()));
        while (n / repeat == 0) --repeat;
        int64_t count = std::min(g.count, n / repeat);
        std::vector<int> grown = with(g.lengths, len, repeat);
        if (g.count > count) {
          b.open[len + offset].push_back({g.count - count, std::move(g.lengths)});
          n -= count * repeat;
        } else {
          n -= g.count * repeat;
        }
        b.add(std::move(grown), count, offset - static_cast<int>(repeat - 1) * len);
        offset = 0;
      } else {
        ++offset;
      }
      if (offset >= S - len + 1) {  // fits nowhere: open new packs, as many copies as fit
        int64_t repeat = std::min<int64_t>(S / len, depth);
        while (n / repeat == 0) --repeat;
        b.add(with({}, len, repeat), n / repeat, S - static_cast<int>(repeat) * len);
        n -= n / repeat * repeat;
      }
    }
  }
  return b.to_plan("lpfhp", options);
}

}  // namespace packbert::pack
