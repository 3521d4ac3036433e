// Block-sparse weights: the pattern's format and indexes, and the kernels against the dense
// layer on the masked weight (the kernel harness in test_kernels.cpp adds finite differences in
// double, the += contract and PyTorch's golden for every block size).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <set>
#include <stdexcept>

#include "kernels/layers.h"
#include "kernels/sparse.h"

namespace packbert::kernels {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ||got - want|| <= tol ||want||, and want is not all zero.
void expect_normwise(const std::vector<float>& got, const std::vector<float>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    d2 += d * d;
    r2 += static_cast<double>(want[i]) * want[i];
  }
  EXPECT_GT(r2, 0.0) << what << " is all zero";
  EXPECT_LE(std::sqrt(d2), tol * std::sqrt(r2)) << what;
}

TEST(SparsePattern, RandomPatternKeepsExactlyNnzDistinctBlocksAndIndexesThem) {
  for (const int B : {1, 4, 8, 16}) {
    const int rows = 96, cols = 48, nnz = blocks_kept(rows, cols, B, 0.9);
    const BlockPattern p = random_block_pattern(rows, cols, B, nnz, 5);
    ASSERT_EQ(p.nnz(), nnz);
    std::set<std::pair<int, int>> seen;
    for (int s = 0; s < nnz; ++s) seen.insert({p.slot_row[s], p.slot_col[s]});
    EXPECT_EQ(static_cast<int>(seen.size()), nnz) << "B=" << B;
    // Each index lists every slot once, grouped by its row (column), ascending within.
    std::vector<int> hits(nnz, 0);
    for (int r = 0; r < p.block_rows(); ++r)
      for (int e = p.by_row_start[r]; e < p.by_row_start[r + 1]; ++e) {
        ++hits[p.by_row[e]];
        EXPECT_EQ(p.slot_row[p.by_row[e]], r);
        if (e > p.by_row_start[r]) {
          EXPECT_LT(p.slot_col[p.by_row[e - 1]], p.slot_col[p.by_row[e]]);
        }
      }
    for (int c = 0; c < p.block_cols(); ++c)
      for (int e = p.by_col_start[c]; e < p.by_col_start[c + 1]; ++e) {
        ++hits[p.by_col[e]];
        EXPECT_EQ(p.slot_col[p.by_col[e]], c);
        if (e > p.by_col_start[c]) {
          EXPECT_LT(p.slot_row[p.by_col[e - 1]], p.slot_row[p.by_col[e]]);
        }
      }
    for (int h : hits) EXPECT_EQ(h, 2);
    // The same seed draws the same pattern; another seed another one.
    EXPECT_EQ(random_block_pattern(rows, cols, B, nnz, 5).slot_row, p.slot_row);
    EXPECT_NE(random_block_pattern(rows, cols, B, nnz, 6).slot_col, p.slot_col);
  }
}

TEST(SparsePattern, IndexRefusesABlockHeldTwiceOrOutOfRange) {
  BlockPattern p = random_block_pattern(32, 32, 8, 6, 1);
  p.slot_row[1] = p.slot_row[0];
  p.slot_col[1] = p.slot_col[0];
  try {
    p.index();
    FAIL() << "a block held by two slots was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("held by two slots"), std::string::npos) << e.what();
  }
  p = random_block_pattern(32, 32, 8, 6, 1);
  p.slot_col[2] = 4;
  try {
    p.index();
    FAIL() << "a block outside the weight was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("outside 4 x 4 blocks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(random_block_pattern(30, 32, 4, 1, 1), std::invalid_argument);
  EXPECT_THROW(random_block_pattern(32, 32, 2, 1, 1), std::invalid_argument);
}

TEST(SparsePattern, DensifyAndGatherAreInverseOnThePattern) {
  std::mt19937 rng(3);
  const BlockPattern p = random_block_pattern(48, 32, 8, 7, 2);
  const std::vector<float> values = randn(p.values_size(), rng);
  std::vector<float> dense(48 * 32), back(p.values_size());
  densify(dense.data(), p, values.data());
  gather_blocks(back.data(), p, dense.data());
  EXPECT_EQ(back, values);
  int nonzero = 0;
  for (float v : dense) nonzero += v != 0.0f;
  EXPECT_EQ(nonzero, 7 * 64);
}

// The sparse layer is the dense layer (oneDNN's sgemm) on the masked weight: output, input
// gradient, bias gradient and the weight gradient read at the kept blocks, for every block size,
// token counts that are not a multiple of any tile (1, 37, 300: more than one padded chunk) and
// shapes of odd block counts.
TEST(SparseLinear, EqualsTheDenseLayerOnTheMaskedWeight) {
  std::mt19937 rng(11);
  for (const int B : {1, 4, 8, 16})
    for (const int N : {1, 37, 300}) {
      const int C = 3 * 16 + (B == 1 ? 5 : 0), OC = 5 * 16 + (B == 1 ? 3 : 0);
      const BlockPattern p =
          random_block_pattern(OC, C, B, blocks_kept(OC, C, B, B == 1 ? 0.9 : 0.6), 100 + N);
      const std::string what = "B=" + std::to_string(B) + " N=" + std::to_string(N);
      const auto x = randn(static_cast<size_t>(N) * C, rng);
      const auto dy = randn(static_cast<size_t>(N) * OC, rng);
      const auto values = randn(p.values_size(), rng, 0.3f);
      const auto bias = randn(OC, rng);
      std::vector<float> w(static_cast<size_t>(OC) * C);
      densify(w.data(), p, values.data());

      std::vector<float> y(static_cast<size_t>(N) * OC), dx(static_cast<size_t>(N) * C, 0.0f),
          dw(w.size(), 0.0f), db(OC, 0.0f);
      linear_forward(y.data(), x.data(), w.data(), bias.data(), N, C, OC);
      linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
      std::vector<float> dvalues_dense(p.values_size());
      gather_blocks(dvalues_dense.data(), p, dw.data());

      std::vector<float> scratch(sparse_linear_scratch(p, N));
      std::vector<float> sy(y.size()), sdx(dx.size(), 0.0f), sdv(p.values_size(), 0.0f),
          sdb(OC, 0.0f);
      sparse_linear_forward(sy.data(), x.data(), p, values.data(), bias.data(), N, scratch.data());
      sparse_linear_backward(sdx.data(), sdv.data(), sdb.data(), dy.data(), x.data(), p,
                             values.data(), N, scratch.data());
      expect_normwise(sy, y, 1e-6, what + " out");
      expect_normwise(sdx, dx, 1e-6, what + " dinp");
      expect_normwise(sdv, dvalues_dense, 1e-6, what + " dvalues");
      expect_normwise(sdb, db, 1e-6, what + " dbias");
    }
}

// Every output element is one thread's sum in a fixed order: 1 and 2 threads agree bit for bit.
TEST(SparseLinear, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937 rng(12);
  for (const int B : {1, 16}) {
    const int N = 200, C = 64, OC = 96;
    const BlockPattern p = random_block_pattern(OC, C, B, blocks_kept(OC, C, B, 0.7), 9);
    const auto x = randn(static_cast<size_t>(N) * C, rng);
    const auto dy = randn(static_cast<size_t>(N) * OC, rng);
    const auto values = randn(p.values_size(), rng);
    std::vector<float> scratch(sparse_linear_scratch(p, N));
    auto run = [&](int threads) {
      const int keep = omp_get_max_threads();
      omp_set_num_threads(threads);
      std::vector<float> y(static_cast<size_t>(N) * OC), dx(static_cast<size_t>(N) * C, 0.0f),
          dv(p.values_size(), 0.0f), db(OC, 0.0f);
      sparse_linear_forward(y.data(), x.data(), p, values.data(),
                            static_cast<const float*>(nullptr), N, scratch.data());
      sparse_linear_backward(dx.data(), dv.data(), db.data(), dy.data(), x.data(), p, values.data(),
                             N, scratch.data());
      omp_set_num_threads(keep);
      y.insert(y.end(), dx.begin(), dx.end());
      y.insert(y.end(), dv.begin(), dv.end());
      y.insert(y.end(), db.begin(), db.end());
      return y;
    };
    EXPECT_EQ(run(1), run(2)) << "B=" << B;
  }
}

}  // namespace
}  // namespace packbert::kernels
