// The reference backend's element-wise, per-row and linear ops (see ref.h).
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dropout.h"
#include "kernels/ref/ref.h"
#include "kernels/rotary.h"

namespace packbert::kernels::ref {

namespace {

bool is16(const View& v) {
  return v && traits(v.dtype).is_16bit;
}

void require(bool ok, const char* op, const char* what) {
  if (!ok) throw std::logic_error(std::string("ref::") + op + ": " + what);
}

// An input gradient's element: accumulated onto, or written over (GradWrite).
void write_grad(const View& d, int64_t r, int64_t c, double g, GradWrite mode) {
  d.set(r, c, mode == GradWrite::accumulate ? d.get(r, c) + g : g);
}

// The weight W[o][c] of a linear layer, dense or block-sparse, as a dense double matrix.
std::vector<double> dense_weight(const View& weight, const BlockPattern* p, int64_t OC, int64_t C) {
  std::vector<double> W(static_cast<size_t>(OC * C), 0.0);
  if (!p) {
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t c = 0; c < C; ++c) W[o * C + c] = weight.get(o, c);
    return W;
  }
  const int B = p->block;
  for (int s = 0; s < p->nnz(); ++s)
    for (int o = 0; o < B; ++o)
      for (int i = 0; i < B; ++i)
        W[(int64_t{p->slot_row[s]} * B + o) * C + int64_t{p->slot_col[s]} * B + i] =
            weight.at((int64_t{s} * B + o) * B + i);
  return W;
}

}  // namespace

int64_t sparse_linear_scratch_elems(int, int, int, int64_t, int) {
  return 0;
}

void linear_forward(View out, View in, View weight, View bias, const BlockPattern* pattern, View) {
  const int64_t N = in.rows, C = in.cols, OC = out.cols;
  require(out.rows == N, "linear_forward", "out and in differ in rows");
  require(pattern || weight.dtype == in.dtype, "linear_forward", "in and weight differ in dtype");
  const std::vector<double> W = dense_weight(weight, pattern, OC, C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double acc = bias ? bias.at(o) : 0.0;
      for (int64_t c = 0; c < C; ++c) acc += in.get(n, c) * W[o * C + c];
      out.set(n, o, acc);
    }
}

void linear_backward(View dinp, View dweight, View dbias, View dout, View in, View weight,
                     const BlockPattern* pattern, GradWrite mode, View) {
  const int64_t N = in.rows, C = in.cols, OC = dout.cols;
  require(!is16(dout) || !dbias, "linear_backward", "a 16-bit dout comes without dbias");
  const std::vector<double> W = dense_weight(weight, pattern, OC, C);
  // A dense 16-bit layer multiplies the output gradient rounded to its operands' dtype.
  const bool round = !pattern && is16(in);
  std::vector<double> g(static_cast<size_t>(N * OC));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o)
      g[n * OC + o] = round ? round_to(in.dtype, dout.get(n, o)) : dout.get(n, o);
  if (dinp)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t o = 0; o < OC; ++o) acc += g[n * OC + o] * W[o * C + c];
        write_grad(dinp, n, c, acc, mode);
      }
  auto dW = [&](int64_t o, int64_t c) {
    double acc = 0;
    for (int64_t n = 0; n < N; ++n) acc += g[n * OC + o] * in.get(n, c);
    return acc;
  };
  if (!dweight) {
    require(!pattern, "linear_backward", "a block-sparse layer's weight gradient is always formed");
  } else if (!pattern) {
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t c = 0; c < C; ++c) dweight.set(o, c, dweight.get(o, c) + dW(o, c));
  } else {
    const int B = pattern->block;
    for (int s = 0; s < pattern->nnz(); ++s)
      for (int o = 0; o < B; ++o)
        for (int i = 0; i < B; ++i) {
          const int64_t k = (int64_t{s} * B + o) * B + i;
          dweight.put(k, dweight.at(k) + dW(int64_t{pattern->slot_row[s]} * B + o,
                                            int64_t{pattern->slot_col[s]} * B + i));
        }
  }
  if (dbias)
    for (int64_t o = 0; o < OC; ++o) {
      double acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += dout.get(n, o);
      dbias.put(o, dbias.at(o) + acc);
    }
}

void linear_block_grad_norms(View block_l1, View dout, View in, int block, View, View) {
  const int64_t N = in.rows, C = in.cols, OC = dout.cols;
  for (int64_t o = 0; o < OC; ++o)
    for (int64_t c = 0; c < C; ++c) {
      double g = 0;
      for (int64_t n = 0; n < N; ++n) {
        const double d = is16(in) ? round_to(in.dtype, dout.get(n, o)) : dout.get(n, o);
        g += d * in.get(n, c);
      }
      block_l1.set(o / block, c / block, block_l1.get(o / block, c / block) + std::abs(g));
    }
}

void layernorm_apply(View out, View in, View mean, View rstd, View weight, View bias, View out16) {
  for (int64_t n = 0; n < in.rows; ++n)
    for (int64_t c = 0; c < in.cols; ++c) {
      const double y =
          (in.get(n, c) - mean.at(n)) * rstd.at(n) * weight.at(c) + (bias ? bias.at(c) : 0.0);
      if (out) out.set(n, c, y);
      if (out16) out16.set(n, c, y);
    }
}

// The output is formed from the statistics as kept, so layernorm_apply rebuilds it bit for bit.
void layernorm_forward(View out, View mean, View rstd, View in, View weight, View bias, double eps,
                       View out16) {
  const int64_t N = in.rows, C = in.cols;
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) m += in.get(n, c);
    m /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += (in.get(n, c) - m) * (in.get(n, c) - m);
    var /= static_cast<double>(C);
    mean.put(n, m);
    rstd.put(n, 1.0 / std::sqrt(var + eps));
  }
  layernorm_apply(out, in, mean, rstd, weight, bias, out16);
}

void layernorm_backward(View dinp, View dweight, View dbias, View dout, View in, View weight,
                        View mean, View rstd, GradWrite mode) {
  const int64_t N = in.rows, C = in.cols;
  for (int64_t n = 0; n < N; ++n) {
    const double m = mean.at(n), s = rstd.at(n);
    double mean_d = 0, mean_dx = 0;  // the row means of dnorm and dnorm * xhat
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (in.get(n, c) - m) * s, dnorm = dout.get(n, c) * weight.at(c);
      mean_d += dnorm;
      mean_dx += dnorm * xhat;
      dweight.put(c, dweight.at(c) + dout.get(n, c) * xhat);
      if (dbias) dbias.put(c, dbias.at(c) + dout.get(n, c));
    }
    mean_d /= static_cast<double>(C);
    mean_dx /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (in.get(n, c) - m) * s, dnorm = dout.get(n, c) * weight.at(c);
      write_grad(dinp, n, c, s * (dnorm - mean_d - xhat * mean_dx), mode);
    }
  }
}

namespace {

double gelu(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double gelu_grad(double x) {
  const double kInvSqrt2Pi = 0.3989422804014327;
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * kInvSqrt2Pi * std::exp(-0.5 * x * x);
}

}  // namespace

void gelu_forward(View out, View in) {
  for (int64_t r = 0; r < in.rows; ++r)
    for (int64_t c = 0; c < in.cols; ++c) out.set(r, c, gelu(in.get(r, c)));
}

void gelu_backward(View dinp, View dbias, View in, View dout, GradWrite mode) {
  require(!is16(dinp) || (dbias && mode == GradWrite::overwrite), "gelu_backward",
          "a 16-bit input gradient is written over, with its bias gradient");
  for (int64_t r = 0; r < in.rows; ++r)
    for (int64_t c = 0; c < in.cols; ++c) {
      const double d = dout.get(r, c) * gelu_grad(in.get(r, c));
      write_grad(dinp, r, c, d, mode);
      if (dbias) dbias.put(c, dbias.at(c) + d);
    }
}

void geglu_forward(View out, View in) {
  const int64_t I = out.cols;
  require(in.cols == 2 * I && in.rows == out.rows, "geglu_forward", "in is [N, 2 I], out [N, I]");
  for (int64_t r = 0; r < out.rows; ++r)
    for (int64_t c = 0; c < I; ++c) out.set(r, c, gelu(in.get(r, c)) * in.get(r, I + c));
}

void geglu_backward(View dinp, View in, View dout, GradWrite mode) {
  const int64_t I = dout.cols;
  require(in.cols == 2 * I && dinp.cols == 2 * I, "geglu_backward", "in and dinp are [N, 2 I]");
  for (int64_t r = 0; r < dout.rows; ++r)
    for (int64_t c = 0; c < I; ++c) {
      const double x = in.get(r, c), g = in.get(r, I + c), d = dout.get(r, c);
      write_grad(dinp, r, c, d * g * gelu_grad(x), mode);
      write_grad(dinp, r, I + c, d * gelu(x), mode);
    }
}

void rotary_forward(View out, View in, const int32_t* pos, int heads, double theta) {
  const int64_t D = in.cols / heads;
  require(D * heads == in.cols && D % 2 == 0, "rotary_forward", "heads x an even head size");
  const std::vector<float> inv = rotary_inv_freq(static_cast<int>(D), theta);
  for (int64_t n = 0; n < in.rows; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = rotary_angle(pos[n], inv[static_cast<size_t>(i)]);
        const double c = std::cos(a), s = std::sin(a);
        const int64_t lo = h * D + i, hi = lo + D / 2;
        const double x1 = in.get(n, lo), x2 = in.get(n, hi);
        out.set(n, lo, x1 * c - x2 * s);
        out.set(n, hi, x2 * c + x1 * s);
      }
}

void rotary_backward(View dinp, View dout, const int32_t* pos, int heads, double theta,
                     GradWrite mode) {
  const int64_t D = dout.cols / heads;
  require(D * heads == dout.cols && D % 2 == 0, "rotary_backward", "heads x an even head size");
  const std::vector<float> inv = rotary_inv_freq(static_cast<int>(D), theta);
  for (int64_t n = 0; n < dout.rows; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = rotary_angle(pos[n], inv[static_cast<size_t>(i)]);
        const double c = std::cos(a), s = std::sin(a);
        const int64_t lo = h * D + i, hi = lo + D / 2;
        const double g1 = dout.get(n, lo), g2 = dout.get(n, hi);
        write_grad(dinp, n, lo, g1 * c + g2 * s, mode);
        write_grad(dinp, n, hi, g2 * c - g1 * s, mode);
      }
}

void tanh_forward(View out, View in) {
  for (int64_t i = 0; i < in.numel(); ++i) out.put(i, std::tanh(in.at(i)));
}

void tanh_backward(View dinp, View out, View dout) {
  for (int64_t i = 0; i < out.numel(); ++i)
    dinp.put(i, dinp.at(i) + dout.at(i) * (1.0 - out.at(i) * out.at(i)));
}

void residual_forward(View out, View a, View b) {
  for (int64_t i = 0; i < out.numel(); ++i) out.put(i, a.at(i) + b.at(i));
}

void dropout_forward(View out, View in, double p, uint64_t seed, uint64_t key, uint64_t first) {
  for (int64_t i = 0; i < in.numel(); ++i) {
    const bool keep = dropout_uniform(seed, key, first + static_cast<uint64_t>(i)) >= p;
    out.put(i, keep ? in.at(i) / (1.0 - p) : 0.0);
  }
}

void dropout_backward(View dinp, View dout, double p, uint64_t seed, uint64_t key, uint64_t first) {
  for (int64_t i = 0; i < dout.numel(); ++i) {
    const bool keep = dropout_uniform(seed, key, first + static_cast<uint64_t>(i)) >= p;
    dinp.put(i, dinp.at(i) + (keep ? dout.at(i) / (1.0 - p) : 0.0));
  }
}

void embedding_forward(View out, const int32_t* ids, const int32_t* pos, const int32_t* types,
                       View word, View position, View token_type) {
  for (int64_t t = 0; t < out.rows; ++t)
    for (int64_t c = 0; c < out.cols; ++c)
      out.set(t, c, word.get(ids[t], c) + position.get(pos[t], c) + token_type.get(types[t], c));
}

void embedding_backward(View dword, View dposition, View dtoken_type, View dout, const int32_t* ids,
                        const int32_t* pos, const int32_t* types) {
  for (int64_t t = 0; t < dout.rows; ++t)
    for (int64_t c = 0; c < dout.cols; ++c) {
      const double d = dout.get(t, c);
      dword.set(ids[t], c, dword.get(ids[t], c) + d);
      dposition.set(pos[t], c, dposition.get(pos[t], c) + d);
      dtoken_type.set(types[t], c, dtoken_type.get(types[t], c) + d);
    }
}

int64_t cross_entropy_forward(View losses, View lse, View logits, const int32_t* targets) {
  int64_t hits = 0;
  for (int64_t n = 0; n < logits.rows; ++n) {
    if (targets[n] < 0) {
      losses.put(n, 0.0);
      lse.put(n, 0.0);
      continue;
    }
    int64_t first_max = 0;
    for (int64_t v = 1; v < logits.cols; ++v)
      if (logits.get(n, v) > logits.get(n, first_max)) first_max = v;
    const double top = logits.get(n, first_max);
    double sum = 0;
    for (int64_t v = 0; v < logits.cols; ++v) sum += std::exp(logits.get(n, v) - top);
    const double l = top + std::log(sum);
    lse.put(n, l);
    losses.put(n, l - logits.get(n, targets[n]));
    hits += first_max == targets[n];
  }
  return hits;
}

void cross_entropy_backward(View dlogits, View dbias, View logits, View lse, const int32_t* targets,
                            View dlosses, GradWrite mode) {
  if (is16(dlogits)) mode = GradWrite::overwrite;  // written rounded, rows without a target 0
  for (int64_t n = 0; n < logits.rows; ++n)
    for (int64_t v = 0; v < logits.cols; ++v) {
      const double d =
          targets[n] < 0
              ? 0.0
              : (std::exp(logits.get(n, v) - lse.at(n)) - (v == targets[n] ? 1.0 : 0.0)) *
                    dlosses.at(n);
      write_grad(dlogits, n, v, d, mode);
      if (dbias) dbias.put(v, dbias.at(v) + d);
    }
}

int64_t count_argmax_hits(View scores, const int32_t* targets) {
  int64_t hits = 0;
  for (int64_t n = 0; n < scores.rows; ++n) {
    if (targets[n] < 0) continue;
    int64_t first_max = 0;
    for (int64_t v = 1; v < scores.cols; ++v)
      if (scores.get(n, v) > scores.get(n, first_max)) first_max = v;
    hits += first_max == targets[n];
  }
  return hits;
}

void convert(View out, View in) {
  require(out.numel() == in.numel(), "convert", "out and in differ in size");
  for (int64_t i = 0; i < in.numel(); ++i) out.put(i, in.at(i));
}

void zero(View out) {
  for (int64_t r = 0; r < out.rows; ++r)
    for (int64_t c = 0; c < out.cols; ++c) out.set(r, c, 0.0);
}

void gather_rows_forward(View out, View in, const int32_t* rows) {
  for (int64_t r = 0; r < out.rows; ++r)
    for (int64_t c = 0; c < out.cols; ++c) out.set(r, c, in.get(rows[r], c));
}

void gather_rows_backward(View dinp, View dout, const int32_t* rows) {
  for (int64_t r = 0; r < dout.rows; ++r)
    for (int64_t c = 0; c < dout.cols; ++c)
      dinp.set(rows[r], c, dinp.get(rows[r], c) + dout.get(r, c));
}

void span_cross_entropy_forward(View losses, View probs, View logits, const int32_t* cu_seqlens,
                                const int32_t* targets, int n_seq) {
  for (int s = 0; s < n_seq; ++s) {
    const int64_t a = cu_seqlens[s], b = cu_seqlens[s + 1];
    double loss = 0;
    for (int col = 0; col < 2; ++col) {
      double top = logits.get(a, col), sum = 0;
      for (int64_t t = a; t < b; ++t) top = std::max(top, logits.get(t, col));
      for (int64_t t = a; t < b; ++t) sum += std::exp(logits.get(t, col) - top);
      for (int64_t t = a; t < b; ++t) probs.set(t, col, std::exp(logits.get(t, col) - top) / sum);
      const int32_t target = targets[2 * s + col];
      if (target >= 0) loss += top + std::log(sum) - logits.get(a + target, col);
    }
    losses.put(s, targets[2 * s] < 0 ? 0.0 : loss / 2);
  }
}

void span_cross_entropy_backward(View dlogits, View probs, const int32_t* cu_seqlens,
                                 const int32_t* targets, View dlosses, int n_seq) {
  for (int s = 0; s < n_seq; ++s) {
    if (targets[2 * s] < 0) continue;
    for (int col = 0; col < 2; ++col)
      for (int64_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; ++t) {
        const double onehot = t - cu_seqlens[s] == targets[2 * s + col] ? 1.0 : 0.0;
        dlogits.set(t, col, dlogits.get(t, col) + (probs.get(t, col) - onehot) * dlosses.at(s) / 2);
      }
  }
}

void squared_error_forward(View losses, View pred, View target) {
  for (int64_t n = 0; n < pred.numel(); ++n) {
    const double e = pred.at(n) - target.at(n);
    losses.put(n, e * e);
  }
}

void squared_error_backward(View dpred, View dtarget, View pred, View target, View dlosses) {
  for (int64_t n = 0; n < pred.numel(); ++n) {
    const double g = 2 * (pred.at(n) - target.at(n)) * dlosses.at(n);
    dpred.put(n, dpred.at(n) + g);
    if (dtarget) dtarget.put(n, dtarget.at(n) - g);
  }
}

}  // namespace packbert::kernels::ref
