#include "pack/colgen.h"
#include "stopwatch.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <span>

namespace packbert::pack {

namespace {

constexpr double kPriceTol = 1e-9;  // reduced-cost tolerance
constexpr double kPivotTol = 1e-9;  // smallest usable pivot element
constexpr int kRefactorEvery = 2000;
constexpr int kPatternsPerPricing = 1;

using Column = std::vector<std::pair<int, double>>;  // (row, coefficient)

// All columns in one flat array (CSR): pricing and the Devex update walk every column each
// iteration, and contiguous storage keeps that walk in cache.
class ColumnStore {
 public:
  explicit ColumnStore(const std::vector<Column>& cols) {
    for (const Column& c : cols) push_back(c);
  }
  void push_back(const Column& c) {
    entries_.insert(entries_.end(), c.begin(), c.end());
    start_.push_back(entries_.size());
  }
  size_t size() const { return start_.size() - 1; }
  std::span<const std::pair<int, double>> operator[](size_t j) const {
    return {entries_.data() + start_[j], start_[j + 1] - start_[j]};
  }

 private:
  std::vector<std::pair<int, double>> entries_;
  std::vector<size_t> start_{0};
};

// Revised simplex over  min c^T x, A x - s = d, x, s >= 0  with a dense explicit basis inverse.
// Basic variable ids: >= 0 a pattern column, < 0 the surplus of row -id-1.
class Master {
 public:
  Master(std::vector<double> demand, std::vector<Column> initial)
      : m_(static_cast<int>(demand.size())), d_(std::move(demand)), cols_(initial) {}

  int rows() const { return m_; }
  const ColumnStore& columns() const { return cols_; }
  int add_column(const Column& c) {
    cols_.push_back(c);
    in_basis_.push_back(-1);
    weight_.push_back(1.0);
    rc_.push_back(fresh_reduced_cost(static_cast<int>(cols_.size()) - 1));
    return static_cast<int>(cols_.size()) - 1;
  }

  // Starts from the given basic pattern columns (one per row, forming a nonsingular B).
  void start(const std::vector<int>& basic) {
    in_basis_.assign(cols_.size(), -1);
    weight_.assign(cols_.size(), 1.0);
    surplus_weight_.assign(m_, 1.0);
    basis_ = basic;
    for (int k = 0; k < m_; ++k) in_basis_[basis_[k]] = k;
    refactor();
  }

  // y = c_B^T B^-1, recomputed from scratch (O(m^2)); pivot_in keeps it current in O(m).
  const std::vector<double>& duals() const { return y_; }

  std::vector<double> compute_duals() const {
    std::vector<double> y(m_, 0.0);
    for (int k = 0; k < m_; ++k) {
      if (basis_[k] < 0) continue;  // surplus has cost 0
      const double* row = &Binv_[static_cast<size_t>(k) * m_];
      for (int i = 0; i < m_; ++i) y[i] += row[i];
    }
    return y;
  }

  bool is_basic(int j) const { return in_basis_[j] >= 0; }
  // Devex reference weights (Forrest & Goldfarb): approximate squared edge norms, so pricing
  // by rc^2 / weight picks steep edges and needs far fewer pivots than Dantzig's rule.
  double weight(int var) const { return var >= 0 ? weight_[var] : surplus_weight_[-var - 1]; }
  // Reduced cost 1 - y.a_j of pattern column j, kept current by pivot_in (rc_j -= rc_q alpha_j
  // in the same pass as the Devex update), so pricing is a scan, not a dot product per column.
  double reduced_cost(int j) const { return rc_[j]; }

  // Pivots variable `var` (pattern index, or -(row+1) for a surplus) into the basis.
  // Returns false if the column has no usable pivot (unbounded direction; cannot happen here
  // because the objective is bounded below by zero, but guarded all the same).
  bool pivot_in(int var, double reduced_cost) {
    std::vector<double> u(m_, 0.0);
    for (int k = 0; k < m_; ++k) {
      const double* row = &Binv_[static_cast<size_t>(k) * m_];
      if (var >= 0) {
        double s = 0;
        for (auto [i, a] : cols_[var]) s += row[i] * a;
        u[k] = s;
      } else {
        u[k] = -row[-var - 1];
      }
    }
    int r = -1;
    double best_t = std::numeric_limits<double>::infinity();
    for (int k = 0; k < m_; ++k) {
      if (u[k] <= kPivotTol) continue;
      double t = xB_[k] / u[k];
      if (t < best_t - 1e-12 || (t <= best_t + 1e-12 && r >= 0 && u[k] > u[r])) {
        best_t = t;
        r = k;
      }
    }
    if (r < 0) return false;
    if (best_t < 1e-9) ++degenerate;
    const double piv = u[r];
    double* prow = &Binv_[static_cast<size_t>(r) * m_];
    for (int i = 0; i < m_; ++i) prow[i] /= piv;
    xB_[r] /= piv;
    for (int k = 0; k < m_; ++k) {
      if (k == r || u[k] == 0.0) continue;
      double f = u[k];
      double* row = &Binv_[static_cast<size_t>(k) * m_];
      for (int i = 0; i < m_; ++i) row[i] -= f * prow[i];
      xB_[k] = std::max(0.0, xB_[k] - f * xB_[r]);
    }
    const int leaving = basis_[r];
    if (leaving >= 0) in_basis_[leaving] = -1;
    basis_[r] = var;
    if (var >= 0) in_basis_[var] = r, rc_[var] = 0.0;
    // The entering column's reduced cost drops to zero: y' = y + rc_q * (row r of new B^-1).
    for (int i = 0; i < m_; ++i) y_[i] += reduced_cost * prow[i];
    // Devex update from the pivot row alpha_j = (row r of new B^-1) . a_j.
    const double wq = weight(var);
    for (size_t j = 0; j < cols_.size(); ++j) {
      if (in_basis_[j] >= 0) continue;
      double alpha = 0;
      for (auto [i, a] : cols_[j]) alpha += prow[i] * a;
      weight_[j] = std::max(weight_[j], alpha * alpha * wq);
      rc_[j] -= reduced_cost * alpha;
    }
    for (int i = 0; i < m_; ++i)
      surplus_weight_[i] = std::max(surplus_weight_[i], prow[i] * prow[i] * wq);
    const double w_leave = std::max(wq / (piv * piv), 1.0);
    if (leaving >= 0)
      weight_[leaving] = w_leave;
    else
      surplus_weight_[-leaving - 1] = w_leave;
    if (++since_refactor_ >= kRefactorEvery) refactor();
    return true;
  }

  // Recomputes B^-1 by Gauss-Jordan elimination with partial pivoting, and x_B = B^-1 d.
  void refactor() {
    std::vector<double> B(static_cast<size_t>(m_) * m_, 0.0);
    for (int k = 0; k < m_; ++k) {
      if (basis_[k] >= 0)
        for (auto [i, a] : cols_[basis_[k]]) B[static_cast<size_t>(i) * m_ + k] = a;
      else
        B[static_cast<size_t>(-basis_[k] - 1) * m_ + k] = -1.0;
    }
    Binv_.assign(static_cast<size_t>(m_) * m_, 0.0);
    for (int i = 0; i < m_; ++i) Binv_[static_cast<size_t>(i) * m_ + i] = 1.0;
    for (int c = 0; c < m_; ++c) {
      int p = c;
      for (int i = c + 1; i < m_; ++i)
        if (std::abs(B[static_cast<size_t>(i) * m_ + c]) >
            std::abs(B[static_cast<size_t>(p) * m_ + c]))
          p = i;
      if (p != c)
        for (int j = 0; j < m_; ++j) {
          std::swap(B[static_cast<size_t>(p) * m_ + j], B[static_cast<size_t>(c) * m_ + j]);
          std::swap(Binv_[static_cast<size_t>(p) * m_ + j], Binv_[static_cast<size_t>(c) * m_ + j]);
        }
      double piv = B[static_cast<size_t>(c) * m_ + c];
      assert(piv != 0.0 && "singular basis");
      for (int j = 0; j < m_; ++j) {
        B[static_cast<size_t>(c) * m_ + j] /= piv;
        Binv_[static_cast<size_t>(c) * m_ + j] /= piv;
      }
      for (int i = 0; i < m_; ++i) {
        double f = B[static_cast<size_t>(i) * m_ + c];
        if (i == c || f == 0.0) continue;
        for (int j = 0; j < m_; ++j) {
          B[static_cast<size_t>(i) * m_ + j] -= f * B[static_cast<size_t>(c) * m_ + j];
          Binv_[static_cast<size_t>(i) * m_ + j] -= f * Binv_[static_cast<size_t>(c) * m_ + j];
        }
      }
    }
    // B^-1 now maps row space to basis positions: row k of Binv_ gives basic variable k.
    xB_.assign(m_, 0.0);
    for (int k = 0; k < m_; ++k) {
      double s = 0;
      for (int i = 0; i < m_; ++i) s += Binv_[static_cast<size_t>(k) * m_ + i] * d_[i];
      xB_[k] = std::max(0.0, s);
    }
    y_ = compute_duals();
    rc_.resize(cols_.size());
    for (size_t j = 0; j < cols_.size(); ++j) rc_[j] = fresh_reduced_cost(static_cast<int>(j));
    since_refactor_ = 0;
  }

  // Value of every pattern column (zero for non-basic ones).
  std::vector<double> pattern_values() const {
    std::vector<double> x(cols_.size(), 0.0);
    for (int k = 0; k < m_; ++k)
      if (basis_[k] >= 0) x[basis_[k]] = xB_[k];
    return x;
  }

 private:
  int m_;
  std::vector<double> d_;
  ColumnStore cols_;
  std::vector<int> basis_;
  std::vector<int> in_basis_;
  std::vector<double> Binv_;
  std::vector<double> xB_;
  std::vector<double> y_;
  std::vector<double> weight_, surplus_weight_, rc_;

  double fresh_reduced_cost(int j) const {
    if (in_basis_[j] >= 0) return 0.0;
    double rc = 1.0;
    for (auto [i, a] : cols_[j]) rc -= a * y_[i];
    return rc;
  }
  int since_refactor_ = 0;

 public:
  int degenerate = 0;
};

// Bounded knapsack: patterns (total length <= S, at most `depth` items, item i at most
// bound[i] times) of largest dual value sum_i y_i a_i. Bounds are split into binary pieces so
// the DP is 0/1; with a binding depth cap the DP also indexes the item count. Besides the best
// pattern it returns the best ones ending at other (count, capacity) states, so one call can
// feed the master several improving columns.
struct Knapsack {
  double value = 0;                     // best pattern's value
  std::vector<std::vector<int>> found;  // distinct patterns as per-row counts, best first
};

struct PricingWorkspace {
  std::vector<double> dp;
  std::unique_ptr<uint8_t[]> take;  // fully written before being read; never zeroed
  size_t take_size = 0;
};

Knapsack price(const std::vector<double>& y, const std::vector<int>& len,
               const std::vector<int64_t>& bound, int S, int64_t depth, int max_patterns,
               PricingWorkspace& ws) {
  const int m = static_cast<int>(y.size());
  struct Piece {
    int row, mult, weight;
    double value;
  };
  std::vector<Piece> pieces;
  int min_len = S;
  for (int i = 0; i < m; ++i) {
    if (y[i] <= 1e-12) continue;
    int64_t ub = std::min<int64_t>({bound[i], S / len[i], depth});
    min_len = std::min(min_len, len[i]);
    for (int64_t part = 1; ub > 0; part *= 2) {
      int mult = static_cast<int>(std::min(part, ub));
      pieces.push_back({i, mult, mult * len[i], mult * y[i]});
      ub -= mult;
    }
  }
  Knapsack out;
  if (pieces.empty()) return out;
  const int W = S + 1;
  const int D = depth >= S / min_len ? 0 : static_cast<int>(depth);  // 0: count never binds
  const int K = D + 1;
  ws.dp.assign(static_cast<size_t>(K) * W, 0.0);
  double* dp = ws.dp.data();
  const size_t need = pieces.size() * K * W;
  if (ws.take_size < need) ws.take.reset(new uint8_t[need]), ws.take_size = need;
  // take[p][k][c] = 1 if piece p improved state (k, c) when it was processed; every entry is
  // written (branch-free, so the capped loop vectorises).
  for (size_t p = 0; p < pieces.size(); ++p) {
    const Piece& pc = pieces[p];
    uint8_t* tk = &ws.take[p * K * W];
    if (D == 0) {
      std::fill(tk, tk + pc.weight, 0);
      for (int c = S; c >= pc.weight; --c) {
        double cand = dp[c - pc.weight] + pc.value;
        bool better = cand > dp[c];
        dp[c] = better ? cand : dp[c];
        tk[c] = better;
      }
    } else {
      const int mult = pc.mult, w = pc.weight;
      const double v = pc.value;
      std::fill(tk, tk + static_cast<size_t>(mult) * W, 0);
      for (int k = D; k >= mult; --k) {
        // Reads row k - mult, writes row k: no overlap, so the loop vectorises.
        const double* __restrict prev = &dp[static_cast<size_t>(k - mult) * W];
        double* __restrict cur = &dp[static_cast<size_t>(k) * W];
        uint8_t* __restrict t = tk + static_cast<size_t>(k) * W;
        std::fill(t, t + w, 0);
        for (int c = w; c <= S; ++c) {
          double cand = prev[c - w] + v;
          bool better = cand > cur[c];
          cur[c] = better ? cand : cur[c];
          t[c] = better;
        }
      }
    }
  }
  out.value = dp[static_cast<size_t>(D) * W + S];
  auto reconstruct = [&](int k, int c) {
    std::vector<int> count(m, 0);
    for (size_t p = pieces.size(); p-- > 0;) {
      if (!ws.take[p * K * W + static_cast<size_t>(k) * W + c]) continue;
      count[pieces[p].row] += pieces[p].mult;
      c -= pieces[p].weight;
      if (D) k -= pieces[p].mult;
    }
    return count;
  };
  // End states in order of value: the full state first, then smaller capacities and counts.
  std::vector<std::pair<double, int>> states;
  for (int k = D; k >= (D ? 1 : 0); --k)
    for (int c = S; c >= min_len; --c) {
      double v = dp[static_cast<size_t>(k) * W + c];
      if (v > 1.0 + kPriceTol) states.push_back({v, k * W + c});
    }
  std::stable_sort(states.begin(), states.end(),
                   [](auto& a, auto& b) { return a.first > b.first; });
  for (auto [v, state] : states) {
    if (static_cast<int>(out.found.size()) >= max_patterns) break;
    std::vector<int> count = reconstruct(state / W, state % W);
    if (std::find(out.found.begin(), out.found.end(), count) == out.found.end())
      out.found.push_back(std::move(count));
  }
  return out;
}

}  // namespace

LpSolution solve_packing_lp(const std::vector<int64_t>& demand, int max_len, int64_t depth,
                            const std::vector<Pattern>& seeds) {
  const Stopwatch clock;
  std::vector<int> len, row_of(max_len + 1, -1);
  std::vector<double> d;
  std::vector<int64_t> bound;
  for (int l = 1; l <= max_len; ++l)
    if (demand[l] > 0) {
      row_of[l] = static_cast<int>(len.size());
      len.push_back(l);
      d.push_back(static_cast<double>(demand[l]));
      bound.push_back(demand[l]);
    }
  const int m = static_cast<int>(len.size());
  LpSolution out;
  if (m == 0) return out;

  // Initial basis: one homogeneous pattern per length, as many copies as fit.
  std::vector<Column> cols;
  std::vector<int> basic;
  for (int i = 0; i < m; ++i) {
    int64_t a = std::min<int64_t>({max_len / len[i], depth, bound[i]});
    basic.push_back(static_cast<int>(cols.size()));
    cols.push_back({{i, static_cast<double>(a)}});
  }
  for (const Pattern& p : seeds) {
    Column c;
    int total = 0;
    int64_t items = 0;
    for (auto [l, n] : p.items) {
      if (l < 1 || l > max_len || row_of[l] < 0) continue;
      int64_t take = std::min<int64_t>(n, bound[row_of[l]]);
      if (take <= 0) continue;
      c.push_back({row_of[l], static_cast<double>(take)});
      total += static_cast<int>(take) * l;
      items += take;
    }
    if (!c.empty() && total <= max_len && items <= depth) cols.push_back(std::move(c));
  }
  Master lp(d, cols);
  lp.start(basic);

  const int max_iterations = 200000;
  PricingWorkspace workspace;
  double farley = 0;
  int it = 0;
  for (; it < max_iterations; ++it) {
    const std::vector<double>& y = lp.duals();
    int enter = 0;
    double best_rc = 0, best_score = 0;
    // Devex pricing over every column: score rc^2 / weight.
    auto consider = [&](int var, double rc) {
      if (rc >= -kPriceTol) return;
      double sc = rc * rc / lp.weight(var);
      if (sc > best_score) best_score = sc, best_rc = rc, enter = var;
    };
    for (int i = 0; i < m; ++i) consider(-i - 1, y[i]);
    for (int j = 0; j < static_cast<int>(lp.columns().size()); ++j) {
      if (!lp.is_basic(j)) consider(j, lp.reduced_cost(j));
    }
    if (best_score == 0) {  // no column prices out: generate one
      Knapsack k = price(y, len, bound, max_len, depth, kPatternsPerPricing, workspace);
      double dy = 0;
      for (int i = 0; i < m; ++i) dy += d[i] * std::max(0.0, y[i]);
      farley = std::max(farley, dy / std::max(1.0, k.value));
      if (k.found.empty()) break;
      best_rc = 1.0 - k.value;
      for (size_t f = 0; f < k.found.size(); ++f) {
        Column c;
        for (int i = 0; i < m; ++i)
          if (k.found[f][i]) c.push_back({i, static_cast<double>(k.found[f][i])});
        int id = lp.add_column(c);
        if (f == 0) enter = id;
        ++out.generated;
      }
    }
    if (!lp.pivot_in(enter, best_rc)) break;
  }
  lp.refactor();
  if (std::getenv("PACKBERT_DEBUG_LP"))
    std::fprintf(
        stderr,
        "colgen: rows %d, iterations %d (degenerate %d), generated %d, columns %zu, %.4f s\n", m,
        it, lp.degenerate, out.generated, lp.columns().size(),
        clock.seconds());
  out.iterations = it;
  out.dual_bound = farley;
  std::vector<double> x = lp.pattern_values();
  for (size_t j = 0; j < lp.columns().size(); ++j) {
    Pattern p;
    for (auto [i, a] : lp.columns()[j])
      p.items.push_back({len[i], static_cast<int>(std::lround(a))});
    out.patterns.push_back(std::move(p));
    out.x.push_back(x[j]);
    out.value += x[j];
  }
  return out;
}

}  // namespace packbert::pack
