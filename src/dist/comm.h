// The processes of one run. Started by mpirun (Open MPI, or any launcher that sets the PMI /
// PMIx environment) each process is one rank of MPI_COMM_WORLD; started plainly there is one
// rank and every collective is a no-op, without initialising MPI at all.
//
// Only the main thread calls MPI (MPI_THREAD_FUNNELED). Gradients are reduced with
// non-blocking all-reduces that the training step starts as backward finishes each layer and
// progresses between layers (progress()), not from a communication thread: Open MPI's blocking
// progress spins a core, and on a machine whose cores all run OpenMP compute a spinning thread
// takes the time it saves (docs/DESIGN.md §7). The all-reduces, reduce-scatters and shard
// gathers are rings of point-to-point messages of our own (comm.cpp), on a duplicate of the
// communicator: each rank moves and adds an equal share, where Open MPI's MPI_Iallreduce has one
// rank add everything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace packbert::dist {

class Comm {
 public:
  // The run's communicator, set up on first use (MPI_Init_thread when launched by mpirun).
  static Comm& world();
  // Ends MPI (if it was started); call once, from main, after the last collective.
  static void finalize();
  // Ends every process of the run with `code` (MPI_Abort): what a process does when it fails
  // alone, so the others do not wait on it for ever. In one process: std::exit(code).
  [[noreturn]] void abort(int code);
  // The ranks of this communicator with the same `color`, ranked by `key` (MPI_Comm_split;
  // collective: every rank calls it). Its collectives and messages are its own: a pipeline's
  // stages and a stage's replicas each reduce on theirs. In one process: a one-rank copy.
  std::unique_ptr<Comm> split(int color, int key);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool root() const { return rank_ == 0; }
  bool distributed() const { return size_ > 1; }

  // Blocking, in place: x[i] = sum over ranks (max for allreduce_max).
  void allreduce_sum(double* x, size_t n);
  void allreduce_max(double* x, size_t n);
  // Every rank's string, in rank order.
  std::vector<std::string> allgather(const std::string& s);
  // root's bytes to every rank.
  void broadcast(std::string& s, int root = 0);

  // Non-blocking in-place sum of a bucket of floats; started buckets complete, in the order
  // started, by wait_all(), which returns the seconds it waited. progress() moves the started
  // ones along without waiting (a bucket moves, and its received chunks are added, only inside
  // these calls), and the started sends below (a large message moves only while its sender is
  // inside MPI: a stage computing for a second would hold up its receiver). Every rank holds the
  // same bits afterwards; the sums' order is fixed by the ranks' count, not by timing.
  void start_allreduce(float* x, size_t n);
  // The same for the range [a, e) of a sharded arena x (bounds as below): after wait_all(), this
  // rank's part of the range holds the sum over ranks, in place (the rest is left undefined).
  void start_reduce_scatter(float* x, size_t a, size_t e, const std::vector<size_t>& bounds);
  void progress();
  double wait_all();

  // Gradient sharding (ZeRO-1). bounds: [size + 1] element offsets, rank r owning
  // [bounds[r], bounds[r + 1]) (start_reduce_scatter above sums each rank's part). allgather:
  // every rank's range of x is copied to every other rank. gather: every rank's `mine` (its
  // range's values) lands in its range of `all` on root (`all` is not used elsewhere).
  void allgather(float* x, const std::vector<size_t>& bounds);
  // The same for 16-bit elements (bf16 master weights, as their bits).
  void allgather(uint16_t* x, const std::vector<size_t>& bounds);
  void gather(const float* mine, float* all, const std::vector<size_t>& bounds, int root = 0);

  // Point to point, for a pipeline's activations and gradients: `bytes` bytes to / from rank
  // `peer` of this communicator, matched by `tag`. A send is started and returns at once (a stage
  // must not block on a neighbour that is sending to it too); the bytes must stay as they are until
  // wait_sends(); any length (longer ones go in pieces). recv blocks until the bytes are there
  // and returns the seconds it waited.
  void start_send(const void* data, size_t bytes, int peer, int tag);
  double recv(void* data, size_t bytes, int peer, int tag);
  void wait_sends();

 private:
  struct Private {};
  Comm();
  explicit Comm(Private);
  struct State;  // the MPI handle and what was started on it (comm.cpp)
  std::unique_ptr<State> st_;
  int rank_ = 0, size_ = 1;
  bool mpi_ = false;
};

// The ranks of a run as `stages` pipeline stages x `replicas()` data-parallel replicas of the
// pipeline: world rank = stage x replicas + replica, so world rank 0 (the writer) is the first
// stage's first replica. data() is this stage's replicas (the world itself when there is one
// stage), which reduce gradients and shard ZeRO-1 among themselves; pipe() is this replica's
// stages, ranked by stage, which pass activations and gradients and agree on the global norm.
class Grid {
 public:
  // Splits `world` (collective); InputError naming `pipeline_stages` unless it divides the ranks.
  Grid(Comm& world, int stages);
  int stages() const { return stages_; }
  int replicas() const { return replicas_; }
  int stage() const { return stage_; }
  int replica() const { return replica_; }
  bool pipelined() const { return stages_ > 1; }
  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ == stages_ - 1; }
  int world_rank(int stage, int replica) const { return stage * replicas_ + replica; }
  Comm& world() const { return world_; }
  Comm& data() const { return data_ ? *data_ : world_; }
  Comm& pipe() const { return *pipe_; }  // (pipelined only)

 private:
  Comm& world_;
  int stages_ = 1, replicas_ = 1, stage_ = 0, replica_ = 0;
  std::unique_ptr<Comm> data_, pipe_;
};

// Runs `work` on every rank; when it throws on any, every rank throws SharedError with the
// first failing rank's message ("rank 1: ..."), so the ranks fail together instead of waiting
// on one that has gone. In one process the exception passes through unchanged.
void fail_together(Comm& comm, const std::function<void()>& work);

// Contiguous shards of n elements, one per rank, each starting at a multiple of `align` elements.
std::vector<size_t> shard_bounds(size_t n, int ranks, size_t align = 16);

// True when this process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE,
// PMI_SIZE or PMIX_RANK).
bool launched_by_mpi();

}  // namespace packbert::dist
