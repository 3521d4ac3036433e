// The reference backend's attention (see ref.h): each (sequence, head) block written out as the
// textbook formulas, S = q k^T / sqrt(hs), P = softmax(S) by row, Pd = dropout(P), O = Pd v.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/dropout.h"
#include "kernels/ref/ref.h"

namespace packbert::kernels::ref {

namespace {

// One (sequence, head) block: its L tokens from row t0 of qkv, head h of width hs, its
// probabilities at `at` in probs and at `drawn` in the dropout stream.
struct Block {
  int64_t t0, L, h, hs, C, at, drawn;
  double q(const View& qkv, int64_t i, int64_t d) const { return qkv.get(t0 + i, h * hs + d); }
  double k(const View& qkv, int64_t j, int64_t d) const { return qkv.get(t0 + j, C + h * hs + d); }
  double v(const View& qkv, int64_t j, int64_t d) const {
    return qkv.get(t0 + j, 2 * C + h * hs + d);
  }
};

// P = softmax(q k^T / sqrt(hs)) by row, [L * L]; stored as the step keeps probabilities (in
// `probs`' dtype: the engine's rounding when that is 16-bit).
std::vector<double> probabilities(const View& qkv, const Block& b, DType stored) {
  std::vector<double> P(static_cast<size_t>(b.L * b.L));
  const double scale = 1.0 / std::sqrt(static_cast<double>(b.hs));
  for (int64_t i = 0; i < b.L; ++i) {
    double top = -INFINITY, sum = 0;
    for (int64_t j = 0; j < b.L; ++j) {
      double s = 0;
      for (int64_t d = 0; d < b.hs; ++d) s += b.q(qkv, i, d) * b.k(qkv, j, d);
      P[i * b.L + j] = s * scale;
      top = std::max(top, s * scale);
    }
    for (int64_t j = 0; j < b.L; ++j) sum += (P[i * b.L + j] = std::exp(P[i * b.L + j] - top));
    for (int64_t j = 0; j < b.L; ++j) P[i * b.L + j] = round_to(stored, P[i * b.L + j] / sum);
  }
  return P;
}

// The dropout multiplier of probability (i, j): 0 or 1 / (1 - p).
double dropped(const AttentionDropout& drop, const Block& b, int64_t i, int64_t j) {
  if (drop.p == 0) return 1.0;
  const uint64_t e = static_cast<uint64_t>(b.drawn + i * b.L + j);
  return dropout_uniform(drop.seed, drop.key, e) >= drop.p ? 1.0 / (1.0 - drop.p) : 0.0;
}

// Calls f(block) for every (sequence, head).
template <typename F>
void each_block(const int32_t* cu_seqlens, int n_seq, int NH, int64_t C,
                const AttentionDropout& drop, F f) {
  const std::vector<int64_t> offsets = attention_probs_offsets(cu_seqlens, n_seq, NH);
  for (int s = 0; s < n_seq; ++s) {
    const int64_t L = cu_seqlens[s + 1] - cu_seqlens[s];
    for (int h = 0; h < NH; ++h) {
      const int64_t at = offsets[s] + h * L * L;
      const int64_t drawn = (drop.first ? drop.first[s] : offsets[s]) + h * L * L;
      f(Block{cu_seqlens[s], L, h, C / NH, C, at, drawn});
    }
  }
}

}  // namespace

void attention_forward(View out, View probs, View qkv, const int32_t* cu_seqlens, int n_seq, int NH,
                       AttentionDropout dropout, const int64_t*, View) {
  const DType stored = probs ? probs.dtype : qkv.dtype;
  each_block(cu_seqlens, n_seq, NH, out.cols, dropout, [&](const Block& b) {
    const std::vector<double> P = probabilities(qkv, b, stored);
    for (int64_t i = 0; i < b.L; ++i) {
      for (int64_t d = 0; d < b.hs; ++d) {
        double o = 0;
        for (int64_t j = 0; j < b.L; ++j)
          o += P[i * b.L + j] * dropped(dropout, b, i, j) * b.v(qkv, j, d);
        out.set(b.t0 + i, b.h * b.hs + d, o);
      }
      if (probs)
        for (int64_t j = 0; j < b.L; ++j) probs.put(b.at + i * b.L + j, P[i * b.L + j]);
    }
  });
}

void attention_backward(View dqkv, View dout, View qkv, View probs, const int32_t* cu_seqlens,
                        int n_seq, int NH, AttentionDropout dropout, const int64_t*, View,
                        GradWrite mode) {
  const int64_t T = qkv.rows, C = dout.cols;
  std::vector<double> g(static_cast<size_t>(T * 3 * C), 0.0);  // this call's dqkv
  each_block(cu_seqlens, n_seq, NH, C, dropout, [&](const Block& b) {
    std::vector<double> P;
    if (probs) {
      P.resize(static_cast<size_t>(b.L * b.L));
      for (int64_t e = 0; e < b.L * b.L; ++e) P[e] = probs.at(b.at + e);
    } else {
      P = probabilities(qkv, b, qkv.dtype);
    }
    // Probabilities stored in 16 bits no longer sum to 1 by row: each row is divided by its sum,
    // so softmax's backward (whose dS rows sum to 0 only then) holds, and the key bias, whose
    // exact gradient is 0, picks up no rounding noise.
    if (traits(probs ? probs.dtype : qkv.dtype).is_16bit)
      for (int64_t i = 0; i < b.L; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < b.L; ++j) sum += P[i * b.L + j];
        for (int64_t j = 0; j < b.L; ++j) P[i * b.L + j] /= sum;
      }
    const double scale = 1.0 / std::sqrt(static_cast<double>(b.hs));
    auto G = [&](int64_t i, int64_t part, int64_t d) -> double& {
      return g[(b.t0 + i) * 3 * C + part * C + b.h * b.hs + d];
    };
    for (int64_t i = 0; i < b.L; ++i) {
      // dP = dropout'(dO v^T), then dS = P (dP - rowsum(P dP)).
      std::vector<double> dP(static_cast<size_t>(b.L));
      double row = 0;
      for (int64_t j = 0; j < b.L; ++j) {
        double s = 0;
        for (int64_t d = 0; d < b.hs; ++d) s += dout.get(b.t0 + i, b.h * b.hs + d) * b.v(qkv, j, d);
        const double m = dropped(dropout, b, i, j);
        dP[j] = s * m;
        row += P[i * b.L + j] * dP[j];
        for (int64_t d = 0; d < b.hs; ++d)
          G(j, 2, d) += P[i * b.L + j] * m * dout.get(b.t0 + i, b.h * b.hs + d);
      }
      for (int64_t j = 0; j < b.L; ++j) {
        const double dS = P[i * b.L + j] * (dP[j] - row) * scale;
        for (int64_t d = 0; d < b.hs; ++d) {
          G(i, 0, d) += dS * b.k(qkv, j, d);
          G(j, 1, d) += dS * b.q(qkv, i, d);
        }
      }
    }
  });
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < 3 * C; ++c)
      dqkv.set(t, c, (mode == GradWrite::accumulate ? dqkv.get(t, c) : 0.0) + g[t * 3 * C + c]);
}

}  // namespace packbert::kernels::ref
