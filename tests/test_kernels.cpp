// Kernels: every backward checked against central finite differences in double precision,
// plus the properties the engine relies on (no cross-sequence attention, packed == separate,
// dropout masks independent of thread count), and float agreeing with double.
#include <gtest/gtest.h>
#include <omp.h>

#include <functional>
#include <random>

#include "kernels/attention.h"
#include "kernels/dropout.h"
#include "kernels/fastmath.h"
#include "kernels/layers.h"

namespace packbert::kernels {
namespace {

using Vec = std::vector<double>;

Vec random_vec(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares `analytic` = d loss / d x with central differences of loss() over every element.
void expect_grad(Vec& x, const Vec& analytic, const std::function<double()>& loss, const char* what,
                 double tol = 1e-7) {
  ASSERT_EQ(x.size(), analytic.size());
  const double h = 1e-5;
  for (size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + h;
    double up = loss();
    x[i] = keep - h;
    double down = loss();
    x[i] = keep;
    double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[i], numeric, tol * (1 + std::abs(numeric))) << what << "[" << i << "]";
  }
}

TEST(KernelGrad, LayerNorm) {
  std::mt19937 rng(1);
  const int N = 3, C = 7;
  Vec x = random_vec(N * C, rng), w = random_vec(C, rng), b = random_vec(C, rng);
  Vec R = random_vec(N * C, rng), out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                      1e-12);
    return dot(out, R);
  };
  loss();
  Vec dx(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  expect_grad(x, dx, loss, "dinp");
  expect_grad(w, dw, loss, "dweight");
  expect_grad(b, db, loss, "dbias");
}

TEST(KernelGrad, Gelu) {
  std::mt19937 rng(2);
  Vec x = random_vec(40, rng, 2.0), R = random_vec(40, rng), out(40), dx(40, 0.0);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), 40);
    return dot(out, R);
  };
  gelu_backward(dx.data(), x.data(), R.data(), 40);
  expect_grad(x, dx, loss, "dinp");
  double y;
  double v = 1.0;
  gelu_forward(&y, &v, 1);
  EXPECT_NEAR(y, 0.8413447460685429, 1e-15);  // 0.5 (1 + erf(1/sqrt 2)): exact, not tanh
}

TEST(KernelGrad, Linear) {
  std::mt19937 rng(3);
  const int N = 4, C = 5, OC = 3;
  Vec x = random_vec(N * C, rng), W = random_vec(OC * C, rng), b = random_vec(OC, rng);
  Vec R = random_vec(N * OC, rng), out(N * OC);
  auto loss = [&] {
    linear_forward(out.data(), x.data(), W.data(), b.data(), N, C, OC);
    return dot(out, R);
  };
  loss();
  EXPECT_NEAR(out[1 * OC + 2],
              b[2] + x[5] * W[10] + x[6] * W[11] + x[7] * W[12] + x[8] * W[13] + x[9] * W[14],
              1e-12);  // row 1, output 2 = b + x[1,:] . W[2,:]
  Vec dx(N * C, 0.0), dW(OC * C, 0.0), db(OC, 0.0);
  linear_backward(dx.data(), dW.data(), db.data(), R.data(), x.data(), W.data(), N, C, OC);
  expect_grad(x, dx, loss, "dinp");
  expect_grad(W, dW, loss, "dweight");
  expect_grad(b, db, loss, "dbias");
}

TEST(KernelGrad, Embedding) {
  std::mt19937 rng(4);
  const int V = 6, P = 5, Y = 2, T = 7, C = 4;
  std::vector<int32_t> ids = {1, 5, 1, 0, 3, 3, 2}, pos = {0, 1, 2, 0, 1, 2, 3},
                       types = {0, 0, 1, 0, 0, 1, 1};
  Vec word = random_vec(V * C, rng), position = random_vec(P * C, rng),
      type = random_vec(Y * C, rng), R = random_vec(T * C, rng), out(T * C);
  auto loss = [&] {
    embedding_forward(out.data(), ids.data(), pos.data(), types.data(), word.data(),
                      position.data(), type.data(), T, C);
    return dot(out, R);
  };
  Vec dword(V * C, 0.0), dpos(P * C, 0.0), dtype(Y * C, 0.0);
  embedding_backward(dword.data(), dpos.data(), dtype.data(), R.data(), ids.data(), pos.data(),
                     types.data(), T, C);
  expect_grad(word, dword, loss, "dword");
  expect_grad(position, dpos, loss, "dposition");
  expect_grad(type, dtype, loss, "dtoken_type");
}

TEST(KernelGrad, CrossEntropyIgnoresNegativeTargets) {
  std::mt19937 rng(5);
  const int N = 4, V = 5;
  std::vector<int32_t> targets = {2, -100, 0, 4};
  Vec z = random_vec(N * V, rng, 3.0), R = random_vec(N, rng), losses(N), probs(N * V);
  auto loss = [&] {
    cross_entropy_forward(losses.data(), probs.data(), z.data(), targets.data(), N, V);
    return dot(losses, R);
  };
  loss();
  EXPECT_EQ(losses[1], 0.0);
  double lse = 0;
  for (int v = 0; v < V; ++v) lse += std::exp(z[v]);
  EXPECT_NEAR(losses[0], std::log(lse) - z[2], 1e-12);
  Vec dz(N * V, 0.0);
  cross_entropy_backward(dz.data(), probs.data(), targets.data(), R.data(), N, V);
  expect_grad(z, dz, loss, "dlogits");
}

TEST(KernelGrad, AttentionVarlen) {
  std::mt19937 rng(6);
  const int C = 6, NH = 2;
  std::vector<int32_t> cu = {0, 3, 4, 8};  // lengths 3, 1, 4
  const int T = cu.back(), n_seq = 3;
  Vec qkv = random_vec(T * 3 * C, rng), R = random_vec(T * C, rng), out(T * C);
  Vec probs(attention_probs_offsets(cu.data(), n_seq, NH).back());
  EXPECT_EQ(probs.size(), static_cast<size_t>(NH * (9 + 1 + 16)));  // sum L^2, never S^2
  auto loss = [&] {
    attention_forward(out.data(), probs.data(), qkv.data(), cu.data(), n_seq, C, NH);
    return dot(out, R);
  };
  loss();
  Vec dqkv(T * 3 * C, 0.0);
  attention_backward(dqkv.data(), R.data(), qkv.data(), probs.data(), cu.data(), n_seq, C, NH);
  expect_grad(qkv, dqkv, loss, "dqkv");
}

TEST(KernelGrad, AttentionVarlenWithDropout) {
  std::mt19937 rng(16);
  const int C = 6, NH = 3;
  std::vector<int32_t> cu = {0, 4, 9};
  const int T = cu.back();
  AttentionDropout drop{0.3, 99, 5};
  Vec qkv = random_vec(T * 3 * C, rng), R = random_vec(T * C, rng), out(T * C);
  Vec probs(attention_probs_offsets(cu.data(), 2, NH).back());
  auto loss = [&] {
    attention_forward(out.data(), probs.data(), qkv.data(), cu.data(), 2, C, NH, drop);
    return dot(out, R);
  };
  loss();
  Vec dqkv(T * 3 * C, 0.0);
  attention_backward(dqkv.data(), R.data(), qkv.data(), probs.data(), cu.data(), 2, C, NH, drop);
  expect_grad(qkv, dqkv, loss, "dqkv");
}

TEST(KernelAttention, NoCrossContaminationAndPackedEqualsSeparate) {
  std::mt19937 rng(7);
  const int C = 8, NH = 2;
  std::vector<int32_t> cu = {0, 5, 7, 12};
  const int T = 12;
  Vec qkv = random_vec(T * 3 * C, rng), out(T * C);
  Vec probs(attention_probs_offsets(cu.data(), 3, NH).back());
  attention_forward(out.data(), probs.data(), qkv.data(), cu.data(), 3, C, NH);
  for (int s = 0; s < 3; ++s) {  // each sequence alone
    int start = cu[s], L = cu[s + 1] - cu[s];
    std::vector<int32_t> one = {0, L};
    Vec q(qkv.begin() + start * 3 * C, qkv.begin() + (start + L) * 3 * C), o(L * C), p(NH * L * L);
    attention_forward(o.data(), p.data(), q.data(), one.data(), 1, C, NH);
    for (int i = 0; i < L * C; ++i) EXPECT_EQ(o[i], out[start * C + i]);
  }
  Vec changed = qkv;  // perturb sequence 1 only: sequences 0 and 2 must not move
  for (int i = 5 * 3 * C; i < 7 * 3 * C; ++i) changed[i] += 1.0;
  Vec out2(T * C);
  attention_forward(out2.data(), probs.data(), changed.data(), cu.data(), 3, C, NH);
  for (int t : {0, 1, 2, 3, 4, 7, 8, 9, 10, 11})
    for (int c = 0; c < C; ++c) EXPECT_EQ(out2[t * C + c], out[t * C + c]);
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
  attention_forward(out.data(), probs.data(), qkv.data(), cu.data(), 2, C, NH);
  attention_forward(of.data(), pf.data(), qf.data(), cu.data(), 2, C, NH);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(of[i], out[i], 1e-5);
}

}  // namespace
}  // namespace packbert::kernels

// Golden parity with PyTorch (tools/make_kernel_goldens.py, fp32): same inputs, same outputs
// and gradients to 1e-5 relative.
#include <fstream>
#include <nlohmann/json.hpp>

namespace packbert::kernels {
namespace {

using Json = nlohmann::json;
using F = std::vector<float>;

const Json& goldens() {
  static const Json g = [] {
    std::ifstream in(std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/kernels.json");
    return Json::parse(in);
  }();
  return g;
}

F f(const Json& j) {
  return j.get<F>();
}
std::vector<int32_t> ints(const Json& j) {
  return j.get<std::vector<int32_t>>();
}

void expect_close(const F& got, const Json& want, const char* what, double rtol = 1e-5) {
  F w = f(want);
  ASSERT_EQ(got.size(), w.size()) << what;
  double scale = 0;
  for (float v : w) scale = std::max(scale, static_cast<double>(std::abs(v)));
  for (size_t i = 0; i < w.size(); ++i)
    EXPECT_NEAR(got[i], w[i], rtol * std::max(1.0, scale)) << what << "[" << i << "]";
}

TEST(KernelGolden, LayerNorm) {
  const Json& g = goldens()["layernorm"];
  int N = g["N"], C = g["C"];
  F x = f(g["inp"]), w = f(g["weight"]), b = f(g["bias"]), dout = f(g["dout"]);
  F out(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                    1e-12f);
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  expect_close(out, g["out"], "out");
  expect_close(dx, g["dinp"], "dinp");
  expect_close(dw, g["dweight"], "dweight");
  expect_close(db, g["dbias"], "dbias");
}

TEST(KernelGolden, Gelu) {
  const Json& g = goldens()["gelu"];
  int n = g["n"];
  F x = f(g["inp"]), dout = f(g["dout"]), out(n), dx(n);
  gelu_forward(out.data(), x.data(), n);
  gelu_backward(dx.data(), x.data(), dout.data(), n);
  expect_close(out, g["out"], "out");
  expect_close(dx, g["dinp"], "dinp");
}

TEST(KernelGolden, Linear) {
  const Json& g = goldens()["linear"];
  int N = g["N"], C = g["C"], OC = g["OC"];
  F x = f(g["inp"]), w = f(g["weight"]), b = f(g["bias"]), dout = f(g["dout"]);
  F out(N * OC), dx(N * C), dw(OC * C), db(OC);
  linear_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  linear_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
  expect_close(out, g["out"], "out");
  expect_close(dx, g["dinp"], "dinp");
  expect_close(dw, g["dweight"], "dweight");
  expect_close(db, g["dbias"], "dbias");
}

TEST(KernelGolden, CrossEntropy) {
  const Json& g = goldens()["cross_entropy"];
  int N = g["N"], V = g["V"];
  F z = f(g["logits"]), dl = f(g["dlosses"]), losses(N), probs(N * V), dz(N * V);
  std::vector<int32_t> targets = ints(g["targets"]);
  cross_entropy_forward(losses.data(), probs.data(), z.data(), targets.data(), N, V);
  cross_entropy_backward(dz.data(), probs.data(), targets.data(), dl.data(), N, V);
  expect_close(losses, g["losses"], "losses");
  expect_close(dz, g["dlogits"], "dlogits");
}

TEST(KernelGolden, AttentionVarlen) {
  const Json& g = goldens()["attention"];
  int C = g["C"], NH = g["NH"];
  std::vector<int32_t> cu = ints(g["cu_seqlens"]);
  int n_seq = static_cast<int>(cu.size()) - 1, T = cu.back();
  F qkv = f(g["qkv"]), dout = f(g["dout"]), out(T * C), dqkv(T * 3 * C);
  F probs(attention_probs_offsets(cu.data(), n_seq, NH).back());
  attention_forward(out.data(), probs.data(), qkv.data(), cu.data(), n_seq, C, NH);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), probs.data(), cu.data(), n_seq, C, NH);
  expect_close(out, g["out"], "out");
  expect_close(dqkv, g["dqkv"], "dqkv");
}

TEST(KernelGolden, Embedding) {
  const Json& g = goldens()["embedding"];
  int V = g["V"], P = g["P"], Y = g["Y"], C = g["C"];
  std::vector<int32_t> ids = ints(g["ids"]), pos = ints(g["pos"]), types = ints(g["types"]);
  int T = static_cast<int>(ids.size());
  F word = f(g["word"]), position = f(g["position"]), type = f(g["token_type"]),
    dout = f(g["dout"]), out(T * C), dword(V * C), dpos(P * C), dtype(Y * C);
  embedding_forward(out.data(), ids.data(), pos.data(), types.data(), word.data(), position.data(),
                    type.data(), T, C);
  embedding_backward(dword.data(), dpos.data(), dtype.data(), dout.data(), ids.data(), pos.data(),
                     types.data(), T, C);
  expect_close(out, g["out"], "out");
  expect_close(dword, g["dword"], "dword");
  expect_close(dpos, g["dposition"], "dposition");
  expect_close(dtype, g["dtoken_type"], "dtoken_type");
}

}  // namespace
}  // namespace packbert::kernels
