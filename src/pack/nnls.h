// Non-negative least squares over a matrix given by sparse columns.
#pragma once

#include <utility>
#include <vector>

namespace packbert::pack {

struct SparseColumn {
  std::vector<std::pair<int, double>> entries;  // (row, value); rows distinct
};

// argmin_x ||A x - b||_2 subject to x >= 0, by Lawson & Hanson's active-set method. The
// passive-set least-squares problems are solved through a Cholesky factor of the Gram matrix
// that grows by one row per added column (O(k^2)) and is rebuilt only when columns leave, so
// a problem with tens of thousands of 3-nonzero columns and a few hundred rows takes
// milliseconds. Returns x (one entry per column).
std::vector<double> nnls(int rows, const std::vector<SparseColumn>& columns,
                         const std::vector<double>& b);

}  // namespace packbert::pack
