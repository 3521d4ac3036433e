// Packers: published reference counts, invariants on random histograms, optimality against
// brute force on tiny instances, NNLS optimality conditions, sequence assignment, bad input.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "data/embedded.h"
#include "error.h"
#include "pack/assign.h"
#include "pack/colgen.h"
#include "pack/nnls.h"
#include "pack/plan.h"

namespace packbert::pack {
namespace {

Histogram wikipedia() {
  return parse_histogram(data::kWikipedia512Histogram, "wikipedia_512.hist", 512);
}
Histogram squad() {
  return parse_histogram(data::kSquad384Histogram, "squad_384.hist", 384);
}

PackOptions opts(int max_len, int depth) {
  PackOptions o;
  o.max_len = max_len;
  o.max_per_pack = depth;
  return o;
}

TEST(PackReference, HistogramTotals) {
  Histogram h = wikipedia();
  EXPECT_EQ(h.sequences(), 16279552);
  EXPECT_EQ(h.tokens(), 4164796173);
  EXPECT_EQ(squad().sequences(), 88641);
}

// Graphcore's published counts (Krell et al. 2021 and the packedBERT blog code).
TEST(PackReference, WikipediaUnlimited) {
  Histogram h = wikipedia();
  PackOptions o = opts(512, 0);
  EXPECT_EQ(run_packer(Algo::none, h, o).packs(), 16279552);
  EXPECT_EQ(run_packer(Algo::spfhp, h, o).packs(), 8166708);
  EXPECT_EQ(run_packer(Algo::lpfhp, h, o).packs(), 8138483);
  PackPlan opt = run_packer(Algo::optimal, h, o);
  EXPECT_EQ(opt.lower_bound, 8135727);
  EXPECT_LE(opt.packs(), 8135728);
  EXPECT_GE(opt.packs(), opt.lower_bound);
}

TEST(PackReference, WikipediaDepth3) {
  Histogram h = wikipedia();
  PackOptions o = opts(512, 3);
  EXPECT_EQ(run_packer(Algo::spfhp, h, o).packs(), 9094695);
  EXPECT_EQ(run_packer(Algo::lpfhp, h, o).packs(), 9090154);
  EXPECT_NEAR(run_packer(Algo::nnlshp, h, o).packs(), 8155059, 815);  // within 0.01%
  PackPlan opt = run_packer(Algo::optimal, h, o);
  EXPECT_LE(opt.packs(), 8143861);
  EXPECT_GE(opt.packs(), opt.lower_bound);
  EXPECT_GE(opt.lower_bound, 8143800);
}

TEST(PackReference, Squad) {
  Histogram h = squad();
  PackOptions o = opts(384, 0);
  EXPECT_EQ(run_packer(Algo::lpfhp, h, o).packs(), 40631);
  PackPlan opt = run_packer(Algo::optimal, h, o);
  EXPECT_EQ(opt.lower_bound, 40195);
  EXPECT_LE(opt.packs(), 40196);
}

TEST(PackPlanStats, EfficiencyAndFactor) {
  PackPlan p = empty_plan("test", opts(10, 0));
  p.recipes = {{{6, 4}, 3}, {{5}, 1}};  // 3 full packs + one half-full
  EXPECT_EQ(p.packs(), 4);
  EXPECT_EQ(p.sequences(), 7);
  EXPECT_EQ(p.tokens(), 35);
  EXPECT_DOUBLE_EQ(p.efficiency(), 35.0 / 40.0);
  EXPECT_DOUBLE_EQ(p.packing_factor(), 7.0 / 4.0);
}

TEST(PackPlanCheck, RejectsBrokenPlans) {
  Histogram h(10);
  h.count[6] = 2;
  h.count[4] = 2;
  PackPlan p = empty_plan("test", opts(10, 0));
  p.recipes = {{{6, 4}, 2}};
  EXPECT_NO_THROW(check_plan(p, h));
  p.recipes = {{{6, 6}, 1}, {{4, 4}, 1}};  // 12 tokens in a pack of 10
  EXPECT_THROW(check_plan(p, h), std::logic_error);
  p.recipes = {{{6, 4}, 1}};  // a sequence left out
  EXPECT_THROW(check_plan(p, h), std::logic_error);
  p = empty_plan("test", opts(10, 1));
  p.recipes = {{{6, 4}, 2}};  // over the depth cap
  EXPECT_THROW(check_plan(p, h), std::logic_error);
}

Histogram random_histogram(std::mt19937& rng, int max_len, int sequences) {
  Histogram h(max_len);
  std::uniform_int_distribution<int> len(1, max_len);
  for (int i = 0; i < sequences; ++i) ++h.count[len(rng)];
  return h;
}

// Every packer, every depth, on varied random histograms: run_packer checks the plan covers
// the histogram exactly, respects max length and depth; the bound must hold too.
TEST(PackInvariants, RandomHistograms) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    int max_len = 8 + static_cast<int>(rng() % 120);
    Histogram h = random_histogram(rng, max_len, 1 + static_cast<int>(rng() % 3000));
    for (int depth : {0, 1, 2, 3, 4, 8}) {
      PackOptions o = opts(max_len, depth);
      PackBound bound = packing_lower_bound(h, o);
      for (Algo a : kAllAlgos) {
        if (!algo_supports(a, o)) continue;
        PackPlan p = run_packer(a, h, o);
        EXPECT_GE(p.packs(), bound.lower_bound) << algo_name(a) << " depth " << depth;
        EXPECT_EQ(p.sequences(), h.sequences());
        EXPECT_EQ(p.tokens(), h.tokens());
      }
    }
  }
}

// Exact minimum number of packs by exhaustive search over multiset states (tiny instances).
int brute_force_packs(std::vector<int> count, int S, int depth,
                      std::map<std::vector<int>, int>& memo) {
  int largest = 0;
  for (int l = S; l >= 1; --l)
    if (count[l]) {
      largest = l;
      break;
    }
  if (!largest) return 0;
  if (auto it = memo.find(count); it != memo.end()) return it->second;
  int best = 1 << 30;
  // The pack holding one sequence of the largest length: choose the rest recursively.
  --count[largest];
  std::vector<int> rest = count;
  auto fill = [&](auto&& self, int max_l, int space, int slots) -> void {
    best = std::min(best, 1 + brute_force_packs(rest, S, depth, memo));
    if (slots == 0) return;
    for (int l = std::min(max_l, space); l >= 1; --l) {
      if (!rest[l]) continue;
      --rest[l];
      self(self, l, space - l, slots - 1);
      ++rest[l];
    }
  };
  fill(fill, largest, S - largest, depth - 1);
  ++count[largest];
  memo[count] = best;
  return best;
}

TEST(PackOptimal, MatchesBruteForceOnTinyInstances) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 150; ++trial) {
    int S = 4 + static_cast<int>(rng() % 9);
    Histogram h = random_histogram(rng, S, 1 + static_cast<int>(rng() % 11));
    int depth = std::vector<int>{0, 2, 3}[rng() % 3];
    PackOptions o = opts(S, depth);
    std::map<std::vector<int>, int> memo;
    std::vector<int> count(S + 1);
    for (int l = 1; l <= S; ++l) count[l] = static_cast<int>(h.count[l]);
    int exact = brute_force_packs(count, S, depth ? depth : S, memo);
    PackPlan p = run_packer(Algo::optimal, h, o);
    EXPECT_LE(p.lower_bound, exact) << "trial " << trial;
    EXPECT_GE(p.packs(), exact) << "trial " << trial;
    EXPECT_LE(p.packs(), exact + 1) << "trial " << trial;
    for (Algo a : {Algo::spfhp, Algo::lpfhp}) EXPECT_GE(run_packer(a, h, o).packs(), exact);
  }
}

TEST(PackLp, BoundBelowEveryPackingAndAboveVolume) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    Histogram h = random_histogram(rng, 64, 500);
    PackOptions o = opts(64, 0);
    PackBound b = packing_lower_bound(h, o);
    int64_t volume_bound = (h.tokens() + 63) / 64;
    EXPECT_GE(b.lower_bound, volume_bound);
    EXPECT_LE(b.lower_bound, run_packer(Algo::lpfhp, h, o).packs());
    EXPECT_NEAR(b.lp_value, static_cast<double>(b.lower_bound), 1.0);
  }
}

// NNLS: the result must satisfy the KKT conditions of min ||Ax - b|| s.t. x >= 0.
TEST(Nnls, SatisfiesOptimalityConditions) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 30; ++trial) {
    int rows = 5 + static_cast<int>(rng() % 20), n = 3 + static_cast<int>(rng() % 40);
    std::vector<SparseColumn> cols(n);
    for (auto& c : cols)
      for (int r = 0; r < rows; ++r)
        if (u(rng) < 0.3) c.entries.push_back({r, 1.0 + std::floor(3 * u(rng))});
    std::vector<double> b(rows);
    for (double& v : b) v = 10 * u(rng) - 2;
    std::vector<double> x = nnls(rows, cols, b);
    std::vector<double> r = b;
    for (int j = 0; j < n; ++j)
      for (auto [i, v] : cols[j].entries) r[i] -= v * x[j];
    for (int j = 0; j < n; ++j) {
      double w = 0;
      for (auto [i, v] : cols[j].entries) w += v * r[i];
      EXPECT_GE(x[j], 0);
      EXPECT_LE(w, 1e-8) << "gradient points into the feasible set";
      if (x[j] > 1e-9) {
        EXPECT_NEAR(w, 0, 1e-8) << "active variable not stationary";
      }
    }
  }
}

TEST(Assign, PlacesEverySequenceOnceAndIsDeterministic) {
  std::mt19937 rng(9);
  std::vector<int> lengths(5000);
  for (int& l : lengths) l = 1 + static_cast<int>(rng() % 128);
  Histogram h = histogram_of(lengths, 128);
  PackPlan plan = run_packer(Algo::optimal, h, opts(128, 0));
  PackAssignment a = assign_sequences(plan, lengths, 42);
  ASSERT_EQ(a.packs(), plan.packs());
  std::vector<int> seen(lengths.size(), 0);
  std::map<std::vector<int>, int64_t> recipe_use;
  for (int64_t p = 0; p < a.packs(); ++p) {
    int total = 0;
    std::vector<int> recipe;
    for (int64_t k = a.offsets[p]; k < a.offsets[p + 1]; ++k) {
      ++seen[a.ids[k]];
      total += lengths[a.ids[k]];
      recipe.push_back(lengths[a.ids[k]]);
    }
    EXPECT_LE(total, 128);
    std::sort(recipe.begin(), recipe.end(), std::greater<>());
    ++recipe_use[recipe];
  }
  for (int s : seen) EXPECT_EQ(s, 1);
  for (const Recipe& r : plan.recipes) EXPECT_EQ(recipe_use[r.lengths], r.count);
  PackAssignment again = assign_sequences(plan, lengths, 42);
  EXPECT_EQ(again.ids, a.ids);
  PackAssignment other = assign_sequences(plan, lengths, 43);
  EXPECT_NE(other.ids, a.ids);
  lengths.pop_back();
  EXPECT_THROW(assign_sequences(plan, lengths, 42), InputError);
}

TEST(SplitMix, BelowIsInRangeAndCoversIt) {
  SplitMix64 rng(1);
  std::vector<int> hits(7, 0);
  for (int i = 0; i < 7000; ++i) ++hits[rng.below(7)];
  for (int h : hits) EXPECT_GT(h, 800);
}

void expect_input_error(const std::string& text, const std::string& fragment) {
  try {
    parse_histogram(text, "h.txt", 16);
    ADD_FAILURE() << "no error for: " << text;
  } catch (const InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(HistogramParse, BadInputNamesFileAndLine) {
  expect_input_error("# c\n3 x\n", "h.txt:2: count 'x' is not an integer");
  expect_input_error("a 3\n", "h.txt:1: length 'a' is not an integer");
  expect_input_error("3 -1\n", "h.txt:1: count -1 is negative");
  expect_input_error("0 5\n", "h.txt:1: length 0 is outside [1, 16]");
  expect_input_error("17 5\n", "h.txt:1: length 17 is outside [1, 16]");
  expect_input_error("3 1\n4 1\n3 2\n", "h.txt:3: length 3 appears again (first at line 1)");
  expect_input_error("3\n", "h.txt:1: expected 'length count'");
  expect_input_error("3 4 5\n", "h.txt:1: expected 'length count', found extra field");
  expect_input_error("", "h.txt: histogram holds no sequences");
  expect_input_error("# only\n3 0\n", "h.txt: histogram holds no sequences");
  expect_input_error("3 1.5\n", "h.txt:1: count '1.5' is not an integer");
  EXPECT_THROW(read_histogram("/nonexistent/h.txt", 16), InputError);
}

TEST(HistogramParse, AcceptsCommentsAndBlankLines) {
  Histogram h = parse_histogram("# header\n\n3 2  # trailing\n  5\t1\n", "h", 16);
  EXPECT_EQ(h.count[3], 2);
  EXPECT_EQ(h.count[5], 1);
  EXPECT_EQ(h.sequences(), 3);
}

}  // namespace
}  // namespace packbert::pack
