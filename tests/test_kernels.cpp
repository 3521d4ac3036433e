// Kernels: the table-driven harness (every kernel case checked by finite differences in double,
// the += contract, the PyTorch golden, its 16-bit forms, and through the op seam the reference
// backend against finite differences and the golden and the cpu backend against the reference
// in every dtype), plus the properties the engine relies on (no
// cross-sequence attention, packed == separate, dropout masks independent of thread count,
// rebuilt values equal to kept ones), and float agreeing with double.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "kernel_cases.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/block_gemm.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layers.h"
#include "kernels/cpu/sparse.h"
#include "kernels/cpu_features.h"
#include "kernels/dropout.h"
#include "kernels/ops.h"
#include "kernels/optim.h"
#include "kernels/tensor.h"

namespace packbert::kernels {
namespace {

using Vec = std::vector<double>;

Vec random_vec(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

TEST(KernelAttention, NoCrossContaminationAndPackedEqualsSeparate) {
  std::mt19937 rng(7);
  const int C = 8, NH = 2;
  std::vector<int32_t> cu = {0, 5, 7, 12};
  const int T = 12;
  Vec qkv = random_vec(T * 3 * C, rng), out(T * C);
  Vec probs(attention_probs_offsets(cu.data(), 3, NH, 0).back());
  attention_forward(out.data(), probs.data(), qkv.data(), cu.data(), 3, C, NH, 0);
  for (int s = 0; s < 3; ++s) {  // each sequence alone
    int start = cu[s], L = cu[s + 1] - cu[s];
    std::vector<int32_t> one = {0, L};
    Vec q(qkv.begin() + start * 3 * C, qkv.begin() + (start + L) * 3 * C), o(L * C), p(NH * L * L);
    attention_forward(o.data(), p.data(), q.data(), one.data(), 1, C, NH, 0);
    for (int i = 0; i < L * C; ++i) EXPECT_EQ(o[i], out[start * C + i]);
  }
  Vec changed = qkv;  // perturb sequence 1 only: sequences 0 and 2 must not move
  for (int i = 5 * 3 * C; i < 7 * 3 * C; ++i) changed[i] += 1.0;
  Vec out2(T * C);
  attention_forward(out2.data(), probs.data(), changed.data(), cu.data(), 3, C, NH, 0);
  for (int t : {0, 1, 2, 3, 4, 7, 8, 9, 10, 11})
    for (int c = 0; c < C; ++c) EXPECT_EQ(out2[t * C + c], out[t * C + c]);
}

// Sliding-window attention: a token's output moves with the keys within window / 2 of it and
// with no other (a key just outside, in the same tile's band, or in another tile, changes
// nothing, bit for bit); packed equals separate; and a window reaching across every sequence
// is global attention bit for bit.
TEST(KernelAttention, SlidingWindowSeesOnlyItsWindowInItsOwnSequence) {
  std::mt19937 rng(8);
  const int C = 8, NH = 2, window = 10, half = window / 2;
  const std::vector<int32_t> cu = {0, 90, 97, 160};  // 90: three tiles; 7: whole; 63: two
  const int T = 160, n_seq = 3;
  const Vec qkv = random_vec(T * 3 * C, rng);
  Vec out(T * C), probs(attention_probs_offsets(cu.data(), n_seq, NH, window).back());
  attention_forward(out.data(), probs.data(), qkv.data(), cu.data(), n_seq, C, NH, window);
  for (int s = 0; s < n_seq; ++s) {
    const int start = cu[s], L = cu[s + 1] - cu[s];
    const std::vector<int32_t> one = {0, L};
    const Vec q(qkv.begin() + start * 3 * C, qkv.begin() + (start + L) * 3 * C);
    Vec o(L * C), p(attention_probs_offsets(one.data(), 1, NH, window).back());
    attention_forward(o.data(), p.data(), q.data(), one.data(), 1, C, NH, window);
    for (int i = 0; i < L * C; ++i) ASSERT_EQ(o[i], out[start * C + i]) << "sequence " << s;
  }
  // Query 40 of sequence 0 sees keys 35..45: move key (and value) 46, inside its tile's band
  // (32..63 sees 27..68), and key 34, and key 80 (another tile): row 40 stays; rows that see the
  // moved token move.
  for (const int moved : {46, 34, 80}) {
    Vec changed = qkv;
    for (int c = C; c < 3 * C; ++c) changed[moved * 3 * C + c] += 1.0;
    Vec out2(T * C);
    attention_forward(out2.data(), probs.data(), changed.data(), cu.data(), n_seq, C, NH, window);
    for (int c = 0; c < C; ++c) EXPECT_EQ(out2[40 * C + c], out[40 * C + c]) << "key " << moved;
    for (int t = 0; t < T; ++t) {
      const bool sees = t < 90 && std::abs(t - moved) <= half;
      bool same = true;
      for (int c = 0; c < C; ++c) same = same && out2[t * C + c] == out[t * C + c];
      EXPECT_EQ(same, !sees) << "row " << t << ", key " << moved;
    }
  }
  // A window reaching across every sequence (and the longest's band is the whole sequence):
  // global attention, bit for bit, probabilities and all.
  const int wide = 2 * 90;
  ASSERT_EQ(attention_probs_offsets(cu.data(), n_seq, NH, wide),
            attention_probs_offsets(cu.data(), n_seq, NH, kGlobalAttention));
  Vec wide_out(T * C), global_out(T * C), wide_p(probs.size() * 3), global_p(wide_p.size());
  attention_forward(wide_out.data(), wide_p.data(), qkv.data(), cu.data(), n_seq, C, NH, wide);
  attention_forward(global_out.data(), global_p.data(), qkv.data(), cu.data(), n_seq, C, NH,
                    kGlobalAttention);
  EXPECT_EQ(wide_out, global_out);
  EXPECT_EQ(wide_p, global_p);
}

// The probabilities a sliding window keeps grow with the window, not the sequence: at length 512
// and ModernBERT's window of 128, L * (tile + window) = 512 * 160 per head, against 512^2.
TEST(KernelAttention, SlidingWindowKeepsABandNotASquare) {
  const std::vector<int32_t> cu = {0, 512, 1024, 1030};
  const std::vector<int64_t> local = attention_probs_offsets(cu.data(), 3, 12, 128);
  const std::vector<int64_t> global = attention_probs_offsets(cu.data(), 3, 12, kGlobalAttention);
  EXPECT_EQ(local[1], 12 * 512 * (kAttentionTile + 128));
  EXPECT_EQ(local[3] - local[2], 12 * 6 * 6);  // a short sequence is seen whole
  EXPECT_EQ(global[1], 12 * 512 * 512);
  EXPECT_EQ(attention_band_start(0, 512, 128), 0);
  EXPECT_EQ(attention_band_start(100, 512, 128), 96 - 64);
  EXPECT_EQ(attention_band_start(511, 512, 128), 512 - 160);
}

TEST(KernelDropout, MaskIsDeterministicThreadIndependentAndUnbiased) {
  const int64_t n = 100000;
  std::vector<float> x(n, 1.0f), a(n), b(n), d(n, 0.0f);
  omp_set_num_threads(1);
  dropout_forward(a.data(), x.data(), n, 0.1, 42, dropout_key(3, 1, 2));
  omp_set_num_threads(2);
  dropout_forward(b.data(), x.data(), n, 0.1, 42, dropout_key(3, 1, 2));
  EXPECT_EQ(a, b);
  int64_t kept = 0;
  for (float v : a) kept += v != 0.0f;
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.9, 0.005);
  for (float v : a) EXPECT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.9f) < 1e-6f);
  dropout_backward(d.data(), x.data(), n, 0.1, 42, dropout_key(3, 1, 2));
  EXPECT_EQ(d, a);  // backward uses the forward's mask
  dropout_forward(b.data(), x.data(), n, 0.1, 42, dropout_key(4, 1, 2));
  EXPECT_NE(a, b);  // another step, another mask
}

TEST(KernelDropout, IntegerMaskEqualsUniformThreshold) {
  // The vectorised integer test must make exactly the decisions of dropout_uniform(...) >= p,
  // including p whose scaled value is not an integer and the extremes.
  for (double p : {0.0, 0.1, 0.5, 1.0 / 3.0, 0.999}) {
    const DropoutMask mask(7, dropout_key(5, 2, 1), p);
    for (uint64_t i = 0; i < 20000; ++i)
      ASSERT_EQ(mask.keep(i), dropout_uniform(7, dropout_key(5, 2, 1), i) >= p) << p << " " << i;
  }
}

TEST(KernelPrecision, FastExpAndErfAreAccurate) {
  double worst_exp = 0, worst_erf = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.01171875f) {
    const double e = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::abs(exp_fast(x) - e) / e);
  }
  for (float x = -6.0f; x <= 6.0f; x += 0.001953125f)
    worst_erf = std::max(worst_erf, std::abs(erf_fast(x) - std::erf(static_cast<double>(x))));
  EXPECT_LT(worst_exp, 5e-7);  // a few float ulps
  EXPECT_LT(worst_erf, 5e-7);  // A&S 7.1.26 bound (1.5e-7) plus float rounding near 1
}

TEST(KernelPrecision, FloatAgreesWithDouble) {
  std::mt19937 rng(8);
  const int C = 16, NH = 4;
  std::vector<int32_t> cu = {0, 6, 9};
  Vec qkv = random_vec(9 * 3 * C, rng), out(9 * C), probs(NH * (36 + 9));
  std::vector<float> qf(qkv.begin(), qkv.end()), of(9 * C), pf(probs.size());
  attention_forward(out.data(), probs.data(), qkv.data(), cu.data(), 2, C, NH, 0);
  attention_forward(of.data(), pf.data(), qf.data(), cu.data(), 2, C, NH, 0);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(of[i], out[i], 1e-5);
}

// ---------------------------------------------------------------------------------------------
// The kernel harness (tests/kernel_cases.h: the table). Every row is checked
//   fd:         backward in double against central differences of loss = sum_k out_k . R_k
//               over every element of every differentiable input;
//   accumulate: backward into gradient buffers already holding G0 gives G0 + the gradient (the
//               += contract, so a tensor used twice needs no special case);
//   golden:     where tests/golden/kernels.json has the kernel (tools/make_kernel_goldens.py,
//               PyTorch fp32), float forward and backward on its inputs against its outputs;
// and the 16-bit and backend columns below.

using namespace harness;
using Json = nlohmann::json;

using ForwardD = std::function<void(Env<double>&)>;

double loss_of(const KernelCase& c, const ForwardD& forward, Env<double>& e) {
  forward(e);
  double l = 0;
  for (const Tensor& t : c.outputs)
    for (size_t i = 0; i < t.size; ++i) l += e.x[t.name][i] * e.d["d" + t.name][i];
  return l;
}

// Column fd: double backward against central differences.
void check_finite_differences(const KernelCase& c, const ForwardD& forward,
                              const ForwardD& backward) {
  std::mt19937 rng(7);
  Env<double> e = make_env<double>(c, rng);
  forward(e);
  backward(e);
  const double h = 1e-5;
  for (const Tensor& t : c.inputs) {
    const std::vector<double> analytic = e.d["d" + t.name];
    for (size_t i = 0; i < t.size; ++i) {
      double& v = e.x[t.name][i];
      const double keep = v;
      v = keep + h;
      const double up = loss_of(c, forward, e);
      v = keep - h;
      const double down = loss_of(c, forward, e);
      v = keep;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic[i], numeric, c.fd_tol * (1 + std::abs(numeric)))
          << c.name << ": d" << t.name << "[" << i << "]";
    }
  }
}

// Column accumulate: backward adds to what the gradient buffers hold.
void check_accumulates(const KernelCase& c) {
  std::mt19937 rng(8);
  Env<double> e = make_env<double>(c, rng);
  c.forward_d(e);
  c.backward_d(e);
  std::map<std::string, std::vector<double>> fresh, before;
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const Tensor& t : c.inputs) {
    fresh[t.name] = e.d["d" + t.name];
    for (double& g : e.d["d" + t.name]) g = nd(rng);
    before[t.name] = e.d["d" + t.name];
  }
  c.forward_d(e);
  c.backward_d(e);
  for (const Tensor& t : c.inputs)
    for (size_t i = 0; i < t.size; ++i)
      ASSERT_NEAR(e.d["d" + t.name][i], before[t.name][i] + fresh[t.name][i], 1e-12)
          << c.name << ": d" << t.name << "[" << i << "] was overwritten, not accumulated";
}

// Column golden: float kernels on PyTorch's inputs against PyTorch's outputs and gradients.
void check_golden(const KernelCase& c, const std::function<void(Env<float>&)>& forward,
                  const std::function<void(Env<float>&)>& backward) {
  const Json& g = goldens()[c.golden];
  std::mt19937 rng(9);
  Env<float> e = make_env<float>(c, rng);
  for (const Tensor& t : c.inputs) e.x[t.name] = g.at(t.name).get<std::vector<float>>();
  for (const Tensor& t : c.outputs)
    e.d["d" + t.name] = g.at("d" + t.name).get<std::vector<float>>();
  auto close = [&](const std::vector<float>& got, const std::string& key) {
    const std::vector<float> want = g.at(key).get<std::vector<float>>();
    ASSERT_EQ(got.size(), want.size()) << c.name << ": " << key;
    double scale = 1.0;
    for (float v : want) scale = std::max(scale, static_cast<double>(std::abs(v)));
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * scale) << c.name << ": " << key << "[" << i << "]";
  };
  forward(e);
  for (const Tensor& t : c.outputs) close(e.x[t.name], t.name);
  backward(e);
  for (const Tensor& t : c.inputs) close(e.d["d" + t.name], "d" + t.name);
}

// Backend columns: the cpu backend against the reference on the same inputs, the op's tensors
// stored in dtype h. Every output and input gradient: within 1e-5 of the largest value
// elementwise in f32; in 16 bits within `tol` normwise, and (exact16) with no more than 3% of the
// elements apart by more than fp32 noise (a backend that rounded elsewhere, or not at all,
// differs in nearly all of them).
void check_backends_agree(const KernelCase& c, const Backend& cpu, DType h) {
  SCOPED_TRACE(std::string("the cpu backend built for ") + isa_name(cpu.isa) + ", " +
               dtype_name(h));
  std::mt19937 rng(12);
  Env<float> ref_env = make_env<float>(c, rng);
  Env<float> cpu_env = ref_env;
  c.ops_forward_f(backend(BackendKind::ref), h, ref_env);
  c.ops_backward_f(backend(BackendKind::ref), h, ref_env);
  c.ops_forward_f(cpu, h, cpu_env);
  c.ops_backward_f(cpu, h, cpu_env);
  const bool half = traits(h).is_16bit;
  const double tol = h == DType::bf16 ? 1e-2 : h == DType::f16 ? 2e-3 : 0.0;
  auto agree = [&](const std::vector<float>& got, const std::vector<float>& want,
                   const std::string& what) {
    double scale = 1e-30, d2 = 0, r2 = 0;
    for (float v : want) scale = std::max(scale, static_cast<double>(std::abs(v)));
    int64_t apart = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = static_cast<double>(got[i]) - want[i];
      d2 += d * d;
      r2 += static_cast<double>(want[i]) * want[i];
      if (std::abs(d) > 1e-5 * scale) {
        ++apart;
        if (!half)
          ADD_FAILURE() << c.name << ": " << what << "[" << i << "] cpu " << got[i] << ", ref "
                        << want[i];
      }
    }
    EXPECT_GT(r2, 0.0) << c.name << ": " << what << " is all zero";
    if (!half) return;
    EXPECT_LE(std::sqrt(d2), tol * std::sqrt(r2)) << c.name << ": " << what;
    if (c.exact16) {
      EXPECT_LE(apart, static_cast<int64_t>(want.size()) * 3 / 100 + 1)
          << c.name << ": " << what << ": " << apart << " of " << want.size()
          << " elements apart beyond fp32 noise";
    }
  };
  for (const Tensor& t : c.outputs) agree(cpu_env.x[t.name], ref_env.x[t.name], t.name);
  for (const Tensor& t : c.inputs)
    agree(cpu_env.d["d" + t.name], ref_env.d["d" + t.name], "d" + t.name);
}

// Columns bf16 and fp16: the row's 16-bit path against its fp32 path on the same inputs: every
// output and every input gradient within `tol` normwise (bf16 keeps 8 significant bits: 2^-9
// relative rounding per value, a few 1e-3 through a dot product: 1e-2; fp16 keeps 11: 2e-3).
void check_16bit_column(const KernelCase& c, const std::function<void(Env<float>&)>& forward,
                        const std::function<void(Env<float>&)>& backward, double tol) {
  std::mt19937 rng(11);
  Env<float> f = make_env<float>(c, rng);
  Env<float> b = f;
  c.forward_f(f);
  c.backward_f(f);
  forward(b);
  backward(b);
  auto normwise = [&](const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      d2 += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
      r2 += static_cast<double>(want[i]) * want[i];
    }
    EXPECT_LE(std::sqrt(d2), tol * std::sqrt(r2)) << c.name << ": " << what;
    EXPECT_GT(r2, 0.0) << c.name << ": " << what << " is all zero";
  };
  for (const Tensor& t : c.outputs) normwise(b.x[t.name], f.x[t.name], t.name);
  for (const Tensor& t : c.inputs) normwise(b.d["d" + t.name], f.d["d" + t.name], "d" + t.name);
}

class KernelHarness : public ::testing::TestWithParam<KernelCase> {};

TEST_P(KernelHarness, FiniteDifferences) {
  check_finite_differences(GetParam(), GetParam().forward_d, GetParam().backward_d);
}
TEST_P(KernelHarness, BackwardAccumulates) {
  check_accumulates(GetParam());
}
TEST_P(KernelHarness, Bf16PathMatchesFp32Path) {
  if (!GetParam().forward_b) GTEST_SKIP() << "runs in fp32 under --precision bf16";
  if (GetParam().name.rfind("linear", 0) == 0 && !bf16_unavailable_reason().empty())
    GTEST_SKIP() << bf16_unavailable_reason();
  check_16bit_column(GetParam(), GetParam().forward_b, GetParam().backward_b, 1e-2);
}
// fp16 needs no bf16 instruction: its GEMMs widen to fp32.
TEST_P(KernelHarness, Fp16PathMatchesFp32Path) {
  if (!GetParam().forward_h) GTEST_SKIP() << "runs in fp32 under --precision fp16";
  check_16bit_column(GetParam(), GetParam().forward_h, GetParam().backward_h, 2e-3);
}
TEST_P(KernelHarness, MatchesPyTorchGolden) {
  if (GetParam().golden.empty()) GTEST_SKIP() << "no PyTorch golden for this case";
  check_golden(GetParam(), GetParam().forward_f, GetParam().backward_f);
}

// The backend columns. Every row has one (a test of the table below).
const Backend& ref_backend() {
  return backend(BackendKind::ref);
}
// The reference backend through the seam: finite differences in double, and the PyTorch golden
// where the row has one.
TEST_P(KernelHarness, RefBackendMatchesFiniteDifferencesAndGolden) {
  const KernelCase& c = GetParam();
  check_finite_differences(
      c, [&](Env<double>& e) { c.ops_forward_d(ref_backend(), DType::f64, e); },
      [&](Env<double>& e) { c.ops_backward_d(ref_backend(), DType::f64, e); });
  if (!c.golden.empty())
    check_golden(
        c, [&](Env<float>& e) { c.ops_forward_f(ref_backend(), DType::f32, e); },
        [&](Env<float>& e) { c.ops_backward_f(ref_backend(), DType::f32, e); });
}
// Each build of the cpu backend this CPU runs (its own instruction set's and, on an AVX-512 CPU,
// the AVX2 one: cpu/isa.h) against the reference in f32 and, for an op with 16-bit forms, in
// bf16 and f16 (bf16 linear layers need the CPU's bf16 products: said, not skipped silently).
TEST_P(KernelHarness, CpuBackendMatchesRefInEachDType) {
  const KernelCase& c = GetParam();
  for (const Backend* cpu : cpu_backends()) {
    check_backends_agree(c, *cpu, DType::f32);
    if (!c.halves) continue;
    check_backends_agree(c, *cpu, DType::f16);
    if (c.name.rfind("linear", 0) == 0 && !bf16_unavailable_reason().empty()) {
      std::cout << "  bf16 not compared: " << bf16_unavailable_reason() << "\n";
      continue;
    }
    check_backends_agree(c, *cpu, DType::bf16);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, KernelHarness, ::testing::ValuesIn(kernel_cases(golden_shapes())),
                         [](const ::testing::TestParamInfo<KernelCase>& info) {
                           std::string n;
                           for (char ch : info.param.name) n += std::isalnum(ch) ? ch : '_';
                           return n;
                         });

// One traits row per DType: sizes, names, and row conversions that round as the scalar ones do.
TEST(KernelTypes, TraitsRowsConvertAsTheScalarConversions) {
  const std::vector<float> x = {
      1.0f,       -0.0f, 3.14159265f, 65519.0f,
      65520.0f,   1e-8f, -2.5e-6f,    std::numeric_limits<float>::infinity(),
      1.00390625f};
  for (const DType t : kDTypes) {
    const DTypeTraits& r = traits(t);
    std::vector<unsigned char> bytes(x.size() * r.bytes);
    std::vector<float> back(x.size());
    r.narrow(bytes.data(), x.data(), static_cast<int64_t>(x.size()));
    r.widen(back.data(), bytes.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(back[i], static_cast<float>(round_to(t, x[i]))) << r.name << " of " << x[i];
  }
  EXPECT_EQ(traits(DType::bf16).bytes, 2u);
  EXPECT_EQ(traits(DType::f64).bytes, 8u);
  EXPECT_STREQ(dtype_name(DType::f16), "f16");
  EXPECT_TRUE(traits(DType::bf16).is_16bit && !traits(DType::f32).is_16bit);
  EXPECT_EQ(round_to(DType::bf16, 1.00390625), 1.0);  // a tie, to even
  EXPECT_EQ(round_to(DType::f16, 65520.0), std::numeric_limits<double>::infinity());
}

// A View reads and writes its elements in its own dtype, through its leading dimension.
TEST(KernelTypes, ViewsIndexThroughTheLeadingDimensionAndRoundOnWrite) {
  std::vector<bf16> m(2 * 5);
  View v(m.data(), 2, 3, 5);
  EXPECT_EQ(v.dtype, DType::bf16);
  EXPECT_FALSE(v.contiguous());
  v.set(1, 2, 1.00390625);
  EXPECT_EQ(m[7].bits, to_bf16(1.0f).bits);
  EXPECT_EQ(v.get(1, 2), 1.0);
  std::vector<double> d = {1, 2, 3, 4, 5, 6};
  const View w = View::vector(d.data(), 6);
  EXPECT_EQ(w.dtype, DType::f64);
  EXPECT_EQ(w.numel(), 6);
  w.put(5, 0.1);
  EXPECT_EQ(d[5], 0.1);
  EXPECT_FALSE(View());
}

// The seam's table: every backend named, each op present, unknown names refused.
TEST(KernelTypes, BackendsAreChosenByNameInOnePlace) {
  for (const BackendKind k : kBackendKinds) {
    const Backend& b = backend(k);
    EXPECT_EQ(b.kind, k);
    EXPECT_EQ(parse_backend(b.name), k);
#define PACKBERT_EXPECT_OP(op) EXPECT_NE(b.op, nullptr) << b.name << " lacks " #op;
    PACKBERT_OPS(PACKBERT_EXPECT_OP)
#undef PACKBERT_EXPECT_OP
  }
  EXPECT_NE(backend(BackendKind::cpu).linear_forward, backend(BackendKind::ref).linear_forward);
  EXPECT_THROW(parse_backend("cuda"), std::invalid_argument);
  // The cpu rows: the chosen one first, each a different build, none beyond what the CPU has.
  const std::vector<const Backend*> builds = cpu_backends();
  ASSERT_FALSE(builds.empty());
  EXPECT_EQ(builds.front(), &backend(BackendKind::cpu));
  for (size_t i = 0; i < builds.size(); ++i) {
    EXPECT_EQ(builds[i]->kind, BackendKind::cpu);
    EXPECT_LE(builds[i]->isa, cpu_features().level());
    if (i > 0) {
      EXPECT_LT(builds[i]->isa, builds[i - 1]->isa);
      EXPECT_NE(builds[i]->linear_forward, builds[i - 1]->linear_forward);
    }
  }
  // Any CPU with AVX2 runs an AVX2 build: the build's own, or the one CMakeLists.txt compiles
  // beside an AVX-512 or a generic (sanitizer) build.
  if (cpu_features().avx2) {
    EXPECT_TRUE(std::any_of(builds.begin(), builds.end(),
                            [](const Backend* b) { return b->isa == Isa::avx2; }))
        << builds.size() << " builds, the first for " << isa_name(builds.front()->isa);
  }
  EXPECT_NE(kernel_isa().find(isa_name(builds.front()->isa)), std::string::npos) << kernel_isa();
}

// PACKBERT_MAX_ISA's names; a bad one refused naming what is accepted.
TEST(KernelTypes, InstructionSetCapsParseByName) {
  for (const Isa i : {Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::amx})
    EXPECT_EQ(parse_isa(isa_name(i)), i);
  try {
    parse_isa("avx3");
    ADD_FAILURE() << "avx3 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'avx3' (expected avx2, avx512, avx512_bf16 or amx)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_isa("sse2"), std::invalid_argument);  // not a cap: nothing runs below AVX2
}

// n draws of N(0, 1), each call the next ones of the seed's stream.
struct Normals {
  std::mt19937 rng;
  std::normal_distribution<float> nd{0.0f, 1.0f};
  explicit Normals(uint32_t seed) : rng(seed) {}
  std::vector<float> operator()(size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
  }
};

// The seam's ops outside the harness's table (no gradient of their own): a build of the cpu
// backend against the reference, in f32 and each 16-bit type where the op takes one. `h`'s
// products (linear_block_grad_norms) are compared only where `gemms` (bf16 where oneDNN cannot
// build its matmul: the caller skips, naming why).
void check_ops_without_gradients(const Backend& cpu, DType h, bool gemms) {
  SCOPED_TRACE(std::string("the cpu backend built for ") + isa_name(cpu.isa));
  SCOPED_TRACE(dtype_name(h));
  const Backend& ref = backend(BackendKind::ref);
  Normals randoms(31);
  const int N = 13, C = 16, OC = 24, B = 8;
  const std::vector<float> in = randoms(N * C), dout = randoms(N * OC), w = randoms(C),
                           b = randoms(C);
  Env<float> stored;  // the input as stored in h
  stored.x["in"] = in;
  const Stored<float> x(stored, "in", N, C, h);
  if (gemms) {
    // linear_block_grad_norms: the L1 norms of the dense gradient's 8 x 8 blocks.
    std::vector<float> l1_cpu((OC / B) * (C / B), 0.5f), l1_ref = l1_cpu;
    cpu.linear_block_grad_norms(View(l1_cpu.data(), OC / B, C / B), View(dout.data(), N, OC), x, B,
                                View(), View());
    ref.linear_block_grad_norms(View(l1_ref.data(), OC / B, C / B), View(dout.data(), N, OC), x, B,
                                View(), View());
    for (size_t i = 0; i < l1_ref.size(); ++i)
      EXPECT_NEAR(l1_cpu[i], l1_ref[i], 1e-5 * l1_ref[i]) << "block " << i;
  }
  // layernorm_apply rebuilds layernorm_forward's output, on each backend, from the statistics.
  for (const Backend* be : {&cpu, &ref}) {
    std::vector<float> mean(N), rstd(N), out(N * C), again(N * C);
    const View w_(View::vector(w.data(), C)), b_(View::vector(b.data(), C));
    be->layernorm_forward(View(out.data(), N, C), View::vector(mean.data(), N),
                          View::vector(rstd.data(), N), x, w_, b_, 1e-12, View());
    be->layernorm_apply(View(again.data(), N, C), x, View::vector(mean.data(), N),
                        View::vector(rstd.data(), N), w_, b_, View());
    EXPECT_EQ(out, again) << be->name;
  }
  // convert: rounds as the traits row does.
  std::vector<uint16_t> c16_cpu(N * C), c16_ref(N * C);
  View out_cpu = View::vector(in.data(), N * C), out_ref = out_cpu;
  if (traits(h).is_16bit) {
    out_cpu.data = c16_cpu.data(), out_ref.data = c16_ref.data();
    out_cpu.dtype = out_ref.dtype = h;
    cpu.convert(out_cpu, View::vector(in.data(), N * C));
    ref.convert(out_ref, View::vector(in.data(), N * C));
    EXPECT_EQ(c16_cpu, c16_ref);
    // gather_rows_forward from a 16-bit table into f32 rows (ModernBERT's word table under
    // 16-bit master weights): the picked rows, each value widened exactly.
    const View table = out_cpu.shaped(N, C);
    const std::vector<int32_t> rows = {3, 0, 12, 3, 7};
    const int R = static_cast<int>(rows.size());
    std::vector<float> g_cpu(R * C, -1.0f), g_ref = g_cpu;
    cpu.gather_rows_forward(View(g_cpu.data(), R, C), table, rows.data());
    ref.gather_rows_forward(View(g_ref.data(), R, C), table, rows.data());
    EXPECT_EQ(g_cpu, g_ref);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c)
        ASSERT_EQ(g_cpu[r * C + c], static_cast<float>(table.at(int64_t{rows[r]} * C + c)))
            << r << ", " << c;
  }
}

// count_argmax_hits and zero, on a build of the cpu backend against the reference.
void check_argmax_and_zero(const Backend& cpu) {
  SCOPED_TRACE(std::string("the cpu backend built for ") + isa_name(cpu.isa));
  const Backend& ref = backend(BackendKind::ref);
  Normals randoms(37);
  const int N = 13, C = 16, OC = 24;
  // count_argmax_hits: ties go to the first maximum; rows without a target are not counted.
  std::vector<float> scores = randoms(N * OC);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) {
    targets[n] = n % 4 == 3 ? -1 : static_cast<int32_t>(randoms.rng() % OC);
    if (n % 2 == 0 && targets[n] >= 0) scores[n * OC + targets[n]] = 9.0f;  // a hit
    if (n % 6 == 0) scores[n * OC + 0] = 9.0f;  // a tie, won by column 0
  }
  const View sv(scores.data(), N, OC);
  EXPECT_EQ(cpu.count_argmax_hits(sv, targets.data()), ref.count_argmax_hits(sv, targets.data()));
  EXPECT_GT(ref.count_argmax_hits(sv, targets.data()), 2);
  std::vector<float> z = randoms(N * C), z2 = z;
  cpu.zero(View(z.data(), N, C));
  ref.zero(View(z2.data(), N, C));
  EXPECT_EQ(z, std::vector<float>(N * C, 0.0f));
  EXPECT_EQ(z2, z);
}

TEST(KernelBackends, OpsWithoutGradientsAgreeWithTheReference) {
  for (const Backend* cpu : cpu_backends()) {
    for (const DType h : {DType::f32, DType::f16}) check_ops_without_gradients(*cpu, h, true);
    check_argmax_and_zero(*cpu);
  }
}

// bf16: everything but the products runs on any CPU; the products where oneDNN builds them
// (skipped, and named, where it cannot: an AVX2-only CPU).
TEST(KernelBackends, OpsWithoutGradientsAgreeWithTheReferenceInBf16) {
  const std::string why = bf16_unavailable_reason();
  for (const Backend* cpu : cpu_backends())
    check_ops_without_gradients(*cpu, DType::bf16, why.empty());
  if (!why.empty()) GTEST_SKIP() << "bf16 products not compared: " << why;
}

// Rotary in place on q | k inside q | k | v (ModernBERT's use: rows 3C apart, v untouched) is the
// rotation of the contiguous q | k, forward and backward, on every cpu build (f32, and bf16 /
// f16 as stored) and on the reference backend.
TEST(KernelBackends, RotaryOnRowsOfAWiderMatrixIsTheContiguousRotation) {
  std::mt19937 rng(61);
  const int N = 7, NH = 3, D = 8, C = NH * D;
  std::vector<int32_t> pos = {0, 1, 2, 0, 1, 5, 40};
  std::vector<const Backend*> backends = cpu_backends();
  backends.push_back(&backend(BackendKind::ref));
  for (const Backend* be : backends)
    for (const DType t : {DType::f32, DType::bf16, DType::f16}) {
      if (t != DType::f32 && be->kind == BackendKind::ref) continue;
      SCOPED_TRACE(std::string(be->name) + " " + dtype_name(t));
      const Vec x = random_vec(static_cast<size_t>(N) * 3 * C, rng);
      Buffer qkv(host_device(), t, N * 3 * C), qk(host_device(), t, N * 2 * C);
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < 3 * C; ++c) {
          qkv.view().put(n * 3 * C + c, x[n * 3 * C + c]);
          if (c < 2 * C) qk.view().put(n * 2 * C + c, x[n * 3 * C + c]);
        }
      std::vector<double> stored(static_cast<size_t>(N) * 3 * C);  // x as t holds it
      for (size_t i = 0; i < stored.size(); ++i) stored[i] = qkv.view().at(static_cast<int64_t>(i));
      View strided = qkv.view().shaped(N, 3 * C);
      strided.cols = 2 * C;
      be->rotary_forward(strided, strided, pos.data(), 2 * NH, 10000.0);
      const View dense = qk.view().shaped(N, 2 * C);
      be->rotary_forward(dense, dense, pos.data(), 2 * NH, 10000.0);
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < 3 * C; ++c)
          ASSERT_EQ(qkv.view().at(n * 3 * C + c),
                    c < 2 * C ? qk.view().at(n * 2 * C + c) : stored[n * 3 * C + c])
              << "row " << n << " column " << c;
      if (t != DType::f32) continue;  // gradients are f32 / f64
      Buffer g(host_device(), t, N * 3 * C), gd(host_device(), t, N * 2 * C);
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < 3 * C; ++c) {
          g.view().put(n * 3 * C + c, x[n * 3 * C + c] - 0.5);
          if (c < 2 * C) gd.view().put(n * 2 * C + c, x[n * 3 * C + c] - 0.5);
        }
      View gs = g.view().shaped(N, 3 * C);
      gs.cols = 2 * C;
      be->rotary_backward(gs, gs, pos.data(), 2 * NH, 10000.0, GradWrite::overwrite);
      const View gdense = gd.view().shaped(N, 2 * C);
      be->rotary_backward(gdense, gdense, pos.data(), 2 * NH, 10000.0, GradWrite::overwrite);
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < 3 * C; ++c)
          ASSERT_EQ(g.view().at(n * 3 * C + c),
                    c < 2 * C ? gd.view().at(n * 2 * C + c)
                              : static_cast<double>(static_cast<float>(x[n * 3 * C + c] - 0.5)))
              << "gradient row " << n << " column " << c;
    }
}

// The gradients a pipeline's stages leave out (the tied MLM decoder: the last stage forms no
// weight gradient, the first stage no bias gradient): linear_backward without dweight writes the
// same dinp and dbias as with it, and cross_entropy_backward into 16 bits without dbias the
// same dlogits, on each backend, in fp32 and with 16-bit operands.
TEST(KernelBackends, GradientsLeftOutLeaveTheOthersAsTheyAre) {
  Normals randoms(41);
  const int N = 11, C = 16, OC = 40;
  const std::vector<float> in = randoms(N * C), w = randoms(OC * C), dout = randoms(N * OC);
  std::vector<const Backend*> backends = cpu_backends();
  backends.push_back(&backend(BackendKind::ref));
  // The cpu backend's bf16 products need oneDNN's bf16 matmul: skipped, and named, without it.
  const std::string no_bf16 = bf16_unavailable_reason();
  for (const Backend* be : backends) {
    SCOPED_TRACE(std::string(be->name) + " " + isa_name(be->isa));
    for (const DType h : {DType::f32, DType::bf16, DType::f16}) {
      if (h == DType::bf16 && be->kind != BackendKind::ref && !no_bf16.empty()) continue;
      SCOPED_TRACE(dtype_name(h));
      Env<float> env;
      env.x["in"] = in, env.x["w"] = w;
      const Stored<float> x(env, "in", N, C, h), wt(env, "w", OC, C, h);
      std::vector<float> dinp_a(N * C, 0.5f), dinp_b = dinp_a, dw(OC * C, 0.0f), db_a(OC, 0.25f),
                                              db_b = db_a;
      std::vector<uint16_t> scratch(N * OC);
      View sc;
      if (h != DType::f32)
        sc.data = scratch.data(), sc.dtype = h, sc.rows = N, sc.cols = sc.ld = OC;
      be->linear_backward(View(dinp_a.data(), N, C), View(dw.data(), OC, C),
                          View(db_a.data(), 1, OC), View(dout.data(), N, OC), x, wt, nullptr,
                          GradWrite::accumulate, sc);
      be->linear_backward(View(dinp_b.data(), N, C), View(), View(db_b.data(), 1, OC),
                          View(dout.data(), N, OC), x, wt, nullptr, GradWrite::accumulate, sc);
      EXPECT_EQ(dinp_a, dinp_b);
      EXPECT_EQ(db_a, db_b);
      EXPECT_NE(dw, std::vector<float>(OC * C, 0.0f));
    }
    // The logits' gradient in 16 bits, with and without the bias gradient beside it.
    const int V = 300;
    const std::vector<float> logits = randoms(N * V);
    std::vector<float> losses(N), lse(N), dl(N, 0.125f), db(V, 0.0f);
    std::vector<int32_t> targets(N);
    for (int n = 0; n < N; ++n) targets[n] = n == 3 ? -100 : (n * 37) % V;
    be->cross_entropy_forward(View(losses.data(), 1, N), View(lse.data(), 1, N),
                              View(logits.data(), N, V), targets.data());
    std::vector<bf16> with(N * V), without(N * V, to_bf16(3.0f));
    be->cross_entropy_backward(View(with.data(), N, V), View(db.data(), 1, V),
                               View(logits.data(), N, V), View(lse.data(), 1, N), targets.data(),
                               View(dl.data(), 1, N), GradWrite::overwrite);
    be->cross_entropy_backward(View(without.data(), N, V), View(), View(logits.data(), N, V),
                               View(lse.data(), 1, N), targets.data(), View(dl.data(), 1, N),
                               GradWrite::overwrite);
    EXPECT_EQ(std::memcmp(with.data(), without.data(), with.size() * sizeof(bf16)), 0);
  }
  if (!no_bf16.empty())
    GTEST_SKIP() << "f32 and f16 compared; the cpu backend's bf16 linear_backward not: " << no_bf16;
}

// The optimizer ops: three AdamW and LAMB updates on each backend from the same state, with fp32
// weights (and their bf16 copy) and with bf16 masters rounded to nearest or stochastically:
// cpu's float arithmetic against ref's double within float rounding, and (16 bits) within a
// bf16 ulp where a rounding flips, in at most a few elements.
TEST(KernelBackends, OptimizerUpdatesAgreeWithTheReference) {
  const int64_t n = 3000;
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w0(n), g(n);
  for (float& x : w0) x = 0.5f * nd(rng);
  for (float& x : g) x = nd(rng);
  for (const bool lamb : {false, true})
    for (const int masters : {0, 1, 2}) {  // fp32 (+ bf16 copy), bf16 nearest, bf16 stochastic
      SCOPED_TRACE(std::string(lamb ? "lamb" : "adamw") + " masters " + std::to_string(masters));
      auto run = [&](const Backend& be) {
        std::vector<float> w = w0, m(n, 0.0f), v(n, 0.0f);
        std::vector<bf16> w16(n), m16(n), v16(n), copy(n);
        to_bf16(w16.data(), w0.data(), n);
        const bool half = masters > 0;
        const View p = half ? View::vector(w16.data(), n) : View::vector(w.data(), n);
        const View pc = half ? View() : View::vector(copy.data(), n);
        const View mv = half ? View::vector(m16.data(), n) : View::vector(m.data(), n);
        const View vv = half ? View::vector(v16.data(), n) : View::vector(v.data(), n);
        int64_t bad = 0;
        for (int t = 1; t <= 3; ++t) {
          std::vector<float> grad = g;
          for (float& x : grad) x *= static_cast<float>(t);
          const AdamStep k{1e-2, 0.9, 0.999, 1e-6, 1 - std::pow(0.9, t), 1 - std::pow(0.999, t),
                           0.01, 0.5f};
          const MasterRounding r{masters == 2, 99, static_cast<uint64_t>(t), 1000};
          const View gv = View::vector(grad.data(), n);
          if (!lamb) {
            bad += be.adamw_update(p, pc, mv, vv, gv, k, r);
          } else {
            const SquaredNorms s = be.lamb_direction(p, gv, mv, vv, k, r);
            EXPECT_GT(s.weights, 0.0);
            bad += be.lamb_apply(p, pc, gv, k.lr * std::sqrt(s.weights / s.direction), r);
          }
        }
        EXPECT_EQ(bad, 0);
        std::vector<float> out(n);
        for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p.at(i));
        if (!half) {
          for (int64_t i = 0; i < n; ++i) EXPECT_EQ(copy[i].bits, to_bf16(w[i]).bits) << i;
        }
        return out;
      };
      const std::vector<float> r = run(backend(BackendKind::ref));
      for (const Backend* cpu : cpu_backends()) {
        SCOPED_TRACE(std::string("the cpu backend built for ") + isa_name(cpu->isa));
        const std::vector<float> c = run(*cpu);
        int64_t apart = 0, moved = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double d = std::abs(static_cast<double>(c[i]) - r[i]);
          moved += c[i] != w0[i];
          if (masters == 0) {
            EXPECT_LE(d, 2e-6 * (1 + std::abs(r[i]))) << i;
          } else {
            EXPECT_LE(d, std::ldexp(std::abs(r[i]), -7) + 1e-30) << i;  // a bf16 ulp at most
            apart += d > 0;
          }
        }
        EXPECT_GT(moved, n / 2);
        EXPECT_LE(apart, n / 50) << apart << " of " << n << " bf16 weights apart";
      }
    }
}

// The rebuild of LayerNorm's output (recompute policy `ln`) is the kept output bit for bit.
// Round to nearest even, as VCVTNEPS2BF16 and oneDNN round: ties go to the even mantissa, NaN
// stays NaN, overflow goes to infinity, and bf16 values convert back exactly.
TEST(KernelBf16, RoundsToNearestEvenAndKeepsSpecialValues) {
  auto bits = [](float x) { return to_bf16(x).bits; };
  EXPECT_EQ(bits(1.0f), 0x3f80);
  EXPECT_EQ(bits(-2.0f), 0xc000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0); 1 + 3 * 2^-8 to 1 + 2^-6.
  EXPECT_EQ(bits(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(bits(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above halfway: up
  EXPECT_EQ(bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the largest bf16
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::bit_cast<float>(0x7f800001u)))));  // signalling
  for (uint32_t b = 0; b < 0x7f80; b += 7) {  // every 7th finite positive bf16
    const float x = std::bit_cast<float>(b << 16);
    EXPECT_EQ(bits(x), b);
  }
  std::vector<float> in = {0.1f, -3.3f, 1e-30f, 65504.0f}, back(4);
  std::vector<bf16> mid(4);
  to_bf16(mid.data(), in.data(), 4);
  to_float(back.data(), mid.data(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(back[i], in[i], std::abs(in[i]) * 0x1p-8f);
}

// The bf16 GEMM equals the double product of its (bf16) operands up to fp32 accumulation, for
// every transpose, strided operands, alpha and both betas; also for a product wider than the
// column blocks the bf16 backend cuts it into (4,096).
template <typename H>
void check_gemm_is_the_exact_product(int M = 37, int N = 29, int K = 53) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int pad = 3;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const float alpha : {1.0f, 0.5f})
        for (const float beta : {0.0f, 1.0f}) {
          const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
          std::vector<H> A(static_cast<size_t>(lda) * (ta ? K : M)),
              B(static_cast<size_t>(ldb) * (tb ? N : K));
          for (H& a : A) a = to_half<H>(nd(rng));
          for (H& b : B) b = to_half<H>(nd(rng));
          std::vector<float> C(static_cast<size_t>(ldc) * M);
          for (float& c : C) c = nd(rng);
          const std::vector<float> C0 = C;
          gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j) {
              double want = 0, mag = 0;
              for (int k = 0; k < K; ++k) {
                const double a = to_float(ta ? A[k * lda + i] : A[i * lda + k]);
                const double b = to_float(tb ? B[j * ldb + k] : B[k * ldb + j]);
                want += a * b;
                mag += std::abs(a * b);
              }
              want = alpha * want + beta * C0[i * ldc + j];
              EXPECT_NEAR(C[i * ldc + j], want, 1e-5 * (mag + std::abs(C0[i * ldc + j])) + 1e-6)
                  << "ta=" << ta << " tb=" << tb << " alpha=" << alpha << " beta=" << beta
                  << " at (" << i << ", " << j << ")";
            }
        }
}

TEST(KernelBf16, GemmMatchesTheExactProductOfItsOperands) {
  if (!bf16_unavailable_reason().empty()) GTEST_SKIP() << bf16_unavailable_reason();
  check_gemm_is_the_exact_product<bf16>();
  check_gemm_is_the_exact_product<bf16>(3, 2 * 4096 + 29, 5);
}

// The wide bf16 linear forward (the MLM decoder's shape, cut into column blocks) equals the
// double product plus bias, into fp32 and into bf16 (rounded once).
TEST(KernelBf16, WideLinearForwardMatchesTheExactProduct) {
  if (!bf16_unavailable_reason().empty()) GTEST_SKIP() << bf16_unavailable_reason();
  const int N = 5, C = 7, OC = 2 * 4096 + 29;
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<bf16> x(static_cast<size_t>(N) * C), w(static_cast<size_t>(OC) * C);
  for (bf16& a : x) a = to_bf16(nd(rng));
  for (bf16& a : w) a = to_bf16(nd(rng));
  std::vector<float> bias(OC), out(static_cast<size_t>(N) * OC, NAN);
  for (float& b : bias) b = nd(rng);
  std::vector<bf16> out16(out.size());
  linear_forward(out.data(), x.data(), w.data(), bias.data(), N, C, OC);
  linear_forward(out16.data(), x.data(), w.data(), bias.data(), N, C, OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double want = bias[o], mag = std::abs(bias[o]);
      for (int c = 0; c < C; ++c) {
        const double p = static_cast<double>(to_float(x[n * C + c])) * to_float(w[o * C + c]);
        want += p, mag += std::abs(p);
      }
      const size_t i = static_cast<size_t>(n) * OC + o;
      ASSERT_NEAR(out[i], want, 1e-5 * mag + 1e-6) << n << ", " << o;
      ASSERT_NEAR(to_float(out16[i]), want, 0x1p-8 * std::abs(want) + 1e-5 * mag + 1e-6)
          << n << ", " << o;
    }
}
// The fp16 GEMM (operands widened to fp32 for sgemm) likewise, on any CPU.
TEST(KernelF16, GemmMatchesTheExactProductOfItsOperands) {
  check_gemm_is_the_exact_product<f16>();
}

// fp16 conversion rounds as IEEE binary16 does (the compiler's _Float16 conversion: round to
// nearest even, through subnormals, overflow to infinity) and widens exactly: every binary16
// value round-trips, every midpoint between neighbours (a tie) and the floats either side of it
// round as _Float16 does, and so do a million random bit patterns across the whole float range.
TEST(KernelF16, ConvertsExactlyAsIeeeBinary16) {
  auto reference = [](float x) { return std::bit_cast<uint16_t>(static_cast<_Float16>(x)); };
  auto agree = [&](float x) {
    if (std::isnan(x)) return std::isnan(to_float(to_f16(x)));
    return to_f16(x).bits == reference(x);
  };
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float want = static_cast<float>(std::bit_cast<_Float16>(bits));
    const float x = to_float(f16{bits});
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(x)) << std::hex << b;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(x), std::bit_cast<uint32_t>(want)) << std::hex << b;
    ASSERT_EQ(to_f16(x).bits, b) << "round trip of " << x;
    if ((b & 0x7fffu) >= 0x7bffu) continue;  // no finite neighbour above
    const float next = to_float(f16{static_cast<uint16_t>(b + 1)});
    const float mid = static_cast<float>((static_cast<double>(x) + next) / 2);  // exact
    for (const float y : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2 * next)})
      ASSERT_TRUE(agree(y)) << y << ": " << to_f16(y).bits << " vs " << reference(y);
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 1000000; ++i) {
    const float y = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    ASSERT_TRUE(agree(y)) << y << ": " << to_f16(y).bits << " vs " << reference(y);
  }
  EXPECT_EQ(to_f16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(to_f16(65519.99f).bits, 0x7bff);
  EXPECT_EQ(to_f16(65520.0f).bits, 0x7c00);  // the tie above the largest finite: infinity
  EXPECT_EQ(to_f16(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  EXPECT_EQ(to_f16(-0.0f).bits, 0x8000);
  EXPECT_EQ(to_f16(0x1p-24f).bits, 0x0001);    // the smallest subnormal
  EXPECT_EQ(to_f16(0x1p-25f).bits, 0x0000);    // half of it: a tie, to even (zero)
  EXPECT_EQ(to_f16(0x1.8p-24f).bits, 0x0002);  // 1.5 of it: a tie, to even (two)
  EXPECT_FALSE(is_finite(to_f16(1e5f)));
  EXPECT_TRUE(is_finite(to_f16(6e4f)));
}

// The fp32-output bf16 GEMM with the bias in the primitive equals the product of its operands
// plus the bias (the linear layers' fp32 outputs under bf16 and the MLM logits).
TEST(KernelBf16, GemmWithBiasAddsTheBiasToTheExactProduct) {
  if (!bf16_unavailable_reason().empty()) GTEST_SKIP() << bf16_unavailable_reason();
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int M = 23, N = 41, K = 37;
  std::vector<bf16> A(static_cast<size_t>(M) * K), B(static_cast<size_t>(N) * K);
  for (bf16& a : A) a = to_bf16(nd(rng));
  for (bf16& b : B) b = to_bf16(nd(rng));
  std::vector<float> bias(N), C(static_cast<size_t>(M) * N, NAN);
  for (float& b : bias) b = 10.0f * nd(rng);
  linear_forward(C.data(), A.data(), B.data(), bias.data(), M, K, N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double want = bias[j], mag = std::abs(bias[j]);
      for (int k = 0; k < K; ++k) {
        const double x = static_cast<double>(to_float(A[i * K + k])) * to_float(B[j * K + k]);
        want += x, mag += std::abs(x);
      }
      EXPECT_NEAR(C[i * N + j], want, 1e-5 * mag + 1e-6) << "at (" << i << ", " << j << ")";
    }
}

// The one-pass cross-entropy backward for 16-bit logits gives what its composition gives (the
// fp32 backward written over the buffer, rounding to 16 bits, the bias column sums), bit for
// bit, over rows with and without a target, the target in the first and last column and a width
// that is not a multiple of the column block.
// GELU's backward into a linear layer's 16-bit operand: gelu_backward, then the rounding and the
// bias gradient linear_backward's 16-bit form takes from that fp32 gradient (bias_backward's
// order: each column summed over the rows, then added). The fp32 gradients may differ in their
// last bit (a vectorised loop and its scalar tail fall at other elements, and GCC contracts the
// two into FMAs differently), so each 16-bit value is within one step of 16 bits and each bias
// within fp32 rounding of its sum. Odd shapes: columns past one block and not a multiple of it.
TEST(KernelBf16, GeluBackwardToHalfMatchesItsComposition) {
  const int N = 37, OC = 150;
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(N) * OC), dout(x.size());
  for (float& v : x) v = nd(rng);
  for (float& v : dout) v = nd(rng);
  auto check = [&]<typename H>(H, float step) {
    std::vector<H> inp(x.size());
    to_half(inp.data(), x.data(), static_cast<int64_t>(x.size()));
    std::vector<float> d(x.size(), NAN), bias_a(OC, 0.25f), bias_b(OC, 0.25f), mag(OC, 0.0f);
    gelu_backward(d.data(), inp.data(), dout.data(), static_cast<int64_t>(d.size()),
                  GradWrite::overwrite);
    for (int c = 0; c < OC; ++c) {
      float sum = 0;
      for (int n = 0; n < N; ++n) {
        sum += d[static_cast<size_t>(n) * OC + c];
        mag[c] += std::abs(d[static_cast<size_t>(n) * OC + c]);
      }
      bias_a[c] += sum;
    }
    std::vector<H> got(x.size(), to_half<H>(7.0f));
    gelu_backward_to_half(got.data(), bias_b.data(), inp.data(), dout.data(), N, OC);
    int rounded_apart = 0;
    for (size_t i = 0; i < d.size(); ++i) {
      const float want = to_float(to_half<H>(d[i])), have = to_float(got[i]);
      ASSERT_LE(std::abs(have - want), step * std::abs(d[i]) + 1e-30f) << i;
      rounded_apart += have != want;
    }
    EXPECT_LE(rounded_apart, static_cast<int>(d.size()) / 100);  // a last-bit tie, rarely
    for (int c = 0; c < OC; ++c) ASSERT_NEAR(bias_b[c], bias_a[c], 1e-6f * (mag[c] + 1)) << c;
  };
  check(bf16{}, 1.0f / 128);
  check(f16{}, 1.0f / 1024);
}

TEST(KernelBf16, CrossEntropyBackwardToBf16EqualsItsComposition) {
  const int N = 9, V = 1000;
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(N) * V), losses(N), lse(N), dl(N);
  for (float& z : logits) z = nd(rng);
  const std::vector<int32_t> targets = {0, 999, -100, 5, 64, 63, 500, -1, 998};
  cross_entropy_logits_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  for (int n = 0; n < N; ++n) dl[n] = 0.1f + 0.05f * static_cast<float>(n);
  std::vector<float> dlogits(logits.size(), NAN), bias_a(V, 0.25f), bias_b(V, 0.25f);
  cross_entropy_logits_backward(dlogits.data(), logits.data(), lse.data(), targets.data(),
                                dl.data(), N, V, GradWrite::overwrite);
  std::vector<bf16> want(logits.size()), got(logits.size(), to_bf16(7.0f));
  to_bf16(want.data(), dlogits.data(), static_cast<int64_t>(dlogits.size()));
  for (int v = 0; v < V; ++v) {  // bias_backward's order: the column's sum, then added
    float sum = 0;
    for (int n = 0; n < N; ++n) sum += dlogits[static_cast<size_t>(n) * V + v];
    bias_a[v] += sum;
  }
  cross_entropy_logits_backward(got.data(), bias_b.data(), logits.data(), lse.data(),
                                targets.data(), dl.data(), N, V);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(bf16)), 0);
  EXPECT_EQ(std::memcmp(bias_a.data(), bias_b.data(), V * sizeof(float)), 0);
  EXPECT_LT(to_float(got[0]), 0.0f);   // the target's entry: p - 1 < 0
  EXPECT_EQ(got[2 * V + 17].bits, 0);  // a row without a target
}

// The logits-kept cross-entropy against a double reference (log-sum-exp from the row's maximum;
// gradient softmax - onehot), and its accuracy count against count_argmax_hits, over a
// vocabulary-wide row with ties before and after the target, the target at either end and rows
// without a target (loss 0, gradient 0, written over under GradWrite::overwrite).
TEST(KernelCount, LogitsKeptCrossEntropyMatchesADoubleReference) {
  const int N = 64, V = 3001;
  SplitMix64 rng(9);
  std::vector<float> z(static_cast<size_t>(N) * V);
  for (float& x : z) x = static_cast<float>(rng.next() % 1000) / 100.0f;  // many ties
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) {
    float* row = z.data() + static_cast<size_t>(n) * V;
    const int64_t top = std::max_element(row, row + V) - row;
    const int t = n % 4 == 0   ? static_cast<int>(top)
                  : n % 4 == 1 ? (n % 8 == 1 ? 0 : V - 1)
                               : static_cast<int>(rng.next() % V);
    if (n % 4 == 2) row[t] = row[top];  // a tie with the maximum, before or after it
    targets[static_cast<size_t>(n)] = n % 16 == 3 ? -100 : t;
  }
  std::vector<float> losses(N), lse(N), dl(N);
  const int64_t want_hits = count_argmax_hits(z.data(), targets.data(), N, V);
  EXPECT_EQ(cross_entropy_logits_forward(losses.data(), lse.data(), z.data(), targets.data(), N, V),
            want_hits);
  EXPECT_GT(want_hits, N / 8);
  EXPECT_LT(want_hits, N - 4);
  std::vector<double> ref_lse(N, 0.0);
  for (int n = 0; n < N; ++n) {
    dl[n] = 0.5f + 0.01f * static_cast<float>(n);
    const float* row = z.data() + static_cast<size_t>(n) * V;
    if (targets[n] < 0) {
      EXPECT_EQ(losses[n], 0.0f) << n;
      continue;
    }
    const double mx = *std::max_element(row, row + V);
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
    ref_lse[n] = mx + std::log(sum);
    EXPECT_NEAR(losses[n], ref_lse[n] - row[targets[n]], 1e-5 * (1 + ref_lse[n])) << n;
  }
  std::vector<float> got(z.size(), 0.5f), over(z.size(), NAN);
  cross_entropy_logits_backward(got.data(), z.data(), lse.data(), targets.data(), dl.data(), N, V);
  cross_entropy_logits_backward(over.data(), z.data(), lse.data(), targets.data(), dl.data(), N, V,
                                GradWrite::overwrite);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      const size_t i = static_cast<size_t>(n) * V + v;
      const double want =
          targets[n] < 0 ? 0.0 : (std::exp(double(z[i]) - ref_lse[n]) - (v == targets[n])) * dl[n];
      ASSERT_NEAR(got[i] - 0.5f, want, 1e-6) << n << " " << v;
      ASSERT_NEAR(over[i], want, 1e-6) << n << " " << v;
    }
}

// Attention's one-thread bf16 block product equals the double product of its operands rounded to
// bf16, up to fp32 accumulation: fp32 and bf16 operands, every transpose, a transposed and an
// accumulating output, odd sizes (K odd, N past one 32-column tile and not a multiple of 16).
TEST(KernelBf16, BlockProductMatchesTheExactProductOfItsRoundedOperands) {
  if (!block_gemm_bf16_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int pad = 3;
  auto run = [&]<typename SA, typename SB>(int M, int N, int K, bool ta, bool tb, bool tc,
                                           bool acc) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = (tc ? M : N) + pad;
    std::vector<SA> A(static_cast<size_t>(lda) * (ta ? K : M));
    std::vector<SB> B(static_cast<size_t>(ldb) * (tb ? N : K));
    auto fill = [&](auto& v) {
      for (auto& x : v)
        if constexpr (std::is_same_v<std::decay_t<decltype(x)>, bf16>)
          x = to_bf16(nd(rng));
        else
          x = nd(rng);
    };
    fill(A);
    fill(B);
    auto value = [](auto x) -> double {
      if constexpr (std::is_same_v<decltype(x), bf16>)
        return to_float(x);
      else
        return to_float(to_bf16(x));
    };
    std::vector<float> C(static_cast<size_t>(ldc) * (tc ? N : M));
    for (float& c : C) c = nd(rng);
    const std::vector<float> C0 = C;
    const float alpha = 0.5f;
    std::vector<bf16> pack(block_gemm_pack_elems(M, N, K));
    block_gemm_bf16(M, N, K, alpha, MatView<SA>{A.data(), lda, ta}, MatView<SB>{B.data(), ldb, tb},
                    OutView{C.data(), ldc, tc, acc}, pack.data());
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double want = 0, mag = 0;
        for (int k = 0; k < K; ++k) {
          const double a = value(ta ? A[k * lda + i] : A[i * lda + k]);
          const double b = value(tb ? B[j * ldb + k] : B[k * ldb + j]);
          want += a * b;
          mag += std::abs(a * b);
        }
        const size_t at = tc ? static_cast<size_t>(j) * ldc + i : static_cast<size_t>(i) * ldc + j;
        want = alpha * want + (acc ? C0[at] : 0.0);
        ASSERT_NEAR(C[at], want, 1e-5 * (mag + std::abs(C0[at])) + 1e-6)
            << "M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb << " tc=" << tc
            << " acc=" << acc << " at (" << i << ", " << j << ")";
      }
    // Outside the output's M x N, nothing changed (the padding columns of C).
    for (size_t at = 0; at < C.size(); ++at) {
      if (static_cast<int>(at % ldc) >= (tc ? M : N)) {
        ASSERT_EQ(C[at], C0[at]) << at;
      }
    }
  };
  for (const auto& [M, N, K] :
       {std::array{37, 45, 53}, std::array{9, 70, 64}, std::array{1, 1, 1}, std::array{64, 17, 2}})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const bool tc : {false, true})
          for (const bool acc : {false, true}) {
            run.template operator()<float, float>(M, N, K, ta, tb, tc, acc);
            run.template operator()<bf16, float>(M, N, K, ta, tb, tc, acc);
            run.template operator()<float, bf16>(M, N, K, ta, tb, tc, acc);
            run.template operator()<bf16, bf16>(M, N, K, ta, tb, tc, acc);
          }
}

// bf16 attention backward: dS is rounded to bf16 for the dQ and dK products, which breaks its
// zero row sums unless re-centred. The key bias's true gradient, the sum of a sequence's dK
// rows, must stay 0 up to fp32 rounding (far below the bf16 rounding of dS, about 4e-3 of a
// value), and dQ, dK and dV must agree with the fp32 kernel on the same rounded inputs within
// bf16's rounding (normwise per block).
// Random bf16 q | k | v [T, 3C] (0.5 N(0, 1)), the same widened to fp32, and an output gradient
// [T, C] (N(0, 1)).
struct AttentionInputs16 {
  std::vector<bf16> qkv16;
  std::vector<float> qkv, dout;
  AttentionInputs16(int T, int C, unsigned seed)
      : qkv16(static_cast<size_t>(T) * 3 * C), qkv(qkv16.size()), dout(static_cast<size_t>(T) * C) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& x : qkv16) x = to_bf16(0.5f * nd(rng));
    to_float(qkv.data(), qkv16.data(), static_cast<int64_t>(qkv.size()));
    for (float& x : dout) x = nd(rng);
  }
};

TEST(KernelBf16, AttentionKeyGradientsSumToZeroPerSequence) {
  if (!block_gemm_bf16_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  const int C = 128, NH = 2, hs = C / NH;
  const std::vector<int32_t> cu = {0, 1, 38, 102, 135};
  const int n_seq = static_cast<int>(cu.size()) - 1, T = cu.back();
  const AttentionInputs16 in(T, C, 17);
  const std::vector<bf16>& qkv16 = in.qkv16;
  const std::vector<float>&qkv = in.qkv, &dout = in.dout;
  const int64_t np = attention_probs_offsets(cu.data(), n_seq, NH, 0).back();
  const AttentionDropout drop{0.1, 3, 4};
  std::vector<bf16> out16(static_cast<size_t>(T) * C), probs16(np);
  attention_forward(out16.data(), probs16.data(), qkv16.data(), cu.data(), n_seq, C, NH, 0, drop);
  std::vector<float> probs(np), out(out16.size()), d16(qkv.size()), d32(qkv.size());
  to_float(probs.data(), probs16.data(), np);
  attention_backward(d16.data(), dout.data(), qkv16.data(), probs16.data(), cu.data(), n_seq, C, NH,
                     0, drop, {}, GradWrite::overwrite);
  attention_backward(d32.data(), dout.data(), qkv.data(), probs.data(), cu.data(), n_seq, C, NH, 0,
                     drop, {}, GradWrite::overwrite);
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < NH; ++h) {
      for (int part = 0; part < 3; ++part) {  // dQ, dK, dV of the block against fp32
        double diff2 = 0, ref2 = 0;
        for (int t = cu[s]; t < cu[s + 1]; ++t)
          for (int j = 0; j < hs; ++j) {
            const size_t at = static_cast<size_t>(t) * 3 * C + part * C + h * hs + j;
            diff2 += std::pow(double(d16[at]) - d32[at], 2);
            ref2 += std::pow(double(d32[at]), 2);
          }
        EXPECT_LE(std::sqrt(diff2), 2e-2 * std::sqrt(ref2) + 1e-6)
            << "sequence " << s << " head " << h << " part " << part;
      }
      for (int j = 0; j < hs; ++j) {
        double sum = 0, mag = 0;
        for (int t = cu[s]; t < cu[s + 1]; ++t) {
          const double g = d16[static_cast<size_t>(t) * 3 * C + C + h * hs + j];
          sum += g;
          mag += std::abs(g);
        }
        ASSERT_LE(std::abs(sum), 1e-5 * mag + 1e-7)
            << "sequence " << s << " head " << h << " column " << j;
      }
    }
}

// The bf16 form takes a block through softmax a strip of rows at a time and writes dVᵀ and dKᵀ
// back through 16 x 16 register transposes: sequences longer than a strip (64 rows) and not a
// multiple of it, and a head size that is not a multiple of 16 (the transposes' edges), against
// the fp32 kernel on the same rounded inputs; rebuilt probabilities against kept ones; and the
// accumulating write against the overwriting one.
TEST(KernelBf16, AttentionOverSeveralStripsAgreesWithFp32) {
  if (!block_gemm_bf16_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  const std::vector<int32_t> cu = {0, 150, 220, 221, 350};  // L = 150, 70, 1, 129
  const int n_seq = static_cast<int>(cu.size()) - 1, T = cu.back();
  for (const int C : {128, 48}) {  // head sizes 64 and 24
    const int NH = 2, hs = C / NH;
    const AttentionInputs16 in(T, C, C);
    const std::vector<bf16>& qkv16 = in.qkv16;
    const std::vector<float>&qkv = in.qkv, &dout = in.dout;
    const int64_t np = attention_probs_offsets(cu.data(), n_seq, NH, 0).back();
    const AttentionDropout drop{0.1, 5, 6};
    std::vector<bf16> out16(static_cast<size_t>(T) * C), probs16(np);
    std::vector<float> out(out16.size()), probs(np);
    attention_forward(out16.data(), probs16.data(), qkv16.data(), cu.data(), n_seq, C, NH, 0, drop);
    attention_forward(out.data(), probs.data(), qkv.data(), cu.data(), n_seq, C, NH, 0, drop);
    std::vector<float> d16(qkv.size()), d32(qkv.size()), rebuilt(qkv.size()), acc(qkv.size());
    attention_backward(d16.data(), dout.data(), qkv16.data(), probs16.data(), cu.data(), n_seq, C,
                       NH, 0, drop, {}, GradWrite::overwrite);
    attention_backward(d32.data(), dout.data(), qkv.data(), probs.data(), cu.data(), n_seq, C, NH,
                       0, drop, {}, GradWrite::overwrite);
    attention_backward(rebuilt.data(), dout.data(), qkv16.data(), static_cast<const bf16*>(nullptr),
                       cu.data(), n_seq, C, NH, 0, drop, {}, GradWrite::overwrite);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<float>(i % 7) - 3.0f;
    attention_backward(acc.data(), dout.data(), qkv16.data(), probs16.data(), cu.data(), n_seq, C,
                       NH, 0, drop);
    // Normwise over rows [t0, t1) and columns [c0, c0 + w) of [T, ld] tensors.
    auto rel = [](const auto& x, const std::vector<float>& ref, int ld, int t0, int t1, int c0,
                  int w) {
      double diff2 = 0, ref2 = 0;
      for (int t = t0; t < t1; ++t)
        for (int j = c0; j < c0 + w; ++j) {
          const size_t at = static_cast<size_t>(t) * ld + j;
          double v;
          if constexpr (std::is_same_v<std::decay_t<decltype(x[at])>, float>)
            v = x[at];
          else
            v = to_float(x[at]);
          diff2 += std::pow(v - ref[at], 2);
          ref2 += std::pow(static_cast<double>(ref[at]), 2);
        }
      return std::sqrt(diff2) / (std::sqrt(ref2) + 1e-12);
    };
    for (int s = 0; s < n_seq; ++s)
      for (int h = 0; h < NH; ++h) {
        const std::string where = "C " + std::to_string(C) + " sequence " + std::to_string(s) +
                                  " head " + std::to_string(h);
        EXPECT_LE(rel(out16, out, C, cu[s], cu[s + 1], h * hs, hs), 2e-2) << where;
        for (int part = 0; part < 3; ++part)  // dQ, dK, dV
          EXPECT_LE(rel(d16, d32, 3 * C, cu[s], cu[s + 1], part * C + h * hs, hs), 2e-2)
              << where << " part " << part;
      }
    EXPECT_LE(rel(probs16, probs, static_cast<int>(np), 0, 1, 0, static_cast<int>(np)), 1e-2);
    for (size_t i = 0; i < d16.size(); ++i) {
      ASSERT_EQ(rebuilt[i], d16[i]) << "C " << C << " element " << i;
      const float g0 = static_cast<float>(i % 7) - 3.0f;
      ASSERT_NEAR(acc[i], g0 + d16[i], 1e-5f * (std::abs(g0) + std::abs(d16[i])) + 1e-6f)
          << "C " << C << " element " << i;
    }
  }
}

TEST(KernelBf16, RefusedWithTheMissingFeatureNamed) {
  setenv("PACKBERT_CPU_NO_BF16", "1", 1);
  const std::string why = bf16_unavailable_reason();
  unsetenv("PACKBERT_CPU_NO_BF16");
  EXPECT_NE(why.find("AVX512-BF16 or AMX-BF16"), std::string::npos) << why;
  EXPECT_NE(why.find(cpu_features().model), std::string::npos) << why;
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(bf16_unavailable_reason().empty(),
            (f.avx512_bf16 || f.amx_bf16) && onednn_bf16_matmul_refusal().empty());
}

// The answer comes from what runs: where bf16 is offered, a bf16 product runs and is right; where
// oneDNN cannot build one (an AVX2-only CPU, or ONEDNN_MAX_CPU_ISA below AVX-512), bf16 is
// refused, whatever CPUID says.
TEST(KernelBf16, OfferedExactlyWhereOneDnnBuildsTheProduct) {
  const std::string refusal = onednn_bf16_matmul_refusal();
  if (!refusal.empty()) {
    EXPECT_FALSE(bf16_unavailable_reason().empty()) << "oneDNN refused: " << refusal;
    return;
  }
  if (!bf16_unavailable_reason().empty()) GTEST_SKIP() << bf16_unavailable_reason();
  const int M = 5, N = 7, K = 9;
  std::vector<bf16> a(M * K), b(K * N);
  std::vector<float> c(M * N, 0.0f);
  for (int i = 0; i < M * K; ++i) a[i] = to_bf16(static_cast<float>(i % 5) - 2.0f);
  for (int i = 0; i < K * N; ++i) b[i] = to_bf16(static_cast<float>(i % 3) - 1.0f);
  gemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float want = 0;
      for (int k = 0; k < K; ++k) want += to_float(a[i * K + k]) * to_float(b[k * N + j]);
      EXPECT_EQ(c[i * N + j], want) << i << "," << j;
    }
}

// GradWrite::overwrite: the input gradient written over whatever its buffer holds (NaN here, so
// a read of it would show), equal to accumulating into zeros; parameter gradients still
// accumulate. run(dinp, dparams, mode) runs one backward.
template <typename Run>
void check_overwrites(const std::string& what, size_t n_dinp, size_t n_dparams, Run run) {
  std::vector<float> zeroed(n_dinp, 0.0f),
      poisoned(n_dinp, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> params_added(n_dparams, 0.5f), params_over(n_dparams, 0.5f);
  run(zeroed.data(), params_added.data(), GradWrite::accumulate);
  run(poisoned.data(), params_over.data(), GradWrite::overwrite);
  size_t nonzero = 0;
  for (size_t i = 0; i < n_dinp; ++i) {
    ASSERT_EQ(poisoned[i], zeroed[i]) << what << ": dinp[" << i << "]";
    nonzero += zeroed[i] != 0.0f;
  }
  EXPECT_GT(nonzero, n_dinp / 2) << what;
  size_t moved = 0;
  for (size_t i = 0; i < n_dparams; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(params_over[i]), std::bit_cast<uint32_t>(params_added[i]))
        << what << ": parameter gradient [" << i << "]";
    moved += params_added[i] != 0.5f;
  }
  EXPECT_EQ(moved, n_dparams) << what << ": parameter gradients did not accumulate";
}

template <typename H>
void check_overwrites16(const std::string& name, int N, int C, int OC, const std::vector<float>& x,
                        const std::vector<float>& w, const std::vector<float>& dout,
                        const std::vector<float>& mean, const std::vector<float>& rstd,
                        const std::vector<float>& wc) {
  const std::vector<H> x16 = rounded<H>(x.data(), x.size()), w16 = rounded<H>(w.data(), w.size());
  const std::vector<H> xc16 = rounded<H>(x.data(), static_cast<size_t>(N) * C);
  check_overwrites("layernorm_backward, " + name + " input", size_t(N) * C, 2 * size_t(C),
                   [&](float* dinp, float* dp, GradWrite mode) {
                     layernorm_backward(dinp, dp, dp + C, dout.data(), xc16.data(), wc.data(),
                                        mean.data(), rstd.data(), N, C, mode);
                   });
  check_overwrites("gelu_backward, " + name + " input", size_t(N) * C, 0,
                   [&](float* dinp, float*, GradWrite mode) {
                     gelu_backward(dinp, xc16.data(), dout.data(), int64_t(N) * C, mode);
                   });
  if (std::is_same_v<H, bf16> && !bf16_unavailable_reason().empty()) return;
  std::vector<H> dout16(static_cast<size_t>(N) * OC);
  check_overwrites("linear_backward, " + name, size_t(N) * C, size_t(OC) * C + OC,
                   [&](float* dinp, float* dp, GradWrite mode) {
                     linear_backward(dinp, dp, dp + size_t(OC) * C, dout.data(), dout16.data(),
                                     x16.data(), w16.data(), N, C, OC, mode);
                   });
  // The fused pass: dout16 is dout rounded, the bias gradient fp32's sums exactly.
  const std::vector<H> want16 = rounded<H>(dout.data(), dout16.size());
  for (size_t i = 0; i < dout16.size(); ++i) ASSERT_EQ(dout16[i].bits, want16[i].bits) << i;
  std::vector<float> db(OC, 0.5f), db32(OC, 0.5f), dw(size_t(OC) * C, 0.0f);
  linear_backward(nullptr, dw.data(), db.data(), dout.data(), dout16.data(), x16.data(), w16.data(),
                  N, C, OC);
  linear_backward(static_cast<float*>(nullptr), dw.data(), db32.data(), dout.data(), x.data(),
                  w.data(), N, C, OC);
  for (int o = 0; o < OC; ++o)
    ASSERT_EQ(std::bit_cast<uint32_t>(db[o]), std::bit_cast<uint32_t>(db32[o])) << "dbias " << o;
  check_overwrites("linear_backward, " + name + " output gradient", size_t(N) * C, size_t(OC) * C,
                   [&](float* dinp, float* dp, GradWrite mode) {
                     linear_backward(dinp, dp, want16.data(), x16.data(), w16.data(), N, C, OC,
                                     mode);
                   });
}

TEST(KernelGradWrite, OverwriteIgnoresTheBufferAndEqualsAccumulatingIntoZeros) {
  std::mt19937 rng(21);
  const int N = 37, C = 96, OC = 200;  // C, OC: more than one column block, a partial one
  std::normal_distribution<float> nd(0.f, 1.f);
  auto draw = [&](size_t n) {
    std::vector<float> v(n);
    for (float& a : v) a = nd(rng);
    return v;
  };
  const std::vector<float> x = draw(size_t(N) * OC), w = draw(size_t(OC) * C),
                           dout = draw(size_t(N) * OC), wc = draw(C);
  std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), wc.data(), wc.data(), N, C,
                    1e-12f);
  check_overwrites("layernorm_backward", size_t(N) * C, 2 * size_t(C),
                   [&](float* dinp, float* dp, GradWrite mode) {
                     layernorm_backward(dinp, dp, dp + C, dout.data(), x.data(), wc.data(),
                                        mean.data(), rstd.data(), N, C, mode);
                   });
  check_overwrites("gelu_backward", size_t(N) * C, 0, [&](float* dinp, float*, GradWrite mode) {
    gelu_backward(dinp, x.data(), dout.data(), int64_t(N) * C, mode);
  });
  check_overwrites("linear_backward", size_t(N) * C, size_t(OC) * C + OC,
                   [&](float* dinp, float* dp, GradWrite mode) {
                     linear_backward(dinp, dp, dp + size_t(OC) * C, dout.data(), x.data(), w.data(),
                                     N, C, OC, mode);
                   });
  check_overwrites16<bf16>("bf16", N, C, OC, x, w, dout, mean, rstd, wc);
  check_overwrites16<f16>("fp16", N, C, OC, x, w, dout, mean, rstd, wc);

  // Attention: every row of dqkv belongs to one sequence, so overwriting writes all of it (with
  // dropout on, and over bf16 and fp16 q | k | v, whose products differ from fp32's); under a
  // sliding window too, where the last sequence (50 tokens) goes in two tiles whose key bands
  // overlap.
  const std::vector<int32_t> cu = {0, 5, 7, 19, 69};
  const int T = 69, AC = 32, NH = 2;
  const std::vector<float> qkv = draw(size_t(T) * 3 * AC), datt = draw(size_t(T) * AC);
  const AttentionDropout drop{0.1, 5, 9};
  for (const int window : {kGlobalAttention, 6}) {
    const std::string w = window == kGlobalAttention ? "" : ", window " + std::to_string(window);
    std::vector<float> att(size_t(T) * AC),
        probs(attention_probs_offsets(cu.data(), 4, NH, window).back());
    attention_forward(att.data(), probs.data(), qkv.data(), cu.data(), 4, AC, NH, window, drop);
    check_overwrites("attention_backward" + w, size_t(T) * 3 * AC, 0,
                     [&](float* dqkv, float*, GradWrite mode) {
                       attention_backward(dqkv, datt.data(), qkv.data(), probs.data(), cu.data(), 4,
                                          AC, NH, window, drop, {}, mode);
                     });
    auto attention16 = [&](auto h, const std::string& name) {
      using H = decltype(h);
      const std::vector<H> qkv16 = rounded<H>(qkv.data(), qkv.size());
      std::vector<H> att16(att.size()), probs16(probs.size());
      attention_forward(att16.data(), probs16.data(), qkv16.data(), cu.data(), 4, AC, NH, window,
                        drop);
      check_overwrites("attention_backward, " + name + w, size_t(T) * 3 * AC, 0,
                       [&](float* dqkv, float*, GradWrite mode) {
                         attention_backward(dqkv, datt.data(), qkv16.data(), probs16.data(),
                                            cu.data(), 4, AC, NH, window, drop, {}, mode);
                       });
    };
    attention16(bf16{}, "bf16");
    attention16(f16{}, "fp16");
  }
}

TEST(KernelRebuild, LayerNormApplyEqualsForwardBitwise) {
  std::mt19937 rng(12);
  const int N = 9, C = 77;
  std::vector<float> x(N * C), w(C), b(C), out(N * C), again(N * C), mean(N), rstd(N);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (float* v : {x.data(), w.data(), b.data()})
    for (int i = 0; i < (v == x.data() ? N * C : C); ++i) v[i] = nd(rng);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                    1e-12f);
  layernorm_apply(again.data(), x.data(), mean.data(), rstd.data(), w.data(), b.data(), N, C);
  EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)), 0);
  // bf16 input and twin output (Precision::bf16's rebuild), likewise.
  std::vector<bf16> x16(N * C), twin(N * C), twin_again(N * C);
  to_bf16(x16.data(), x.data(), N * C);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x16.data(), w.data(), b.data(), N, C,
                    1e-12f, twin.data());
  layernorm_apply(again.data(), x16.data(), mean.data(), rstd.data(), w.data(), b.data(), N, C,
                  twin_again.data());
  EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(twin.data(), twin_again.data(), twin.size() * sizeof(bf16)), 0);
}

// Accuracy counts pick the first largest entry and skip rows without a target.
TEST(KernelCount, ArgmaxHitsSkipUntargetedRowsAndTakeTheFirstMaximum) {
  const std::vector<float> scores = {0.1f, 0.7f, 0.2f,  //
                                     0.5f, 0.5f, 0.0f,  // tie: index 0
                                     0.9f, 0.0f, 0.1f,  //
                                     0.0f, 0.0f, 1.0f};
  EXPECT_EQ(count_argmax_hits(scores.data(), std::vector<int32_t>{1, 0, -100, 2}.data(), 4, 3), 3);
  EXPECT_EQ(count_argmax_hits(scores.data(), std::vector<int32_t>{0, 1, 0, -1}.data(), 4, 3), 1);
}

// The vectorised count agrees with std::max_element row by row over a vocabulary-sized row
// width, with ties planted before and after the target and the target at either end.
TEST(KernelCount, ArgmaxHitsAgreeWithMaxElementOnWideRowsWithTies) {
  const int N = 64, V = 3001;
  SplitMix64 rng(9);
  std::vector<float> z(static_cast<size_t>(N) * V);
  for (float& x : z) x = static_cast<float>(rng.next() % 1000) / 1000.0f;  // many ties
  std::vector<int32_t> targets(N);
  int64_t want = 0;
  for (int n = 0; n < N; ++n) {
    float* row = z.data() + static_cast<size_t>(n) * V;
    const int64_t top = std::max_element(row, row + V) - row;
    const int t = n % 4 == 0   ? static_cast<int>(top)              // the first maximum
                  : n % 4 == 1 ? (n % 8 == 1 ? 0 : V - 1)           // an end
                               : static_cast<int>(rng.next() % V);  // anywhere
    if (n % 4 == 2) row[t] = row[top];  // a tie with the maximum, before or after it
    targets[static_cast<size_t>(n)] = n == 3 ? -100 : t;
    if (n != 3) want += std::max_element(row, row + V) - row == t;
  }
  EXPECT_EQ(count_argmax_hits(z.data(), targets.data(), N, V), want);
  EXPECT_GT(want, N / 8);
  EXPECT_LT(want, N - 1);
}

}  // namespace
}  // namespace packbert::kernels
