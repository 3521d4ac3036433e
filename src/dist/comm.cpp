#include "dist/comm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "error.h"
#include "stopwatch.h"

#ifdef PACKBERT_MPI
#include <mpi.h>
#endif

namespace packbert::dist {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

void fail_together(Comm& comm, const std::function<void()>& work) {
  if (!comm.distributed()) return work();
  std::string error;
  try {
    work();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "failed";
  }
  const std::vector<std::string> all = comm.allgather(error);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) throw SharedError("rank " + std::to_string(r) + ": " + all[r]);
}

std::vector<size_t> shard_bounds(size_t n, int ranks, size_t align) {
  std::vector<size_t> b(static_cast<size_t>(ranks) + 1, n);
  b[0] = 0;
  for (int r = 1; r < ranks; ++r) {
    const size_t even = n / static_cast<size_t>(ranks) * static_cast<size_t>(r);
    b[r] = std::min(n, (even + align / 2) / align * align);
  }
  return b;
}

#ifdef PACKBERT_MPI

namespace {

std::vector<MPI_Request> pending;  // the started all-reduces, in order
// A started reduce-scatter leaves this rank's sum at its range's start: n floats to move from
// `from` to `to` (within the range) once it completes.
struct Move {
  float *from, *to;
  size_t n;
};
std::vector<Move> moves;
std::vector<MPI_Request> sends;  // the started point-to-point sends

// MPI counts are int: a range longer than that is sent in pieces by the callers below.
constexpr size_t kMaxCount = static_cast<size_t>(std::numeric_limits<int>::max()) / 2;

std::vector<int> counts_of(const std::vector<size_t>& bounds, std::vector<int>* displs) {
  std::vector<int> counts;
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    if (bounds[r + 1] - bounds[r] > kMaxCount || bounds.back() > kMaxCount)
      throw std::length_error("a sharded arena of " + std::to_string(bounds.back()) +
                              " elements exceeds what one MPI call carries");
    counts.push_back(static_cast<int>(bounds[r + 1] - bounds[r]));
    if (displs) displs->push_back(static_cast<int>(bounds[r]));
  }
  return counts;
}

}  // namespace

Comm::Comm() {
  if (!launched_by_mpi()) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  mpi_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

void Comm::finalize() {
  Comm& c = world();
  if (!c.mpi_) return;
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
}

void Comm::abort(int code) {
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

void Comm::allreduce_sum(double* x, size_t n) {
  if (size_ > 1)
    MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

void Comm::allreduce_max(double* x, size_t n) {
  if (size_ > 1)
    MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
}

std::vector<std::string> Comm::allgather(const std::string& s) {
  if (size_ == 1) return {s};
  int len = static_cast<int>(s.size());
  std::vector<int> lens(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_), 0);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 1; r < size_; ++r) displs[r] = displs[r - 1] + lens[r - 1];
  std::string all(static_cast<size_t>(displs.back() + lens.back()), '\0');
  MPI_Allgatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                 MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}

void Comm::broadcast(std::string& s, int root) {
  if (size_ == 1) return;
  uint64_t len = s.size();
  MPI_Bcast(&len, 1, MPI_UINT64_T, root, MPI_COMM_WORLD);
  s.resize(len);
  MPI_Bcast(s.data(), static_cast<int>(len), MPI_CHAR, root, MPI_COMM_WORLD);
}

void Comm::start_allreduce(float* x, size_t n) {
  if (size_ == 1) return;
  for (size_t a = 0; a < n; a += kMaxCount) {
    pending.emplace_back();
    MPI_Iallreduce(MPI_IN_PLACE, x + a, static_cast<int>(std::min(kMaxCount, n - a)), MPI_FLOAT,
                   MPI_SUM, MPI_COMM_WORLD, &pending.back());
  }
}

void Comm::start_reduce_scatter(float* x, size_t a, size_t e, const std::vector<size_t>& bounds) {
  if (size_ == 1) return;
  std::vector<int> counts;
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    const size_t lo = std::max(a, bounds[r]), hi = std::min(e, bounds[r + 1]);
    counts.push_back(static_cast<int>(hi > lo ? hi - lo : 0));
  }
  if (e - a > kMaxCount)
    throw std::length_error("a gradient range of " + std::to_string(e - a) +
                            " elements exceeds what one MPI call carries");
  pending.emplace_back();
  // In place: the input is the whole range, and this rank's sum lands at the range's start.
  MPI_Ireduce_scatter(MPI_IN_PLACE, x + a, counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                      &pending.back());
  const size_t mine = static_cast<size_t>(counts[static_cast<size_t>(rank_)]);
  const size_t to = std::max(a, bounds[static_cast<size_t>(rank_)]);
  if (mine > 0 && to != a) moves.push_back({x + a, x + to, mine});
}

void Comm::progress() {
  if (pending.empty()) return;
  int done = 0;
  MPI_Testall(static_cast<int>(pending.size()), pending.data(), &done, MPI_STATUSES_IGNORE);
  if (done) pending.clear();
}

double Comm::wait_all() {
  if (pending.empty() && moves.empty()) return 0;
  const double t0 = now_seconds();
  MPI_Waitall(static_cast<int>(pending.size()), pending.data(), MPI_STATUSES_IGNORE);
  pending.clear();
  for (const Move& m : moves) std::memmove(m.to, m.from, m.n * sizeof(float));
  moves.clear();
  return now_seconds() - t0;
}

namespace {

// Every rank's shard [bounds[r], bounds[r + 1]) of x, of elements of `type`, gathered into
// every rank's x in place.
void allgather_shards(void* x, const std::vector<size_t>& bounds, MPI_Datatype type) {
  std::vector<int> displs;
  std::vector<int> counts = counts_of(bounds, &displs);
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, counts.data(), displs.data(), type,
                 MPI_COMM_WORLD);
}

}  // namespace

void Comm::allgather(float* x, const std::vector<size_t>& bounds) {
  if (size_ > 1) allgather_shards(x, bounds, MPI_FLOAT);
}

void Comm::allgather(uint16_t* x, const std::vector<size_t>& bounds) {
  if (size_ > 1) allgather_shards(x, bounds, MPI_UINT16_T);
}

void Comm::gather(const float* mine, float* all, const std::vector<size_t>& bounds, int root) {
  std::vector<int> displs;
  std::vector<int> counts = counts_of(bounds, &displs);
  const int count = counts[static_cast<size_t>(rank_)];
  if (size_ == 1) {
    std::copy(mine, mine + count, all);
    return;
  }
  MPI_Gatherv(mine, count, MPI_FLOAT, all, counts.data(), displs.data(), MPI_FLOAT, root,
              MPI_COMM_WORLD);
}

void Comm::start_send(const void* data, size_t bytes, int peer, int tag) {
  if (bytes > kMaxCount) throw std::length_error("a message of " + std::to_string(bytes) + " bytes");
  sends.emplace_back();
  MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &sends.back());
}

double Comm::recv(void* data, size_t bytes, int peer, int tag) {
  if (bytes > kMaxCount) throw std::length_error("a message of " + std::to_string(bytes) + " bytes");
  const double t0 = now_seconds();
  MPI_Recv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return now_seconds() - t0;
}

void Comm::wait_sends() {
  if (sends.empty()) return;
  MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE);
  sends.clear();
}

#else  // built without MPI: one process, and a clear refusal under mpirun

Comm::Comm() {
  if (launched_by_mpi())
    throw InputError(
        "this packbert was built without MPI (libopenmpi-dev was not found when it was "
        "configured): run it without mpirun, or rebuild after scripts/setup.sh");
}
void Comm::finalize() {}
void Comm::abort(int code) {
  std::exit(code);
}
void Comm::allreduce_sum(double*, size_t) {}
void Comm::allreduce_max(double*, size_t) {}
std::vector<std::string> Comm::allgather(const std::string& s) {
  return {s};
}
void Comm::broadcast(std::string&, int) {}
void Comm::start_allreduce(float*, size_t) {}
void Comm::start_reduce_scatter(float*, size_t, size_t, const std::vector<size_t>&) {}
void Comm::allgather(uint16_t*, const std::vector<size_t>&) {}
void Comm::progress() {}
double Comm::wait_all() {
  return 0;
}
void Comm::allgather(float*, const std::vector<size_t>&) {}
void Comm::gather(const float* mine, float* all, const std::vector<size_t>& bounds, int) {
  std::copy(mine, mine + bounds[1], all);
}
void Comm::start_send(const void*, size_t, int, int) {
  throw std::logic_error("a point-to-point send in one process");
}
double Comm::recv(void*, size_t, int, int) {
  throw std::logic_error("a point-to-point receive in one process");
}
void Comm::wait_sends() {}

#endif

Comm& Comm::world() {
  static Comm comm;
  return comm;
}

}  // namespace packbert::dist
