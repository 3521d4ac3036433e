#include "dist/comm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
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

// A sum over the ranks of a range of floats, or a gather of one, as a ring of point-to-point
// messages (the schedule of Baidu's ring all-reduce, Horovod and NCCL): the range is cut into one
// block a rank; in each of size - 1 summing steps a rank sends one block to the next rank and
// adds the previous rank's copy of another into its own, so that afterwards rank r holds the sum
// of block r; in each of size - 1 gathering steps it passes on the summed block it got last. Every
// rank sends and adds 1/size of the range a step, where Open MPI's MPI_Iallreduce for two ranks
// sends the whole range to one, which adds all of it and sends it back (a 160 MB all-reduce took
// 0.18 s that way against 0.04 s as a ring, on 2 Zen 5 cores over shared memory). Blocks go in
// chunks of kChunk bytes, received kWindow at a time into a scratch buffer before they are added.
// The sums run in the order of the ring, the same on every run; and since the summed blocks are
// what every rank gathers, every rank ends with the same bits.
struct Ring {
  char* x = nullptr;           // the range
  std::vector<size_t> blocks;  // [size + 1] byte offsets from x: rank r's block
  bool sums = true;            // floats, summed (then gathered, when steps says so); else gathered
  int step = 0, steps = 0;     // summing steps first, then gathering ones
  bool posted = false;         // this step's messages are started
  size_t chunks = 0, added = 0;  // of the block this summing step receives
  std::vector<MPI_Request> sends, recvs;
};

// A communicator's handle and what it has started.
struct Comm::State {
  MPI_Comm comm = MPI_COMM_WORLD;
  MPI_Comm ring = MPI_COMM_NULL;   // a duplicate for the rings' messages, apart from start_send's
  std::deque<Ring> rings;          // started, run in order: only the first moves
  std::vector<float> scratch;      // kWindow chunks of the block being summed
  std::vector<MPI_Request> sends;  // the started point-to-point sends

  // Queues a ring and moves the queue on as far as it can without waiting.
  void start(Ring g, int rank, int size);
  // Moves the started rings on without waiting (to their end when `block`), and the sends.
  void progress(int rank, int size, bool block);
  // Every rank's part [bounds[r], bounds[r + 1]) of x, elements of `bytes` bytes, to every rank.
  void gather(void* x, const std::vector<size_t>& bounds, size_t bytes, int rank, int size);
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
  // Open MPI's ob1 keeps 3 fragments of a large message in flight, and over shared memory
  // without single-copy (containers without ptrace permission) or over TCP its sender moves the
  // next ones only inside MPI: a pipeline stage computing between progress calls then holds up
  // the stage that waits for its activations. 64 lets a progress call move the whole of a
  // micro-batch's activations (BERT-base, 4 layers, 2 stages, 8 micro-batches, no single-copy:
  // the measured bubble 0.29 -> 0.12 against the formula's 0.11; with single-copy 0.09). A
  // value the user gave (mpirun --mca, or the environment) stands.
  setenv("OMPI_MCA_pml_ob1_send_pipeline_depth", "64", 0);
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  mpi_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm_dup(MPI_COMM_WORLD, &st_->ring);
}

Comm::Comm(Private) {}

Comm::~Comm() {
  // (a split communicator is freed while MPI runs; the world's outlives it)
  if (!mpi_ || !st_) return;
  int done = 0;
  MPI_Finalized(&done);
  if (done) return;
  if (st_->ring != MPI_COMM_NULL) MPI_Comm_free(&st_->ring);
  if (st_->comm != MPI_COMM_WORLD) MPI_Comm_free(&st_->comm);
}

std::unique_ptr<Comm> Comm::split(int color, int key) {
  std::unique_ptr<Comm> c(new Comm(Private{}));
  c->st_ = std::make_unique<State>();
  if (!mpi_) return c;
  c->mpi_ = true;
  MPI_Comm_split(st_->comm, color, key, &c->st_->comm);
  MPI_Comm_rank(c->st_->comm, &c->rank_);
  MPI_Comm_size(c->st_->comm, &c->size_);
  MPI_Comm_dup(c->st_->comm, &c->st_->ring);
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

namespace {

constexpr size_t kChunk = 1 << 20;  // bytes a ring's message carries
constexpr size_t kWindow = 8;       // chunks a summing step has posted receives for

int ring_index(int r, int size) {
  return (r % size + size) % size;
}

// The blocks a ring's step `step` sends and receives on rank `rank` of `size`: while summing
// (step < size - 1) it sends block rank - step - 1 and adds block rank - step - 2 into its own
// copy, ending with block `rank` summed; then, gathering, it sends the block it holds whole last
// (first its own) and receives the one before. Indices mod size.
std::pair<int, int> ring_blocks(const Ring& g, int rank, int size) {
  if (g.sums && g.step < size - 1)
    return {ring_index(rank - g.step - 1, size), ring_index(rank - g.step - 2, size)};
  const int k = g.sums ? g.step - (size - 1) : g.step;
  return {ring_index(rank - k, size), ring_index(rank - k - 1, size)};
}

// Starts the receive of chunk c of block `t` (a summing step's, into the scratch's slot c mod
// kWindow).
void post_sum_chunk(Ring& g, size_t c, int t, int left, MPI_Comm comm, std::vector<float>& scratch,
                    MPI_Request* request) {
  const size_t a = g.blocks[static_cast<size_t>(t)] + c * kChunk;
  const size_t n = std::min(kChunk, g.blocks[static_cast<size_t>(t) + 1] - a);
  MPI_Irecv(scratch.data() + (c % kWindow) * (kChunk / sizeof(float)), static_cast<int>(n),
            MPI_BYTE, left, 0, comm, request);
}

// Starts step g.step's messages: every chunk of the block it sends (already whole or summed as
// far as this step needs), and the receives of the block it gets (all of them into place when
// gathering, the first kWindow into the scratch when summing).
void post_step(Ring& g, int rank, int size, MPI_Comm comm, std::vector<float>& scratch) {
  const auto [s, t] = ring_blocks(g, rank, size);
  const int right = ring_index(rank + 1, size), left = ring_index(rank - 1, size);
  g.sends.clear(), g.recvs.clear();
  const size_t sa = g.blocks[static_cast<size_t>(s)], se = g.blocks[static_cast<size_t>(s) + 1];
  for (size_t a = sa; a < se; a += kChunk) {
    g.sends.emplace_back();
    MPI_Isend(g.x + a, static_cast<int>(std::min(kChunk, se - a)), MPI_BYTE, right, 0, comm,
              &g.sends.back());
  }
  const size_t ta = g.blocks[static_cast<size_t>(t)], te = g.blocks[static_cast<size_t>(t) + 1];
  g.chunks = (te - ta + kChunk - 1) / kChunk, g.added = 0;
  if (g.sums && g.step < size - 1) {
    g.recvs.resize(std::min(kWindow, g.chunks));
    for (size_t c = 0; c < g.recvs.size(); ++c)
      post_sum_chunk(g, c, t, left, comm, scratch, &g.recvs[c]);
  } else {
    for (size_t a = ta; a < te; a += kChunk) {
      g.recvs.emplace_back();
      MPI_Irecv(g.x + a, static_cast<int>(std::min(kChunk, te - a)), MPI_BYTE, left, 0, comm,
                &g.recvs.back());
    }
  }
  g.posted = true;
}

// Waits on (block) or tests (!block) one request, or all of some; whether they completed.
bool done(MPI_Request* r, int n, bool block) {
  int flag = 1;
  if (block)
    MPI_Waitall(n, r, MPI_STATUSES_IGNORE);
  else
    MPI_Testall(n, r, &flag, MPI_STATUSES_IGNORE);
  return flag != 0;
}

// Moves ring g on as far as its messages allow (to the end when `block`); whether it ended.
bool advance(Ring& g, int rank, int size, MPI_Comm comm, std::vector<float>& scratch, bool block) {
  while (g.step < g.steps) {
    if (!g.posted) post_step(g, rank, size, comm, scratch);
    if (g.sums && g.step < size - 1) {
      // Each received chunk, in order, added into this rank's copy; its slot reposted.
      const int t = ring_blocks(g, rank, size).second;
      for (; g.added < g.chunks; ++g.added) {
        MPI_Request& r = g.recvs[g.added % kWindow];
        if (!done(&r, 1, block)) return false;
        const size_t a = g.blocks[static_cast<size_t>(t)] + g.added * kChunk;
        const size_t n = std::min(kChunk, g.blocks[static_cast<size_t>(t) + 1] - a) / sizeof(float);
        float* __restrict to = reinterpret_cast<float*>(g.x + a);
        const float* __restrict from =
            scratch.data() + (g.added % kWindow) * (kChunk / sizeof(float));
        for (size_t i = 0; i < n; ++i) to[i] += from[i];
        if (g.added + kWindow < g.chunks)
          post_sum_chunk(g, g.added + kWindow, t, ring_index(rank - 1, size), comm, scratch, &r);
      }
    } else if (!done(g.recvs.data(), static_cast<int>(g.recvs.size()), block)) {
      return false;
    }
    if (!done(g.sends.data(), static_cast<int>(g.sends.size()), block)) return false;
    g.posted = false, ++g.step;
  }
  return true;
}

// A ring over elements [first, last) of x, each `bytes` bytes, cut into rank r's block where
// the element bounds ([ranks + 1]) cut it, summing and gathering as asked.
Ring ring_over(void* x, size_t first, size_t last, const std::vector<size_t>& bounds, size_t bytes,
               bool sums, bool gathers) {
  Ring g;
  g.x = static_cast<char*>(x), g.sums = sums;
  g.blocks.push_back(first * bytes);
  for (size_t r = 1; r + 1 < bounds.size(); ++r)
    g.blocks.push_back(std::clamp(bounds[r], first, last) * bytes);
  g.blocks.push_back(last * bytes);
  const int size = static_cast<int>(bounds.size()) - 1;
  g.steps = (sums ? size - 1 : 0) + (gathers ? size - 1 : 0);
  return g;
}

}  // namespace

void Comm::State::start(Ring g, int rank, int size) {
  if (g.steps == 0 || g.blocks.front() == g.blocks.back()) return;
  if (scratch.empty() && g.sums) scratch.resize(kWindow * kChunk / sizeof(float));
  rings.push_back(std::move(g));
  progress(rank, size, false);
}

void Comm::State::progress(int rank, int size, bool block) {
  while (!rings.empty() && advance(rings.front(), rank, size, ring, scratch, block))
    rings.pop_front();
  if (!sends.empty() && done(sends.data(), static_cast<int>(sends.size()), false)) sends.clear();
}

void Comm::State::gather(void* x, const std::vector<size_t>& bounds, size_t bytes, int rank,
                         int size) {
  start(ring_over(x, 0, bounds.back(), bounds, bytes, false, true), rank, size);
  progress(rank, size, true);
}

void Comm::start_allreduce(float* x, size_t n) {
  if (size_ == 1) return;
  st_->start(ring_over(x, 0, n, shard_bounds(n, size_), sizeof(float), true, true), rank_, size_);
}

void Comm::start_reduce_scatter(float* x, size_t a, size_t e, const std::vector<size_t>& bounds) {
  if (size_ == 1) return;
  st_->start(ring_over(x, a, e, bounds, sizeof(float), true, false), rank_, size_);
}

void Comm::progress() {
  st_->progress(rank_, size_, false);
}

double Comm::wait_all() {
  if (st_->rings.empty()) return 0;
  const double t0 = now_seconds();
  st_->progress(rank_, size_, true);
  return now_seconds() - t0;
}

void Comm::allgather(float* x, const std::vector<size_t>& bounds) {
  if (size_ > 1) st_->gather(x, bounds, sizeof(float), rank_, size_);
}

void Comm::allgather(uint16_t* x, const std::vector<size_t>& bounds) {
  if (size_ > 1) st_->gather(x, bounds, sizeof(uint16_t), rank_, size_);
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
