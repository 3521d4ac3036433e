// The reference backend's attention (see ref.h): each (sequence, head) block written out as the
// textbook formulas, S = q k^T / sqrt(hs), P = softmax(S) by row (over the keys within the window
// under sliding-window attention), Pd = dropout(P), O = Pd v.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/dropout.h"
#include "kernels/ref/ref.h"

namespace packbert::kernels::ref {

namespace {

// One (sequence, head) block: its L tokens from row t0 of qkv, head h of width hs, its
// probabilities ([L, B]: row i's keys from k0(i), attention_layout.h) at `at` in probs and at
// `drawn` in the dropout stream.
struct Block {
  int64_t t0, L, h, hs, C, at, drawn, B;
  int window;
  double q(const View& qkv, int64_t i, int64_t d) const { return qkv.get(t0 + i, h * hs + d); }
  double k(const View& qkv, int64_t j, int64_t d) const { return qkv.get(t0 + j, C + h * hs + d); }
  double v(const View& qkv, int64_t j, int64_t d) const {
    return qkv.get(t0 + j, 2 * C + h * hs + d);
  }
  int64_t k0(int64_t i) const { return attention_band_start(i, L, window); }
  // Does query i see key j (global: every key of its sequence)?
  bool sees(int64_t i, int64_t j) const { return window <= 0 || std::abs(i - j) <= window / 2; }
};

// P = softmax(q k^T / sqrt(hs)) by row over the keys each query sees, [L * B] (key j of row i at
// i * B + j - k0(i), 0 for keys outside its window); stored as the step keeps probabilities (in
// `probs`' dtype: the engine's rounding when that is 16-bit).
std::vector<double> probabilities(const View& qkv, const Block& b, DType stored) {
  std::vector<double> P(static_cast<size_t>(b.L * b.B), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(b.hs));
  for (int64_t i = 0; i < b.L; ++i) {
    double top = -INFINITY, sum = 0;
    double* row = P.data() + i * b.B - b.k0(i);  // row[j] for key j
    for (int64_t j = b.k0(i); j < b.k0(i) + b.B; ++j) {
      if (!b.sees(i, j)) continue;
      double s = 0;
      for (int64_t d = 0; d < b.hs; ++d) s += b.q(qkv, i, d) * b.k(qkv, j, d);
      row[j] = s * scale;
      top = std::max(top, s * scale);
    }
    for (int64_t j = b.k0(i); j < b.k0(i) + b.B; ++j)
      if (b.sees(i, j)) sum += (row[j] = std::exp(row[j] - top));
    for (int64_t j = b.k0(i); j < b.k0(i) + b.B; ++j)
      if (b.sees(i, j)) row[j] = round_to(stored, row[j] / sum);
  }
  return P;
}

// The dropout multiplier of probability (i, j) (j: its place in row i's band): 0 or 1 / (1 - p).
double dropped(const AttentionDropout& drop, const Block& b, int64_t i, int64_t j) {
  if (drop.p == 0) return 1.0;
  const uint64_t e = static_cast<uint64_t>(b.drawn + i * b.B + j);
  return dropout_uniform(drop.seed, drop.key, e) >= drop.p ? 1.0 / (1.0 - drop.p) : 0.0;
}

// Calls f(block) for every (sequence, head).
template <typename F>
void each_block(const int32_t* cu_seqlens, int n_seq, int NH, int window, int64_t C,
                const AttentionDropout& drop, F f) {
  const std::vector<int64_t> offsets = attention_probs_offsets(cu_seqlens, n_seq, NH, window);
  for (int s = 0; s < n_seq; ++s) {
    const int64_t L = cu_seqlens[s + 1] - cu_seqlens[s], B = attention_band(L, window);
    for (int h = 0; h < NH; ++h) {
      const int64_t at = offsets[s] + h * L * B;
      const int64_t drawn = (drop.first ? drop.first[s] : offsets[s]) + h * L * B;
      f(Block{cu_seqlens[s], L, h, C / NH, C, at, drawn, B, window});
    }
  }
}

}  // namespace

int64_t attention_scratch_elems(int, int, int) {
  return 0;
}

void attention_forward(View out, View probs, View qkv, const int32_t* cu_seqlens, int n_seq, int NH,
                       int window, AttentionDropout dropout, const int64_t*, View) {
  const DType stored = probs ? probs.dtype : qkv.dtype;
  each_block(cu_seqlens, n_seq, NH, window, out.cols, dropout, [&](const Block& b) {
    const std::vector<double> P = probabilities(qkv, b, stored);
    for (int64_t i = 0; i < b.L; ++i) {
      for (int64_t d = 0; d < b.hs; ++d) {
        double o = 0;
        for (int64_t j = 0; j < b.B; ++j)
          o += P[i * b.B + j] * dropped(dropout, b, i, j) * b.v(qkv, b.k0(i) + j, d);
        out.set(b.t0 + i, b.h * b.hs + d, o);
      }
      if (probs)
        for (int64_t j = 0; j < b.B; ++j) probs.put(b.at + i * b.B + j, P[i * b.B + j]);
    }
  });
}

void attention_backward(View dqkv, View dout, View qkv, View probs, const int32_t* cu_seqlens,
                        int n_seq, int NH, int window, AttentionDropout dropout, const int64_t*,
                        View, GradWrite mode) {
  const int64_t T = qkv.rows, C = dout.cols;
  std::vector<double> g(static_cast<size_t>(T * 3 * C), 0.0);  // this call's dqkv
  each_block(cu_seqlens, n_seq, NH, window, C, dropout, [&](const Block& b) {
    std::vector<double> P;
    if (probs) {
      P.resize(static_cast<size_t>(b.L * b.B));
      for (int64_t e = 0; e < b.L * b.B; ++e) P[e] = probs.at(b.at + e);
    } else {
      P = probabilities(qkv, b, qkv.dtype);
    }
    // Probabilities stored in 16 bits no longer sum to 1 by row: each row is divided by its sum,
    // so softmax's backward (whose dS rows sum to 0 only then) holds, and the key bias, whose
    // exact gradient is 0, picks up no rounding noise.
    if (traits(probs ? probs.dtype : qkv.dtype).is_16bit)
      for (int64_t i = 0; i < b.L; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < b.B; ++j) sum += P[i * b.B + j];
        for (int64_t j = 0; j < b.B; ++j) P[i * b.B + j] /= sum;
      }
    const double scale = 1.0 / std::sqrt(static_cast<double>(b.hs));
    auto G = [&](int64_t i, int64_t part, int64_t d) -> double& {
      return g[(b.t0 + i) * 3 * C + part * C + b.h * b.hs + d];
    };
    for (int64_t i = 0; i < b.L; ++i) {
      // dP = dropout'(dO v^T), then dS = P (dP - rowsum(P dP)), over row i's band (keys k0 + j;
      // P is 0 outside its window, and so are their dS and dV terms).
      const int64_t k0 = b.k0(i);
      const double* p = P.data() + i * b.B;
      std::vector<double> dP(static_cast<size_t>(b.B));
      double row = 0;
      for (int64_t j = 0; j < b.B; ++j) {
        double s = 0;
        for (int64_t d = 0; d < b.hs; ++d)
          s += dout.get(b.t0 + i, b.h * b.hs + d) * b.v(qkv, k0 + j, d);
        const double m = dropped(dropout, b, i, j);
        dP[j] = s * m;
        row += p[j] * dP[j];
        for (int64_t d = 0; d < b.hs; ++d)
          G(k0 + j, 2, d) += p[j] * m * dout.get(b.t0 + i, b.h * b.hs + d);
      }
      for (int64_t j = 0; j < b.B; ++j) {
        const double dS = p[j] * (dP[j] - row) * scale;
        for (int64_t d = 0; d < b.hs; ++d) {
          G(i, 0, d) += dS * b.k(qkv, k0 + j, d);
          G(k0 + j, 1, d) += dS * b.q(qkv, i, d);
        }
      }
    }
  });
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < 3 * C; ++c)
      dqkv.set(t, c, (mode == GradWrite::accumulate ? dqkv.get(t, c) : 0.0) + g[t * 3 * C + c]);
}

}  // namespace packbert::kernels::ref
