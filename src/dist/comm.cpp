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

Grid::Grid(Comm& world, int stages) : world_(world), stages_(stages) {
  if (stages < 1 || world.size() % stages != 0)
    throw InputError("`pipeline_stages` " + std::to_string(stages) + " does not divide the " +
                     std::to_string(world.size()) +
                     " processes into stages of equal replicas (start stages x replicas "
                     "processes with mpirun)");
  replicas_ = world.size() / stages;
  stage_ = world.rank() / replicas_, replica_ = world.rank() % replicas_;
  if (stages == 1) return;
  data_ = world.split(stage_, replica_);
  pipe_ = world.split(replica_, stage_);
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

// A communicator's handle and what it has started.
struct Comm::State {
  MPI_Comm comm = MPI_COMM_WORLD;
  std::vector<MPI_Request> pending;  // the started all-reduces, in order
  // A started reduce-scatter leaves this rank's sum at its range's start: n floats to move from
  // `from` to `to` (within the range) once it completes.
  struct Move {
    float *from, *to;
    size_t n;
  };
  std::vector<Move> moves;
  std::vector<MPI_Request> sends;  // the started point-to-point sends
};

namespace {

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

Comm::Comm() : st_(std::make_unique<State>()) {
  if (!launched_by_mpi()) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  mpi_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

Comm::Comm(Private) {}

Comm::~Comm() {
  // (a split communicator is freed while MPI runs; the world's outlives it)
  if (mpi_ && st_ && st_->comm != MPI_COMM_WORLD) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Comm_free(&st_->comm);
  }
}

std::unique_ptr<Comm> Comm::split(int color, int key) {
  std::unique_ptr<Comm> c(new Comm(Private{}));
  c->st_ = std::make_unique<State>();
  if (!mpi_) return c;
  c->mpi_ = true;
  MPI_Comm_split(st_->comm, color, key, &c->st_->comm);
  MPI_Comm_rank(c->st_->comm, &c->rank_);
  MPI_Comm_size(c->st_->comm, &c->size_);
  return c;
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
    MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, st_->comm);
}

void Comm::allreduce_max(double* x, size_t n) {
  if (size_ > 1)
    MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_DOUBLE, MPI_MAX, st_->comm);
}

std::vector<std::string> Comm::allgather(const std::string& s) {
  if (size_ == 1) return {s};
  int len = static_cast<int>(s.size());
  std::vector<int> lens(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_), 0);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, st_->comm);
  for (int r = 1; r < size_; ++r) displs[r] = displs[r - 1] + lens[r - 1];
  std::string all(static_cast<size_t>(displs.back() + lens.back()), '\0');
  MPI_Allgatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                 st_->comm);
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}

void Comm::broadcast(std::string& s, int root) {
  if (size_ == 1) return;
  uint64_t len = s.size();
  MPI_Bcast(&len, 1, MPI_UINT64_T, root, st_->comm);
  s.resize(len);
  MPI_Bcast(s.data(), static_cast<int>(len), MPI_CHAR, root, st_->comm);
}

void Comm::start_allreduce(float* x, size_t n) {
  if (size_ == 1) return;
  for (size_t a = 0; a < n; a += kMaxCount) {
    st_->pending.emplace_back();
    MPI_Iallreduce(MPI_IN_PLACE, x + a, static_cast<int>(std::min(kMaxCount, n - a)), MPI_FLOAT,
                   MPI_SUM, st_->comm, &st_->pending.back());
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
  st_->pending.emplace_back();
  // In place: the input is the whole range, and this rank's sum lands at the range's start.
  MPI_Ireduce_scatter(MPI_IN_PLACE, x + a, counts.data(), MPI_FLOAT, MPI_SUM, st_->comm,
                      &st_->pending.back());
  const size_t mine = static_cast<size_t>(counts[static_cast<size_t>(rank_)]);
  const size_t to = std::max(a, bounds[static_cast<size_t>(rank_)]);
  if (mine > 0 && to != a) st_->moves.push_back({x + a, x + to, mine});
}

void Comm::progress() {
  for (std::vector<MPI_Request>* requests : {&st_->pending, &st_->sends}) {
    if (requests->empty()) continue;
    int done = 0;
    MPI_Testall(static_cast<int>(requests->size()), requests->data(), &done, MPI_STATUSES_IGNORE);
    if (done) requests->clear();
  }
}

double Comm::wait_all() {
  if (st_->pending.empty() && st_->moves.empty()) return 0;
  const double t0 = now_seconds();
  MPI_Waitall(static_cast<int>(st_->pending.size()), st_->pending.data(), MPI_STATUSES_IGNORE);
  st_->pending.clear();
  for (const State::Move& m : st_->moves) std::memmove(m.to, m.from, m.n * sizeof(float));
  st_->moves.clear();
  return now_seconds() - t0;
}

namespace {

// Every rank's shard [bounds[r], bounds[r + 1]) of x, of elements of `type`, gathered into
// every rank's x in place.
void allgather_shards(void* x, const std::vector<size_t>& bounds, MPI_Datatype type,
                      MPI_Comm comm) {
  std::vector<int> displs;
  std::vector<int> counts = counts_of(bounds, &displs);
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, counts.data(), displs.data(), type, comm);
}

}  // namespace

void Comm::allgather(float* x, const std::vector<size_t>& bounds) {
  if (size_ > 1) allgather_shards(x, bounds, MPI_FLOAT, st_->comm);
}

void Comm::allgather(uint16_t* x, const std::vector<size_t>& bounds) {
  if (size_ > 1) allgather_shards(x, bounds, MPI_UINT16_T, st_->comm);
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
              st_->comm);
}

// Messages longer than an int counts go as pieces of kMaxCount bytes, in order (MPI keeps the
// order of messages between two ranks with one tag), at least one piece even when empty.
void Comm::start_send(const void* data, size_t bytes, int peer, int tag) {
  const auto* p = static_cast<const char*>(data);
  size_t a = 0;
  do {
    const size_t n = std::min(kMaxCount, bytes - a);
    st_->sends.emplace_back();
    MPI_Isend(p + a, static_cast<int>(n), MPI_BYTE, peer, tag, st_->comm, &st_->sends.back());
    a += n;
  } while (a < bytes);
}

double Comm::recv(void* data, size_t bytes, int peer, int tag) {
  const double t0 = now_seconds();
  auto* p = static_cast<char*>(data);
  size_t a = 0;
  do {
    const size_t n = std::min(kMaxCount, bytes - a);
    MPI_Recv(p + a, static_cast<int>(n), MPI_BYTE, peer, tag, st_->comm, MPI_STATUS_IGNORE);
    a += n;
  } while (a < bytes);
  return now_seconds() - t0;
}

void Comm::wait_sends() {
  if (st_->sends.empty()) return;
  MPI_Waitall(static_cast<int>(st_->sends.size()), st_->sends.data(), MPI_STATUSES_IGNORE);
  st_->sends.clear();
}

#else  // built without MPI: one process, and a clear refusal under mpirun

struct Comm::State {};

Comm::Comm(Private) {}
Comm::~Comm() = default;

std::unique_ptr<Comm> Comm::split(int, int) {
  return std::unique_ptr<Comm>(new Comm(Private{}));
}

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
