// dist::Comm's ring sums and gathers, run under mpirun by test_dist (Dist.RingSums...): every
// rank knows what every rank holds, so it checks its own result against the sum it works out
// alone. Values are small integers, which floats add exactly in any order, except in the
// agreement check, where every rank must end with the same bits whatever the order. Prints "ok"
// on rank 0 and exits 0 when every check passed on every rank; otherwise each failure on stderr
// and exit 1. Rank 0 also prints the value Open MPI took for pml_ob1_send_pipeline_depth, which
// dist::Comm sets unless the user did (read back through MPI's tool interface, MPI_T).
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "dist/comm.h"

using packbert::dist::Comm;

namespace {

// Rank r's element i: an integer in [-1000, 1000].
float value(int r, size_t i) {
  return static_cast<float>(
      static_cast<int>((i * 2654435761u + static_cast<size_t>(r) * 40503u) % 2001) - 1000);
}

float sum_over_ranks(int ranks, size_t i) {
  float s = 0;
  for (int r = 0; r < ranks; ++r) s += value(r, i);
  return s;
}

int failures = 0;

void expect(bool ok, const std::string& what, const Comm& c) {
  if (ok) return;
  ++failures;
  std::cerr << "rank " << c.rank() << ": " << what << '\n';
}

}  // namespace

int main() {
  Comm& c = Comm::world();
  const int N = c.size();
  // Buckets of an arena as backward starts them (the arena's end first), MPI moved on between
  // them; lengths from empty to blocks of several chunk windows (262,144 floats a chunk, 8 a window)
  // on 2 ranks.
  {
    const std::vector<size_t> lengths = {0, 1, 3, 15, 17, 1000, 9'000'001, 5, 262'144};
    size_t total = 0;
    for (size_t n : lengths) total += n;
    std::vector<float> x(total);
    for (size_t i = 0; i < total; ++i) x[i] = value(c.rank(), i);
    size_t end = total;
    for (size_t n : lengths) {
      c.start_allreduce(x.data() + end - n, n);
      c.progress();
      end -= n;
    }
    c.wait_all();
    size_t wrong = 0;
    for (size_t i = 0; i < total; ++i) wrong += x[i] != sum_over_ranks(N, i);
    expect(wrong == 0,
           "all-reduce: " + std::to_string(wrong) + " of " + std::to_string(total) + " sums wrong",
           c);
  }
  // Fractions: the order of the sums shows, and every rank must still hold the same bits.
  {
    std::vector<float> x(300'007);
    for (size_t i = 0; i < x.size(); ++i) x[i] = value(c.rank(), i) / 7.0f + 1e-3f * c.rank();
    c.start_allreduce(x.data(), x.size());
    c.wait_all();
    const std::vector<std::string> all =
        c.allgather(std::string(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float)));
    for (int r = 1; r < N; ++r)
      expect(all[static_cast<size_t>(r)] == all[0],
             "all-reduce: rank " + std::to_string(r) + " holds other bits than rank 0", c);
  }
  // ZeRO-1: ranges that cross the shards' bounds, reduce-scattered; this rank's part of each is
  // summed (the rest of the arena is not read).
  {
    const size_t total = 700'003;
    const std::vector<size_t> bounds = packbert::dist::shard_bounds(total, N);
    std::vector<float> x(total);
    for (size_t i = 0; i < total; ++i) x[i] = value(c.rank(), i);
    const std::vector<size_t> cuts = {0, 7, 100'000, 350'001, 350'002, 699'000, total};
    for (size_t k = cuts.size() - 1; k > 0; --k)
      c.start_reduce_scatter(x.data(), cuts[k - 1], cuts[k], bounds);
    c.wait_all();
    size_t wrong = 0;
    const size_t r = static_cast<size_t>(c.rank());
    for (size_t i = bounds[r]; i < bounds[r + 1]; ++i) wrong += x[i] != sum_over_ranks(N, i);
    expect(wrong == 0,
           "reduce-scatter: " + std::to_string(wrong) + " of this shard's " +
               std::to_string(bounds[r + 1] - bounds[r]) + " sums wrong",
           c);
  }
  // Gathers of each rank's shard, fp32 and 16-bit, with uneven shards and an empty one.
  {
    std::vector<size_t> bounds = {0};
    for (int r = 0; r < N; ++r) bounds.push_back(bounds.back() + (r == 1 ? 0 : 70'001 * (r + 1)));
    const size_t total = bounds.back(), mine = static_cast<size_t>(c.rank());
    std::vector<float> x(total, -5000.0f);
    std::vector<uint16_t> h(total, 0xffff);
    for (size_t i = bounds[mine]; i < bounds[mine + 1]; ++i)
      x[i] = value(c.rank(), i), h[i] = static_cast<uint16_t>(value(c.rank(), i) + 1000);
    c.allgather(x.data(), bounds);
    c.allgather(h.data(), bounds);
    size_t wrong = 0;
    for (int r = 0; r < N; ++r)
      for (size_t i = bounds[static_cast<size_t>(r)]; i < bounds[static_cast<size_t>(r) + 1]; ++i)
        wrong += x[i] != value(r, i) || h[i] != static_cast<uint16_t>(value(r, i) + 1000);
    expect(
        wrong == 0,
        "allgather: " + std::to_string(wrong) + " of " + std::to_string(total) + " elements wrong",
        c);
  }
  double all_failures = failures;
  c.allreduce_sum(&all_failures, 1);
  if (c.root() && all_failures == 0) std::cout << "ok " << N << " ranks\n";
  if (c.root()) {
    int provided = 0, index = 0, count = 0, depth = -1;
    MPI_T_cvar_handle handle;
    if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) == MPI_SUCCESS) {
      if (MPI_T_cvar_get_index("pml_ob1_send_pipeline_depth", &index) == MPI_SUCCESS &&
          MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
        MPI_T_cvar_read(handle, &depth);
        MPI_T_cvar_handle_free(&handle);
      }
      MPI_T_finalize();
    }
    std::cout << "pml_ob1_send_pipeline_depth " << depth << '\n';
  }
  Comm::finalize();
  return all_failures == 0 ? 0 : 1;
}
