#include "pack/nnls.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace packbert::pack {

namespace {

// Lower-triangular Cholesky factor of the Gram matrix A_P^T A_P of the passive columns P,
// stored row-major with a fixed stride so it can grow one row at a time.
class GramCholesky {
 public:
  GramCholesky(int rows, const std::vector<SparseColumn>& cols)
      : cols_(cols), dense_(rows, 0.0), stride_(std::max(rows, 1)) {}

  int size() const { return static_cast<int>(passive_.size()); }
  const std::vector<int>& passive() const { return passive_; }

  // Appends column j; false (and no change) if it is numerically dependent on P.
  bool append(int j) {
    const int k = size();
    ensure_capacity(k + 1);
    scatter(j);
    double* row = &L_[static_cast<size_t>(k) * stride_];
    for (int i = 0; i < k; ++i) row[i] = gather(passive_[i]);
    double diag = gather(j);
    unscatter(j);
    // Forward-substitute L l = g in place.
    for (int i = 0; i < k; ++i) {
      const double* Li = &L_[static_cast<size_t>(i) * stride_];
      double s = row[i];
      for (int t = 0; t < i; ++t) s -= Li[t] * row[t];
      row[i] = s / Li[i];
    }
    double d = diag;
    for (int i = 0; i < k; ++i) d -= row[i] * row[i];
    if (!(d > 1e-10 * diag)) return false;
    row[k] = std::sqrt(d);
    passive_.push_back(j);
    return true;
  }

  // Removes the column at position p of P in O(k^2): drop row p of L, then Givens rotations
  // on column pairs (j, j+1), j >= p, restore the triangle (G = L L^T is unchanged by them).
  void remove_at(int p) {
    const int k = size();
    auto at = [&](int i, int j) -> double& { return L_[static_cast<size_t>(i) * stride_ + j]; };
    for (int i = p; i + 1 < k; ++i)
      for (int j = 0; j <= i + 1; ++j) at(i, j) = at(i + 1, j);
    for (int j = p; j + 1 < k; ++j) {
      double a = at(j, j), b = at(j, j + 1);
      double r = std::hypot(a, b);
      double c = a / r, s = b / r;
      for (int i = j; i + 1 < k; ++i) {
        double x = at(i, j), y = at(i, j + 1);
        at(i, j) = c * x + s * y;
        at(i, j + 1) = -s * x + c * y;
      }
    }
    passive_.erase(passive_.begin() + p);
  }

  // Solves (A_P^T A_P) z = A_P^T b.
  std::vector<double> solve(const std::vector<double>& b) const {
    const int k = size();
    std::vector<double> z(k);
    for (int i = 0; i < k; ++i) {
      double s = 0;
      for (auto [r, v] : cols_[passive_[i]].entries) s += v * b[r];
      const double* Li = &L_[static_cast<size_t>(i) * stride_];
      for (int t = 0; t < i; ++t) s -= Li[t] * z[t];
      z[i] = s / Li[i];
    }
    for (int i = k - 1; i >= 0; --i) {
      double s = z[i];
      for (int t = i + 1; t < k; ++t) s -= L_[static_cast<size_t>(t) * stride_ + i] * z[t];
      z[i] = s / L_[static_cast<size_t>(i) * stride_ + i];
    }
    return z;
  }

 private:
  void ensure_capacity(int k) {
    if (static_cast<size_t>(k) * stride_ > L_.size()) {
      // Grow the row count only; the stride (max rank) is fixed.
      L_.resize(static_cast<size_t>(std::max(k, 2 * (static_cast<int>(L_.size() / stride_) + 1))) *
                stride_);
    }
  }
  void scatter(int j) {
    for (auto [r, v] : cols_[j].entries) dense_[r] = v;
  }
  void unscatter(int j) {
    for (auto [r, v] : cols_[j].entries) dense_[r] = 0.0;
  }
  double gather(int j) const {
    double s = 0;
    for (auto [r, v] : cols_[j].entries) s += v * dense_[r];
    return s;
  }

  const std::vector<SparseColumn>& cols_;
  std::vector<double> dense_;
  size_t stride_;
  std::vector<double> L_;
  std::vector<int> passive_;
};

}  // namespace

std::vector<double> nnls(int rows, const std::vector<SparseColumn>& columns,
                         const std::vector<double>& b) {
  const int n = static_cast<int>(columns.size());
  std::vector<double> x(n, 0.0), residual(b), w(n);
  std::vector<char> in_passive(n, 0), banned(n, 0);
  GramCholesky chol(rows, columns);

  auto gradient = [&] {
    std::copy(b.begin(), b.end(), residual.begin());
    for (int j : chol.passive())
      for (auto [r, v] : columns[j].entries) residual[r] -= v * x[j];
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (auto [r, v] : columns[j].entries) s += v * residual[r];
      w[j] = s;
    }
  };
  gradient();
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  const double tol = 1e-11 * std::max(scale, 1.0);

  const int max_outer = 3 * n + 10;
  for (int outer = 0; outer < max_outer; ++outer) {
    int best = -1;
    for (int j = 0; j < n; ++j)
      if (!in_passive[j] && !banned[j] && w[j] > tol && (best < 0 || w[j] > w[best])) best = j;
    if (best < 0 || chol.size() >= rows) break;
    if (!chol.append(best)) {
      banned[best] = 1;
      continue;
    }
    in_passive[best] = 1;

    for (bool first = true;; first = false) {
      const std::vector<int>& P = chol.passive();
      std::vector<double> z = chol.solve(b);
      int k = static_cast<int>(P.size());
      if (first && z[k - 1] <= 0) {  // the entering column cannot move: rounding noise
        banned[best] = 1;
        in_passive[best] = 0;
        chol.remove_at(k - 1);
        break;
      }
      bool feasible = std::all_of(z.begin(), z.end(), [](double v) { return v > 0; });
      if (feasible) {
        for (int i = 0; i < k; ++i) x[P[i]] = z[i];
        std::fill(banned.begin(), banned.end(), 0);
        break;
      }
      // Step towards z until the first passive variable reaches zero; it (and any other that
      // lands on zero) leaves P.
      double alpha = 1.0;
      int blocking = -1;
      for (int i = 0; i < k; ++i)
        if (z[i] <= 0) {
          double a = x[P[i]] / (x[P[i]] - z[i]);
          if (blocking < 0 || a < alpha) alpha = a, blocking = i;
        }
      std::vector<int> leave;
      for (int i = 0; i < k; ++i) {
        double& xi = x[P[i]];
        xi += alpha * (z[i] - xi);
        if (i == blocking || xi <= 0) leave.push_back(i);
      }
      for (size_t t = leave.size(); t-- > 0;) {  // back to front keeps positions valid
        int j = P[leave[t]];
        x[j] = 0;
        in_passive[j] = 0;
        chol.remove_at(leave[t]);
      }
    }
    gradient();
  }
  return x;
}

}  // namespace packbert::pack
