// Block-sparse weights: the pattern's format and indexes, and the kernels against the dense
// layer on the masked weight (the kernel harness in test_kernels.cpp adds finite differences in
// double, the += contract and PyTorch's golden for every block size).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <stdexcept>

#include "error.h"
#include "kernels/cpu/layers.h"
#include "kernels/cpu/sparse.h"
#include "kernels/cpu_features.h"
#include "kernels/ops.h"
#include "model/bert.h"
#include "model_batches.h"
#include "train/sparsity.h"

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
    // 1 x 1 also lists the slots by chunk of rows (the last one short here), then by column,
    // then by row; the other sizes have no such index.
    if (B == 1) {
      const int chunks = (p.block_rows() + BlockPattern::kRowChunk - 1) / BlockPattern::kRowChunk;
      ASSERT_EQ(static_cast<int>(p.by_chunk_start.size()), chunks + 1);
      EXPECT_EQ(p.by_chunk_start[chunks], nnz);
      for (int k = 0; k < chunks; ++k)
        for (int e = p.by_chunk_start[k]; e < p.by_chunk_start[k + 1]; ++e) {
          const int s = p.by_chunk[e];
          ++hits[s];
          EXPECT_EQ(p.slot_row[s] / BlockPattern::kRowChunk, k);
          EXPECT_EQ(p.by_chunk_row[e], p.slot_row[s]);
          EXPECT_EQ(p.by_chunk_col[e], p.slot_col[s]);
          if (e > p.by_chunk_start[k]) {
            const int prev = p.by_chunk[e - 1];
            EXPECT_LT(std::pair(p.slot_col[prev], p.slot_row[prev]),
                      std::pair(p.slot_col[s], p.slot_row[s]));
          }
        }
      for (int h : hits) EXPECT_EQ(h, 3);
    } else {
      EXPECT_TRUE(p.by_chunk.empty() && p.by_chunk_start.empty()) << "B=" << B;
      for (int h : hits) EXPECT_EQ(h, 2);
    }
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
// shapes of odd block counts, on every build of the cpu backend the CPU runs (the AVX2 build's
// own 8-lane kernels too, on an AVX-512 machine).
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

      const int64_t nv = p.values_size();
      for (const Backend* cpu : cpu_backends()) {
        const std::string on = what + " (" + isa_name(cpu->isa) + ")";
        std::vector<float> sy(y.size()), sdx(dx.size(), 0.0f), sdv(nv, 0.0f), sdb(OC, 0.0f);
        cpu->linear_forward(View(sy.data(), N, OC), View(x.data(), N, C),
                            View::vector(values.data(), nv), View::vector(bias.data(), OC), &p,
                            View());
        cpu->linear_backward(View(sdx.data(), N, C), View::vector(sdv.data(), nv),
                             View::vector(sdb.data(), OC), View(dy.data(), N, OC),
                             View(x.data(), N, C), View::vector(values.data(), nv), &p,
                             GradWrite::accumulate, View());
        expect_normwise(sy, y, 1e-6, on + " out");
        expect_normwise(sdx, dx, 1e-6, on + " dinp");
        expect_normwise(sdv, dvalues_dense, 1e-6, on + " dvalues");
        expect_normwise(sdb, db, 1e-6, on + " dbias");
      }
    }
}

// The caller sizes a sparse layer's scratch once (the workspace, with sparse_linear_scratch of
// the build's own flags) and whichever build of the cpu backend the CPU runs then uses it: every
// build stays inside that room (a guard after it stays untouched) and computes what it computes
// with room of its own. The AVX2 build tiles B = 16 by 6 vectors against AVX-512's 24, so it
// needs more of the per-tile room than the AVX-512 build's tiles would ask for.
TEST(SparseLinear, EveryCpuBuildStaysInsideTheScratchTheCallerSized) {
  std::mt19937 rng(19);
  const float guard = -12345.0f;
  for (const Backend* cpu : cpu_backends())
    for (const int B : {1, 4, 8, 16})
      for (const int N : {7, 300, 384}) {  // 384: whole token tiles, where row tiles ask most
        const int C = 4 * 16, OC = 6 * 16;
        const BlockPattern p = random_block_pattern(OC, C, B, blocks_kept(OC, C, B, 0.7), 3 + N);
        const std::string what =
            std::string(isa_name(cpu->isa)) + " B=" + std::to_string(B) + " N=" + std::to_string(N);
        const auto x = randn(static_cast<size_t>(N) * C, rng);
        const auto dy = randn(static_cast<size_t>(N) * OC, rng);
        const auto values = randn(p.values_size(), rng, 0.3f);
        const auto bias = randn(OC, rng);
        const int64_t room = sparse_linear_scratch(p, N), nv = p.values_size();
        auto step = [&](std::vector<float>* scratch) {
          std::vector<float> y(static_cast<size_t>(N) * OC), dx(static_cast<size_t>(N) * C, 0.0f),
              dv(nv, 0.0f), db(OC, 0.0f);
          const View s = scratch ? View::vector(scratch->data(), room) : View();
          cpu->linear_forward(View(y.data(), N, OC), View(x.data(), N, C),
                              View::vector(values.data(), nv), View::vector(bias.data(), OC), &p,
                              s);
          cpu->linear_backward(View(dx.data(), N, C), View::vector(dv.data(), nv),
                               View::vector(db.data(), OC), View(dy.data(), N, OC),
                               View(x.data(), N, C), View::vector(values.data(), nv), &p,
                               GradWrite::accumulate, s);
          y.insert(y.end(), dx.begin(), dx.end());
          y.insert(y.end(), dv.begin(), dv.end());
          y.insert(y.end(), db.begin(), db.end());
          return y;
        };
        std::vector<float> scratch(2 * room, guard);  // a guard as long as the room
        const std::vector<float> in_room = step(&scratch), own = step(nullptr);
        EXPECT_EQ(in_room, own) << what;
        EXPECT_EQ(std::count(scratch.begin() + room, scratch.end(), guard), room) << what;
      }
}

// A large forward output (>= 8 MB), 64-byte aligned rows, is written a cache line of each token
// at a time with streamed stores; misaligned, with ordinary ones: both equal the dense layer, at
// every block size (row-major and, at 1 x 1, token-major). N leaves a partial last tile.
TEST(SparseLinear, StreamedForwardOutputEqualsTheDenseLayer) {
  std::mt19937 rng(13);
  for (const int B : {1, 4, 8, 16}) {
    const int N = 96 * 7 + 37, C = 32, OC = 3072;
    ASSERT_GE(static_cast<int64_t>(N) * OC * 4, int64_t{8} << 20);
    const BlockPattern p = random_block_pattern(OC, C, B, blocks_kept(OC, C, B, 0.5), 5);
    const auto x = randn(static_cast<size_t>(N) * C, rng);
    const auto values = randn(p.values_size(), rng, 0.3f);
    const auto bias = randn(OC, rng);
    std::vector<float> w(static_cast<size_t>(OC) * C), y(static_cast<size_t>(N) * OC);
    densify(w.data(), p, values.data());
    linear_forward(y.data(), x.data(), w.data(), bias.data(), N, C, OC);
    std::vector<float> scratch(sparse_linear_scratch(p, N));
    std::vector<float> buffer(y.size() + 32, -1.0f);
    float* aligned = buffer.data();
    while (reinterpret_cast<uintptr_t>(aligned) % 64) ++aligned;
    for (float* out : {aligned, aligned + 1}) {
      sparse_linear_forward(out, x.data(), p, values.data(), bias.data(), N, scratch.data());
      const std::vector<float> got(out, out + y.size());
      expect_normwise(got, y, 1e-6,
                      "B=" + std::to_string(B) + (out == aligned ? " aligned" : " misaligned"));
    }
  }
}

// The 16-bit-input forms (bf16 and fp16 activations, widened as the kernels pack them) give the
// fp32 kernels' results on the widened input bit for bit: every block size, partial tiles, odd
// block counts, and a forward output large enough to be streamed.
template <typename H>
void sixteen_bit_input_equals_the_widened_input() {
  std::mt19937 rng(17);
  for (const int B : {1, 4, 8, 16})
    for (const int N : {1, 37, 300, 2731}) {
      const int C = 3 * 16 + (B == 1 ? 5 : 0), OC = (N > 1000 ? 48 : 5) * 16 + (B == 1 ? 3 : 0);
      const BlockPattern p = random_block_pattern(OC, C, B, blocks_kept(OC, C, B, 0.6), 7 + N);
      const std::string what = std::string(std::is_same_v<H, bf16> ? "bf16" : "fp16") +
                               " B=" + std::to_string(B) + " N=" + std::to_string(N);
      std::vector<H> x16(static_cast<size_t>(N) * C);
      to_half(x16.data(), randn(x16.size(), rng).data(), static_cast<int64_t>(x16.size()));
      std::vector<float> x(x16.size());
      to_float(x.data(), x16.data(), static_cast<int64_t>(x.size()));
      const auto dy = randn(static_cast<size_t>(N) * OC, rng);
      const auto values = randn(p.values_size(), rng, 0.3f);
      const auto bias = randn(OC, rng);
      std::vector<float> scratch(sparse_linear_scratch(p, N));
      auto run = [&](const auto* inp) {
        std::vector<float> y(static_cast<size_t>(N) * OC), dx(static_cast<size_t>(N) * C, 0.5f),
            dv(p.values_size(), 0.25f), db(OC, 1.0f);
        sparse_linear_forward(y.data(), inp, p, values.data(), bias.data(), N, scratch.data());
        sparse_linear_backward(dx.data(), dv.data(), db.data(), dy.data(), inp, p, values.data(), N,
                               scratch.data());
        for (const auto* v : {&dx, &dv, &db}) y.insert(y.end(), v->begin(), v->end());
        return y;
      };
      EXPECT_EQ(run(x16.data()), run(x.data())) << what;
    }
}

TEST(SparseLinear, SixteenBitInputEqualsTheFp32KernelOnTheWidenedInput) {
  sixteen_bit_input_equals_the_widened_input<bf16>();
  sixteen_bit_input_equals_the_widened_input<f16>();
}

// Every output element is one thread's sum in a fixed order: 1 and 2 threads agree bit for bit.
TEST(SparseLinear, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937 rng(12);
  for (const int B : {1, 4, 8, 16}) {
    const int N = 203, C = 64, OC = 96;
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

namespace packbert::model {
namespace {

BertConfig small_config() {
  BertConfig c;
  c.vocab_size = 29;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 32;
  c.max_position_embeddings = 32;
  c.num_labels = 3;
  c.initializer_range = 0.3;
  c.hidden_dropout_prob = 0.1;
  c.attention_probs_dropout_prob = 0.1;
  return c;
}

Heads all_heads() {
  Heads h;
  h.classifier = h.span = true;
  return h;
}

// A dense model holding the sparse one's weights: its own tensors as they are, the sparse ones
// densified (zeros outside the pattern).
template <typename T>
void copy_to_dense(BertModel& sparse, BertModel& dense) {
  std::vector<T> w(dense.layout().total(), T(0));
  auto tensors = sparse.sparse_tensors();
  for (const TensorSpec& t : sparse.layout().tensors()) {
    const TensorSpec* d = dense.layout().find(t.name);
    const T* v = sparse.params<T>().data() + t.offset;
    if (!t.block) {
      std::copy_n(v, t.numel, w.begin() + d->offset);
      continue;
    }
    for (const SparseTensor& st : tensors)
      if (st.spec == &t) {
        std::vector<float> vf(v, v + t.numel);
        const std::vector<float> dw = dense_weight(st, vf.data());
        std::copy(dw.begin(), dw.end(), w.begin() + d->offset);
      }
  }
  std::copy(w.begin(), w.end(), dense.params<T>().begin());
}

// The precisions a step can run here: fp32, fp16, and bf16 where the CPU has it.
std::vector<Precision> step_precisions() {
  std::vector<Precision> out = {Precision::fp32, Precision::fp16};
  if (kernels::bf16_unavailable_reason().empty()) out.push_back(Precision::bf16);
  return out;
}

// The sparse model is the dense model on the masked weights: same losses with dropout on and all
// four heads over packed rows; the same gradients for every dense tensor, and for each sparse
// tensor the dense gradient read at the pattern's blocks; for every block size. In fp32 to 1e-5;
// under 16 bits (the sparse layers widen their 16-bit inputs and run in fp32, the dense ones
// multiply 16-bit operands) within the documented 16-bit tolerances: losses 1e-2 relative,
// gradients 5e-2 normwise per tensor.
TEST(SparseModel, EqualsTheDenseModelOnTheMaskedWeights) {
  const BertConfig c = small_config();
  const PackedBatch b = make_batch({{9, 3, 12}, {20}, {2, 6, 7}}, 25, c.vocab_size, 6);
  for (const Precision precision : step_precisions())
    for (const int B : {1, 4, 8, 16}) {
      const bool wide = precision == Precision::fp32;
      const double loss_tol = wide ? 1e-5 : 1e-2, grad_tol = wide ? 1e-5 : 5e-2;
      const std::string where = precision_name(precision) + " B=" + std::to_string(B);
      BertModel sparse(c, all_heads(), Sparsity{B, 0.6});
      BertModel dense(c, all_heads());
      init_params(sparse.layout(), sparse.params().data(), 8);
      sparse.init_patterns(3);
      copy_to_dense<float>(sparse, dense);
      const StepOptions opt{true, 41, 3, {}, precision};
      sparse.zero_grads(), dense.zero_grads();
      const Outputs so = sparse.forward(b, opt), dout = dense.forward(b, opt);
      EXPECT_NEAR(so.loss(), dout.loss(), loss_tol * std::abs(dout.loss())) << where;
      sparse.backward(), dense.backward();
      auto tensors = sparse.sparse_tensors();
      int sparse_seen = 0;
      for (const TensorSpec& t : sparse.layout().tensors()) {
        const TensorSpec* d = dense.layout().find(t.name);
        const float* gd = dense.grads().data() + d->offset;
        std::vector<float> want(gd, gd + d->numel);
        if (t.block) {
          ++sparse_seen;
          for (const SparseTensor& st : tensors)
            if (st.spec == &t) {
              // The dense gradient at the tensor's blocks, in slot order.
              want.assign(t.numel, 0.0f);
              const int cols = static_cast<int>(t.shape[1]);
              for (int j = 0; j < t.kept_blocks; ++j) {
                const int r = st.pattern->slot_row[st.first_slot + j] - st.first_row;
                const int col = st.pattern->slot_col[st.first_slot + j];
                for (int o = 0; o < B; ++o)
                  for (int i = 0; i < B; ++i)
                    want[(static_cast<size_t>(j) * B + o) * B + i] =
                        gd[static_cast<size_t>(r * B + o) * cols + col * B + i];
              }
            }
        }
        const float* gs = sparse.grads().data() + t.offset;
        std::vector<float> got(gs, gs + t.numel);
        double d2 = 0, r2 = 0;
        for (size_t i = 0; i < got.size(); ++i)
          d2 += (got[i] - want[i]) * double(got[i] - want[i]), r2 += want[i] * double(want[i]);
        // (The floor is for the key bias, whose true gradient is zero: rounding noise alone.)
        EXPECT_LE(std::sqrt(d2), grad_tol * std::sqrt(r2) + (wide ? 1e-7 : 1e-5))
            << where << " " << t.name;
      }
      EXPECT_EQ(sparse_seen, 6 * c.num_hidden_layers);
    }
}

// Whole sparse model in double against central differences (block 4, dropout on, all heads):
// every 5th value of the sparse weights and all of the rest.
TEST(SparseModel, WholeModelFiniteDifferences) {
  BertConfig c = small_config();
  c.hidden_size = 8, c.intermediate_size = 16;
  BertModel m(c, all_heads(), Sparsity{4, 0.5}, kernels::DType::f64);
  init_params(m.layout(), m.params<double>().data(), 3);
  m.init_patterns(5);
  const PackedBatch b = make_batch({{5, 3, 4}, {9}, {2, 6}}, 13, c.vocab_size, 5);
  const StepOptions opt{true, 77, 9, {}};
  m.forward(b, opt);
  m.zero_grads();
  m.backward();
  const std::span<const double> grads = m.grads<double>();
  const std::vector<double> analytic(grads.begin(), grads.end());
  const double h = 1e-5;
  int checked = 0;
  for (const TensorSpec& t : m.layout().tensors()) {
    const size_t stride = t.block ? 5 : (t.numel > 64 ? 7 : 1);
    for (size_t i = 0; i < t.numel; i += stride) {
      double& w = m.params<double>()[t.offset + i];
      const double keep = w;
      w = keep + h;
      const double up = m.forward(b, opt).loss();
      w = keep - h;
      const double down = m.forward(b, opt).loss();
      w = keep;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic[t.offset + i], numeric, 1e-6 * (1 + std::abs(numeric)))
          << t.name << "[" << i << "]";
      checked += t.block != 0;
    }
  }
  EXPECT_GT(checked, 40);
}

// Recompute policies rebuild through the sparse kernels too: bit-identical gradients, at every
// precision.
TEST(SparseModel, GradientsAreBitwiseIdenticalUnderEveryRecomputePolicy) {
  const BertConfig c = small_config();
  BertModel m(c, all_heads(), Sparsity{8, 0.5});
  init_params(m.layout(), m.params().data(), 8);
  m.init_patterns(2);
  const PackedBatch b = make_batch({{9, 3, 12}, {20}, {2, 6, 7}}, 25, c.vocab_size, 6);
  for (const Precision precision : step_precisions()) {
    auto run = [&](const std::string& policy) {
      m.zero_grads();
      const Outputs out = m.forward(b, {true, 41, 3, parse_recompute(policy), precision});
      m.backward();
      return std::pair{out.loss(), as_vector(m.grads())};
    };
    const auto [loss0, grads0] = run("none");
    for (const std::string policy : {"gelu,ln,residual", "attention", "layer", "every:2"}) {
      const auto [loss, grads] = run(policy);
      EXPECT_EQ(loss, loss0) << precision_name(precision) << " " << policy;
      EXPECT_EQ(grads, grads0) << precision_name(precision) << " " << policy;
    }
  }
}

// --sparse-init fan-in draws the same numbers as dense and scales each block-sparse weight by
// 1/sqrt(its kept fraction), so a sparse layer's outputs start with the dense layer's variance:
// every other tensor is bit-identical, each sparse one is the dense-init values times the factor
// (about sqrt(1 / 0.1) at s = 0.9), and its sample deviation is initializer_range times it.
TEST(SparseModel, FanInInitScalesOnlyTheSparseWeightsToTheDenseVariance) {
  const BertConfig c = small_config();
  for (const int B : {1, 4}) {
    BertModel dense_init(c, Heads{}, Sparsity{B, 0.9}), fan_in(c, Heads{}, Sparsity{B, 0.9});
    init_params(dense_init.layout(), dense_init.params().data(), 5);
    init_params(fan_in.layout(), fan_in.params().data(), 5, SparseInit::fan_in);
    int sparse_tensors = 0;
    double z2 = 0, count = 0;  // (value / (initializer_range x factor))^2 over every sparse value
    for (const TensorSpec& t : fan_in.layout().tensors()) {
      const float* a = dense_init.params().data() + t.offset;
      const float* f = fan_in.params().data() + t.offset;
      const double factor = sparse_init_factor(t, SparseInit::fan_in);
      if (!t.block) {
        EXPECT_EQ(factor, 1.0) << t.name;
        EXPECT_TRUE(std::equal(a, a + t.numel, f)) << t.name;
        continue;
      }
      ++sparse_tensors;
      EXPECT_EQ(sparse_init_factor(t, SparseInit::dense), 1.0) << t.name;
      const double kept =
          static_cast<double>(t.numel) / static_cast<double>(t.shape[0] * t.shape[1]);
      EXPECT_NEAR(factor * factor * kept, 1.0, 1e-12) << t.name;
      EXPECT_GT(factor, 2.5) << t.name << ": about a tenth of the blocks kept";
      for (size_t i = 0; i < t.numel; ++i) {
        EXPECT_NEAR(f[i], a[i] * factor, 1e-6 * std::abs(f[i]) + 1e-12) << t.name << " " << i;
        const double z = f[i] / (c.initializer_range * factor);
        z2 += z * z, count += 1;
      }
    }
    EXPECT_GT(sparse_tensors, 0);
    EXPECT_GT(count, 200);
    EXPECT_NEAR(std::sqrt(z2 / count), 1.0, 0.15) << "B=" << B;
  }
  EXPECT_EQ(parse_sparse_init("fan-in", "--sparse-init"), SparseInit::fan_in);
  EXPECT_EQ(std::string(sparse_init_name(SparseInit::dense)), "dense");
  EXPECT_THROW(parse_sparse_init("wide", "--sparse-init"), InputError);
}

// A model with bf16 master weights keeps its encoder weights in bf16 only, which the block-sparse
// kernels (fp32 values) cannot read: refused, not silently widened each step.
TEST(SparseModel, RefusesBf16MasterWeights) {
  BertModel m(small_config(), Heads{}, Sparsity{4, 0.5});
  EXPECT_THROW(m.keep_masters16(model::Masters::bf16), std::logic_error);
}

// A model with random values in every weight and an AdamW optimizer whose moments are all 1.
struct UpdateFixture {
  BertModel m;
  train::Optimizer opt;
  explicit UpdateFixture(int block)
      : m(small_config(), Heads{}, Sparsity{block, 0.5}),
        opt(m.layout(), train::OptimizerConfig{train::OptimizerKind::adamw}) {
    init_params(m.layout(), m.params().data(), 4);
    m.init_patterns(9);
    for (const TensorSpec& t : m.layout().tensors()) {
      const std::vector<float> ones(t.numel, 1.0f);
      opt.set_moments(t, ones.data(), ones.data());
    }
  }
};

std::vector<std::vector<int32_t>> all_slots(BertModel& m) {
  std::vector<std::vector<int32_t>> out;
  for (const SparseTensor& t : m.sparse_tensors()) {
    std::vector<int32_t> r, c;
    tensor_slots(t, r, c);
    out.push_back(r);
    out.push_back(c);
  }
  return out;
}

// The schedule: an update every round(total / n) steps, never on the last; pr(t) cosine-decays
// from prune_ratio; the summary a run prints says what the run will do, counted the same way.
TEST(SparseSchedule, UpdatesEveryTotalOverNStepsAndSaysSo) {
  train::SparseOptions o;
  o.sparsity = Sparsity{16, 0.9};
  for (const int64_t total : {2, 10, 1500, 1501}) {
    for (const int n : {0, 1, 16, 80, 160, 5000}) {
      o.updates = n;
      int64_t count = 0;
      for (int64_t step = 1; step <= total; ++step) count += train::is_update_step(o, step, total);
      EXPECT_EQ(train::update_count(o, total), count) << total << " " << n;
      EXPECT_FALSE(train::is_update_step(o, total, total));
    }
  }
  o.updates = 0;   // Graphcore's 80 for blocks: every 19 steps of 1,501, 78 updates
  o.lr_scale = 0;  // auto, pretrain's default
  EXPECT_NEAR(train::prune_fraction(o, 0, 1501), 0.5, 1e-12);
  EXPECT_NEAR(train::prune_fraction(o, 1501, 1501), 0.0, 1e-12);
  EXPECT_EQ(train::schedule_summary(o, 1501),
            "16 x 16 blocks at s = 0.9; pattern updated every 19 steps (78 updates), the first "
            "moving 50% of each weight's blocks, regrown at random; learning rate x 6.4 (auto)");
  o.sparsity = Sparsity{1, 0.9};  // 160 for 1 x 1: every 9 steps of 1,500
  o.lr_scale = 1;
  o.regrow = train::Regrow::gradient;
  o.prune_ratio = 0.3;
  EXPECT_EQ(train::schedule_summary(o, 1500),
            "1 x 1 blocks at s = 0.9; pattern updated every 9 steps (166 updates), the first "
            "moving 30% of each weight's blocks, regrown where the gradient is largest; learning "
            "rate x 1");
  o.prune_ratio = 0;
  EXPECT_EQ(train::update_count(o, 1500), 0);
  EXPECT_EQ(train::schedule_summary(o, 1500),
            "1 x 1 blocks at s = 0.9; pattern fixed (`prune_ratio` 0); learning rate x 1");
  o.prune_ratio = 0.5;
  EXPECT_EQ(train::schedule_summary(o, 1),
            "1 x 1 blocks at s = 0.9; pattern fixed (a run this short); learning rate x 1");
}

// One update keeps every weight's block count, prunes exactly round(pr * kept) slots, those of
// smallest L1 norm, moves them to blocks that were not active before, zeroes their values and
// moments and leaves every other slot as it was; the same seed moves the same blocks.
TEST(SparseUpdate, PrunesTheSmallestRegrowsOnlyInactiveBlocksAndZeroesThem) {
  for (const int B : {1, 4, 8}) {
    UpdateFixture f(B);
    const std::vector<float> before = as_vector(f.m.params());
    const auto slots_before = all_slots(f.m);
    train::SparseOptions o;
    o.sparsity = {B, 0.5};
    const double pr = train::prune_fraction(o, 3, 10);
    const train::UpdateStats stats = train::update_patterns(f.m, f.opt, o, 3, 10, 77);
    const auto slots_after = all_slots(f.m);
    int64_t moved_total = 0, t_index = 0;
    for (const SparseTensor& t : f.m.sparse_tensors()) {
      const int kept = t.spec->kept_blocks, BB = B * B;
      const auto& r0 = slots_before[2 * t_index];
      const auto& c0 = slots_before[2 * t_index + 1];
      const auto& r1 = slots_after[2 * t_index];
      const auto& c1 = slots_after[2 * t_index + 1];
      ++t_index;
      ASSERT_EQ(static_cast<int>(r1.size()), kept);
      std::set<std::pair<int, int>> old_blocks, new_blocks;
      for (int j = 0; j < kept; ++j) old_blocks.insert({r0[j], c0[j]});
      for (int j = 0; j < kept; ++j) new_blocks.insert({r1[j], c1[j]});
      EXPECT_EQ(static_cast<int>(new_blocks.size()), kept) << t.spec->name << ": a block twice";
      auto l1 = [&](int j) {
        double s = 0;
        for (int e = 0; e < BB; ++e) s += std::abs(before[t.spec->offset + j * BB + e]);
        return s;
      };
      double max_pruned = 0, min_kept = 1e300;
      int moved = 0;
      for (int j = 0; j < kept; ++j) {
        const size_t at = t.spec->offset + static_cast<size_t>(j) * BB;
        if (r0[j] == r1[j] && c0[j] == c1[j]) {
          min_kept = std::min(min_kept, l1(j));
          for (int e = 0; e < BB; ++e) {
            EXPECT_EQ(f.m.params()[at + e], before[at + e]);
            EXPECT_EQ(f.opt.m()[at + e], 1.0f);
          }
          continue;
        }
        ++moved;
        max_pruned = std::max(max_pruned, l1(j));
        EXPECT_EQ(old_blocks.count({r1[j], c1[j]}), 0u)
            << t.spec->name << ": regrew a block active before the update";
        for (int e = 0; e < BB; ++e) {
          EXPECT_EQ(f.m.params()[at + e], 0.0f);
          EXPECT_EQ(f.opt.m()[at + e], 0.0f);
          EXPECT_EQ(f.opt.v()[at + e], 0.0f);
        }
      }
      EXPECT_EQ(moved, static_cast<int>(std::llround(pr * kept))) << t.spec->name;
      EXPECT_LE(max_pruned, min_kept) << t.spec->name << ": pruned a larger block than it kept";
      moved_total += moved;
    }
    EXPECT_EQ(stats.moved, moved_total);
    EXPECT_GT(moved_total, 0);

    UpdateFixture again(B), other(B);
    train::update_patterns(again.m, again.opt, o, 3, 10, 77);
    train::update_patterns(other.m, other.opt, o, 3, 10, 78);
    EXPECT_EQ(all_slots(again.m), slots_after) << "B=" << B << ": same seed, other blocks";
    EXPECT_NE(all_slots(other.m), slots_after) << "B=" << B << ": other seed, same blocks";
  }
}

// Gradient regrow takes, among the blocks not active before, those where the step's dense weight
// gradient has the largest L1 norm.
// Gradient regrowth (at a step of the given precision): the blocks grown are the inactive ones of
// largest dense-gradient L1 norm.
void gradient_regrow_takes_the_largest_blocks(Precision precision) {
  SCOPED_TRACE(precision_name(precision));
  UpdateFixture f(4);
  const PackedBatch b = make_batch({{9, 3, 12}, {20}}, 25, small_config().vocab_size, 6);
  f.m.collect_block_grads(true);
  f.m.zero_grads();
  f.m.forward(b, {true, 41, 3, {}, precision});
  f.m.backward();
  const auto slots_before = all_slots(f.m);
  train::SparseOptions o;
  o.sparsity = {4, 0.5};
  o.regrow = train::Regrow::gradient;
  train::update_patterns(f.m, f.opt, o, 1, 10, 5);
  const auto slots_after = all_slots(f.m);
  int64_t t_index = 0;
  for (const SparseTensor& t : f.m.sparse_tensors()) {
    const auto& r0 = slots_before[2 * t_index];
    const auto& c0 = slots_before[2 * t_index + 1];
    const auto& r1 = slots_after[2 * t_index];
    const auto& c1 = slots_after[2 * t_index + 1];
    ++t_index;
    const LayerBlockGrads& g = f.m.block_grads()[t.layer];
    const LayerPatterns& lp = f.m.patterns()[t.layer];
    const std::vector<float>& norms = t.pattern == &lp.qkv        ? g.qkv
                                      : t.pattern == &lp.attn_out ? g.attn_out
                                      : t.pattern == &lp.inter    ? g.inter
                                                                  : g.out;
    const int Cb = static_cast<int>(t.spec->shape[1]) / 4;
    auto norm = [&](int r, int c) { return norms[static_cast<size_t>(r + t.first_row) * Cb + c]; };
    std::set<std::pair<int, int>> old_blocks, grown;
    for (size_t j = 0; j < r0.size(); ++j) old_blocks.insert({r0[j], c0[j]});
    for (size_t j = 0; j < r1.size(); ++j)
      if (!old_blocks.count({r1[j], c1[j]})) grown.insert({r1[j], c1[j]});
    ASSERT_FALSE(grown.empty()) << t.spec->name;
    float least_grown = 1e30f;
    for (auto [r, c] : grown) least_grown = std::min(least_grown, norm(r, c));
    EXPECT_GT(least_grown, 0.0f) << t.spec->name << ": the norms were not collected";
    for (int r = 0; r < static_cast<int>(t.spec->shape[0]) / 4; ++r)
      for (int c = 0; c < Cb; ++c)
        if (!old_blocks.count({r, c}) && !grown.count({r, c})) {
          EXPECT_LE(norm(r, c), least_grown) << t.spec->name << ": passed over a larger block";
        }
  }
}

TEST(SparseUpdate, GradientRegrowTakesTheLargestDenseGradientBlocks) {
  for (const Precision precision : step_precisions())
    gradient_regrow_takes_the_largest_blocks(precision);
}

}  // namespace
}  // namespace packbert::model
