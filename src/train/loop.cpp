#include "train/loop.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <numeric>
#include <sstream>

#include "error.h"
#include "io/fault.h"
#include "io/memory.h"
#include "stopwatch.h"

namespace packbert::train {

std::vector<int> Stepper::pieces_of_rank(const std::vector<double>& work, int ranks, int rank) {
  std::vector<int> order(work.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return work[a] > work[b]; });
  std::vector<double> load(static_cast<size_t>(ranks), 0);
  std::vector<int> mine;
  for (int r : order) {
    const int to = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[static_cast<size_t>(to)] += work[r];
    if (to == rank) mine.push_back(r);
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

namespace {

// Forward FLOPs of one sequence of `length` tokens, `masked` of them masked: the encoder's linear
// layers per token, attention's two products per token pair, the MLM head per masked token
// (backward's are proportional).
double sequence_work(const model::BertConfig& c, int64_t length, int64_t masked) {
  const double C = c.hidden_size, I = c.intermediate_size, L = c.num_hidden_layers;
  const double n = static_cast<double>(length);
  return 2 * L * (4 * C * C + 2 * C * I) * n + 4 * L * C * n * n +
         2 * (C * C + C * c.vocab_size) * static_cast<double>(masked);
}

}  // namespace

Stepper::Stepper(model::BertModel& m, const LoopOptions& o, const OptimizerConfig& oc,
                 int accumulation, model::Recompute recompute, dist::Comm& comm)
    : Stepper(m, o, oc, accumulation, recompute, std::make_unique<dist::Grid>(comm, 1), nullptr) {}

Stepper::Stepper(model::BertModel& m, const LoopOptions& o, const OptimizerConfig& oc,
                 int accumulation, model::Recompute recompute, const dist::Grid& grid)
    : Stepper(m, o, oc, accumulation, recompute, nullptr, &grid) {}

Stepper::Stepper(model::BertModel& m, const LoopOptions& o, const OptimizerConfig& oc,
                 int accumulation, model::Recompute recompute, std::unique_ptr<dist::Grid> own,
                 const dist::Grid* grid)
    : m_(m),
      o_(o),
      accumulation_(accumulation),
      recompute_(recompute),
      own_grid_(std::move(own)),
      grid_(grid ? *grid : *own_grid_),
      comm_(grid_.data()),
      sync_(comm_, o.zero, m.layout().total()) {
  m.set_backend(o.backend);
  if (grid_.pipelined()) {
    links_ = std::make_unique<StageLinks>(grid_.pipe(), m.config().hidden_size,
                                          model::storage_dtype(o.precision));
    // The first and last stage both hold the word table where the MLM decoder is tied to it. The
    // first sums its whole gradient (its replicas' too) and hands it to the last.
    if ((grid_.first_stage() || grid_.last_stage()) && m.layout().heads().pretraining)
      tied_ = m.layout().word_table();
    if (tied_ && grid_.first_stage()) sync_.keep_whole(tied_->offset, tied_->offset + tied_->numel);
    if (tied_ && grid_.last_stage()) {
      sync_.skip(tied_->offset, tied_->offset + tied_->numel);
      m.hand_decoder_to_first_stage();
    }
  }
  const auto [begin, end] = sync_.shard();
  OptimizerConfig c = oc;
  c.masters = o.optimizer.masters, c.seed = o.seed, c.backend = o.backend;
  if (model::is_16bit(c.masters)) m.keep_masters16(c.masters);
  scaler_ = LossScaler(o.loss_scaling);
  io::AllocationScope scope("the optimizer's moments");
  opt_ = std::make_unique<Optimizer>(m.layout(), c, begin, end);
}

Stepper::~Stepper() = default;

// What a step's micro-batches add up, by name; summed over ranks as one array of doubles
// (values(): the fields in declaration order, then each rank's real tokens in its own slot).
struct StepSums {
  double mlm_loss = 0, nsp_loss = 0, cls_loss = 0, span_loss = 0;
  double mlm_count = 0, mlm_correct = 0, nsp_count = 0, nsp_correct = 0, cls_count = 0,
         cls_correct = 0;
  double real_tokens = 0, sequences = 0;  // computed padding excluded
  std::vector<double> rank_tokens;        // [ranks]: the real tokens each rank computed
  std::vector<double> stage_waits;        // [stages]: each stage's wait on its neighbours

  StepSums(int ranks, int stages)
      : rank_tokens(static_cast<size_t>(ranks), 0.0),
        stage_waits(stages > 1 ? static_cast<size_t>(stages) : 0, 0.0) {}

  void add(const model::Outputs& out) {
    mlm_loss += out.mlm_loss, nsp_loss += out.nsp_loss, cls_loss += out.cls_loss,
        span_loss += out.span_loss;
    mlm_count += static_cast<double>(out.mlm_count);
    mlm_correct += static_cast<double>(out.mlm_correct);
    nsp_count += static_cast<double>(out.nsp_count);
    nsp_correct += static_cast<double>(out.nsp_correct);
    cls_count += static_cast<double>(out.cls_count);
    cls_correct += static_cast<double>(out.cls_correct);
  }
  // The real sequences of the batch the model last ran (padding computed as a sequence of its
  // own has sequence id 0), their tokens counted for `rank`.
  void add_tokens(const model::TokenLayout& tl, const model::PackedBatch& b, int rank) {
    for (int q = 0; q < tl.sequences(); ++q)
      if (b.sequence_ids[tl.slot[tl.cu_seqlens[q]]] > 0) {
        const double len = tl.cu_seqlens[q + 1] - tl.cu_seqlens[q];
        real_tokens += len, rank_tokens[static_cast<size_t>(rank)] += len;
        sequences += 1;
      }
  }
  // The named fields' addresses in order: what is summed across ranks, with rank_tokens.
  std::array<double*, 12> fields() {
    return {&mlm_loss,  &nsp_loss,    &cls_loss,  &span_loss,   &mlm_count,   &mlm_correct,
            &nsp_count, &nsp_correct, &cls_count, &cls_correct, &real_tokens, &sequences};
  }
  void allreduce(dist::Comm& comm) {
    std::vector<double> v;
    for (double* f : fields()) v.push_back(*f);
    v.insert(v.end(), rank_tokens.begin(), rank_tokens.end());
    v.insert(v.end(), stage_waits.begin(), stage_waits.end());
    comm.allreduce_sum(v.data(), v.size());
    size_t i = 0;
    for (double* f : fields()) *f = v[i++];
    for (double& x : rank_tokens) x = v[i++];
    for (double& x : stage_waits) x = v[i++];
  }
  // The step's result: losses as means over `micros` micro-batches, counts, the imbalance.
  void fill(StepResult& r, int micros) const {
    const double acc = micros;
    r.mlm_loss = mlm_loss / acc, r.nsp_loss = nsp_loss / acc, r.cls_loss = cls_loss / acc,
    r.span_loss = span_loss / acc;
    auto count = [](double x) { return static_cast<int64_t>(std::llround(x)); };
    r.mlm_count = count(mlm_count), r.mlm_correct = count(mlm_correct);
    r.nsp_count = count(nsp_count), r.nsp_correct = count(nsp_correct);
    r.cls_count = count(cls_count), r.cls_correct = count(cls_correct);
    r.real_tokens = count(real_tokens), r.sequences = count(sequences);
    const double ranks = static_cast<double>(rank_tokens.size());
    if (ranks > 1 && r.real_tokens > 0)
      r.imbalance = *std::max_element(rank_tokens.begin(), rank_tokens.end()) /
                    (static_cast<double>(r.real_tokens) / ranks);
    r.stage_wait_seconds = stage_waits;
  }
};

namespace {

// The word-table rows a batch's tokens use, sorted and unique.
std::vector<int32_t> word_rows_of(const model::PackedBatch& b) {
  std::vector<int32_t> rows(b.input_ids.begin(), b.input_ids.end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// What a micro-batch's activations are allocated for (named in an out-of-memory error).
std::string activations_of(const model::PackedBatch& b) {
  return "the activations of a micro-batch of " + std::to_string(b.B) + " rows of " +
         std::to_string(b.S) + " tokens";
}

}  // namespace

model::StepOptions Stepper::training_options(int64_t index, int micro, double scale) const {
  const uint64_t dropout_step =
      static_cast<uint64_t>(index) * static_cast<uint64_t>(accumulation_) +
      static_cast<uint64_t>(micro);
  return {true, o_.seed, dropout_step, recompute_, o_.precision, scale};
}

model::PackedBatch Stepper::share_of(const model::PackedBatch& whole) const {
  const int N = comm_.size();
  const model::BatchShare share = model::share_of_whole(whole);
  const std::vector<model::SequenceSpan> spans = model::sequences_of(whole);
  std::vector<double> work;
  for (const model::SequenceSpan& q : spans)
    work.push_back(sequence_work(m_.config(), q.length, q.masked));
  return model::take_sequences(whole, share, spans, pieces_of_rank(work, N, comm_.rank()));
}

void Stepper::run_micro_batches(int64_t index, int micros, StepSums& sums,
                                const std::function<model::PackedBatch()>& next, double scale) {
  const int N = comm_.size(), rank = comm_.rank();
  const std::span<float> g = m_.grads();
  for (int micro = 0; micro < micros; ++micro) {
    const bool last = micro + 1 == micros;
    model::PackedBatch whole = next();
    model::PackedBatch mine;
    if (N > 1) mine = share_of(whole);
    const model::PackedBatch& b = N > 1 ? mine : whole;
    // The last micro-batch's gradients are final layer by layer: the sync may reduce each as
    // backward finishes it.
    const std::function<void(size_t, size_t)> ready =
        last ? sync_.on_ready(g.data()) : std::function<void(size_t, size_t)>();
    // Reduced as backward finishes it, the word table goes early (the decoder's share) and the
    // embeddings' share of its rows the whole batch uses last, on its own (a few thousand rows
    // instead of the table); MPI moves the reductions on between backward's ops.
    const bool overlap = last && sync_.overlaps();
    if (overlap) m_.defer_word_rows(word_rows_of(whole));
    const std::function<void()> progress =
        overlap ? std::function<void()>([this] { sync_.progress(); }) : std::function<void()>();
    auto reduce_word_rows = [&] {
      if (!overlap) return;
      const kernels::View rows = m_.word_rows_grads();
      sync_.start(rows.as<float>(), static_cast<size_t>(rows.numel()));
    };
    if (b.B == 0) {  // more ranks than sequences: nothing to compute, still in every reduction
      if (ready)
        for (auto [a, e] : m_.grad_ranges()) ready(a, e);
      reduce_word_rows();
      continue;
    }
    io::AllocationScope scope(activations_of(b));
    sums.add(m_.forward(b, training_options(index, micro, scale)));
    io::crash_point("forward");
    m_.backward(ready, progress);
    reduce_word_rows();
    sums.add_tokens(m_.tokens(), b, rank);
  }
}

// A stage's micro-batches on the 1F1B schedule: forwards take the stage below's output and hand
// theirs up, backwards take the gradient from above and hand their input's down; the last
// micro-batch's backward starts the replicas' sums range by range, as run_micro_batches does.
// Every stage of a replica computes the same share of each micro-batch, so a replica with no
// sequence of one skips it on every stage alike (and still joins the sums).
void Stepper::run_stage(int64_t index, int micros, StepSums& sums,
                        const std::function<model::PackedBatch()>& next, double scale) {
  const int in_flight = forwards_in_flight(grid_.stages(), grid_.stage(), micros);
  const bool first = grid_.first_stage(), last = grid_.last_stage();
  const std::span<float> g = m_.grads();
  shares_.resize(static_cast<size_t>(micros));
  for (const PipelineAction& a : one_f_one_b(grid_.stages(), grid_.stage(), micros)) {
    const int pass = a.micro % in_flight;
    m_.use_pass(pass);
    model::PackedBatch& b = shares_[static_cast<size_t>(a.micro)];
    if (!a.backward) {
      const model::PackedBatch whole = next();  // (forwards run in micro-batch order)
      b = comm_.size() > 1 ? share_of(whole) : whole;
      if (b.B == 0) continue;
      // (the tokens the stage below sends: the layout's, which forward derives again)
      if (!first) model::token_layout(b, m_.config(), received_);
      const kernels::View input =
          first ? kernels::View() : links_->receive_input(a.micro, pass, received_.tokens());
      io::AllocationScope scope(activations_of(b));
      // MPI moves this stage's sends on between the forward's ops (a large message over a
      // transport without single-copy moves only while its sender is inside MPI).
      const model::Outputs out = m_.forward(b, training_options(index, a.micro, scale), input,
                                            [this] { grid_.pipe().progress(); });
      io::crash_point("forward");
      if (last) {
        // The first stage forms the tied word table's decoder share from this (run_stage's
        // backward below).
        if (tied_) links_->send_decoder_input(a.micro, m_.decoder_input());
        sums.add(out);
        sums.add_tokens(m_.tokens(), b, grid_.replica());
      } else {
        links_->send_output(a.micro, m_.stage_output());
      }
      continue;
    }
    const bool final = a.micro + 1 == micros;
    const std::function<void(size_t, size_t)> ready =
        final ? sync_.on_ready(g.data()) : std::function<void(size_t, size_t)>();
    if (b.B == 0) {
      if (ready)
        for (auto [x, e] : m_.grad_ranges()) ready(x, e);
      continue;
    }
    const kernels::View output_grad =
        last ? kernels::View() : links_->receive_output_grad(a.micro, m_.tokens().tokens());
    // MPI moves this stage's sends on between backward's ops (as between forward's), and on the
    // last micro-batch the replicas' sums.
    const bool sums = final && sync_.overlaps();
    const std::function<void()> progress = [this, sums] {
      grid_.pipe().progress();
      if (sums) sync_.progress();
    };
    // The word table's decoder share before the embeddings', as one process adds them.
    if (tied_ && first)
      m_.add_decoder_grad(
          links_->receive_decoder_input(a.micro, static_cast<int64_t>(m_.tokens().mlm_token.size()),
                                        m_.config().vocab_size),
          progress);
    m_.backward(ready, progress, output_grad);
    if (!first) links_->send_input_grad(a.micro, m_.input_grad());
  }
  links_->finish();
}

// Whether step r is skipped (no update): a non-finite loss or gradient, or an outlier norm.
// Throws when nan_abort non-finite steps came in a row.
bool Stepper::skips(StepResult& r, int64_t index, const std::string& kept) {
  const double loss = r.loss();
  if (!std::isfinite(loss) || !std::isfinite(r.grad_norm)) {
    r.skipped = true;
    // Under dynamic loss scaling a non-finite gradient from a finite loss is an overflow: the
    // scale halves. It counts towards nan_abort only once the scale is at most 1, when scaling
    // can no longer be what overflowed.
    const bool overflow = std::isfinite(loss) && o_.loss_scaling.mode == LossScaling::Mode::dynamic;
    r.skip_reason = !std::isfinite(loss) ? "non-finite loss"
                    : overflow           ? "loss-scale overflow"
                                         : "non-finite gradient";
    if (overflow) scaler_.update(o_.loss_scaling, false);
    if ((!overflow || r.loss_scale <= 1) && ++nan_streak_ >= o_.nan_abort)
      throw InputError(r.skip_reason + " for " + std::to_string(nan_streak_) +
                       " steps in a row (last at step " + std::to_string(index + 1) + "); " + kept +
                       "; lower the learning rate?");
    return true;
  }
  scaler_.update(o_.loss_scaling, true);
  if (o_.outlier_z > 0 && guard_.is_outlier(r.grad_norm, o_.outlier_z)) {
    r.skipped = true;
    r.skip_reason = "outlier gradient norm";
    ++outlier_skips_;
    return true;
  }
  nan_streak_ = 0;
  return false;
}

// The update with the step's learning rate and gradient factor; whether every weight stayed
// finite. Under ZeRO-1 this rank's shard moves (LAMB's per-tensor norms summed over the shards
// first) and the weights are gathered: fp32, or the 16-bit masters (their stochastic rounding
// bits follow the arena index, so sharding does not change them). The weights' 16-bit copy is
// rebuilt by the next forward from the gathered weights.
bool Stepper::update(StepResult& r, float grad_scale) {
  if (!sync_.sharded()) {
    const bool ok = apply_update(*opt_, m_, r.lr, o_.precision, grad_scale);
    if (!grid_.pipelined()) return ok;  // (every replica moved the same weights alike)
    double bad = ok ? 0.0 : 1.0;        // every stage learns whether any went non-finite
    grid_.world().allreduce_sum(&bad, 1);
    return bad == 0;
  }
  const Optimizer::Reduce reduce = sync_.shard_sum();
  const kernels::View w = m_.masters();
  double bad = opt_->step(w, m_.grads().data(), r.lr, {}, reduce, grad_scale) ? 0.0 : 1.0;
  const double t1 = now_seconds();
  grid_.world().allreduce_sum(&bad, 1);
  if (kernels::traits(w.dtype).bytes == sizeof(uint16_t))
    sync_.gather(w.as<uint16_t>());
  else
    sync_.gather(w.as<float>());
  m_.masters_written();
  r.comm_seconds += now_seconds() - t1;
  return bad == 0;
}

StepResult Stepper::step(int64_t index, int64_t total,
                         const std::function<model::PackedBatch()>& next, const std::string& kept,
                         int micro_batches) {
  const int micros = micro_batches > 0 ? micro_batches : accumulation_;
  StepResult r;
  r.loss_scale = scaler_.scale;
  m_.zero_grads();
  StepSums sums(grid_.replicas(), grid_.stages());
  if (grid_.pipelined()) {
    links_->reset_waited();
    run_stage(index, micros, sums, next, r.loss_scale);
  } else {
    run_micro_batches(index, micros, sums, next, r.loss_scale);
  }
  // The gradients summed over ranks (each share divided by the whole batch's counts), the step's
  // numbers summed too (a pipeline's last stage alone has them).
  const std::span<float> g = m_.grads();
  const double t0 = now_seconds();
  sync_.finish(g.data());
  m_.add_word_rows();  // (deferred word-table rows, now summed over processes)
  if (tied_) links_->share_tied(g.data() + tied_->offset, tied_->numel);
  if (grid_.pipelined() && grid_.replica() == 0)
    sums.stage_waits[static_cast<size_t>(grid_.stage())] = links_->waited();
  if (grid_.world().distributed()) sums.allreduce(grid_.world());
  // The gradient is the micro-batches' mean, unscaled (loss scaling) and clipped to the global
  // norm: one factor that the optimizer applies as it reads each gradient (no pass scales them
  // first). Under ZeRO-1 or pipeline stages the norm is summed from each rank's part, so every
  // rank sees the same overflow.
  const double unscale = 1.0 / micros / r.loss_scale;
  r.grad_norm = unscale * global_norm(g.data());
  const float grad_scale = static_cast<float>(unscale) * clip_factor(r.grad_norm, o_.clip_norm);
  r.comm_seconds = now_seconds() - t0;
  sums.fill(r, micros);
  r.lr = learning_rate(o_.lr, index, o_.warmup_steps, total, o_.decay_power);
  if (skips(r, index, kept)) return r;
  if (!update(r, grad_scale))
    throw InputError("the update of step " + std::to_string(index + 1) +
                     " made parameters non-finite (learning rate " + std::to_string(r.lr) +
                     " too high? weight decay?); " + kept);
  guard_.accept(r.grad_norm);
  return r;
}

double Stepper::global_norm(const float* g) {
  const size_t begin = opt_->begin(), end = opt_->end();  // what this rank updates
  if (!grid_.pipelined()) return grad_norm(g + begin, end - begin, sync_.shard_sum(), o_.backend);
  const kernels::Backend& be = kernels::backend(o_.backend);
  auto squares = [&](size_t a, size_t e) {
    return a < e ? be.sum_squares(kernels::View::vector(g + a, static_cast<int64_t>(e - a))) : 0.0;
  };
  double s = 0;
  if (tied_ && grid_.last_stage()) {  // (the first stage counts the word table)
    const size_t wa = std::clamp(tied_->offset, begin, end),
                 we = std::clamp(tied_->offset + tied_->numel, wa, end);
    s = squares(begin, wa) + squares(we, end);
  } else {
    s = squares(begin, end);
  }
  if (const Optimizer::Reduce sum = sync_.shard_sum()) sum(&s, 1);
  grid_.pipe().allreduce_sum(&s, 1);
  return std::sqrt(s);
}

std::pair<const float*, const float*> Stepper::whole_moments(std::vector<float>& m_all,
                                                             std::vector<float>& v_all) {
  if (!sync_.sharded()) return {opt_->m_fp32(m_all), opt_->v_fp32(v_all)};
  const size_t total = comm_.root() ? m_.layout().total() : 0;
  m_all.assign(total, 0.0f), v_all.assign(total, 0.0f);
  std::vector<float> widened;  // this shard's moments in fp32, under 16-bit masters
  comm_.gather(opt_->m_fp32(widened), m_all.data(), sync_.bounds());
  comm_.gather(opt_->v_fp32(widened), v_all.data(), sync_.bounds());
  if (!comm_.root()) return {nullptr, nullptr};
  return {m_all.data(), v_all.data()};
}

}  // namespace packbert::train
