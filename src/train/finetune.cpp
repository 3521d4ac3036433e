#include "train/finetune.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/casing.h"
#include "data/utf8.h"
#include "dist/comm.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "io/fault.h"
#include "io/input_file.h"
#include "io/paths.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "pack/assign.h"
#include "pack/plan.h"
#include "rng.h"
#include "stopwatch.h"
#include "text.h"
#include "train/memory_plan.h"
#include "train/optimizer.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace packbert::train {

namespace {

// The model to fine-tune from --init (any form load_model reads), its head (and any other
// tensor outside the encoder that --init lacks) initialised from the seed and named in
// `initialized`.
std::unique_ptr<model::BertModel> model_from(const std::string& init, model::Heads heads,
                                             int num_labels, uint64_t seed,
                                             std::vector<std::string>& initialized,
                                             bool new_heads = false) {
  FreshTensors fresh{seed, num_labels, {}, new_heads};
  auto m = load_model(init, heads, {}, &fresh);
  initialized = std::move(fresh.initialized);
  return m;
}

// Packs (or, unpacked, one per row) of sequence indices.
std::vector<std::vector<int64_t>> make_rows(const std::vector<int>& lengths, int max_len,
                                            bool packed, uint64_t seed) {
  std::vector<std::vector<int64_t>> rows;
  if (!packed) {
    for (size_t i = 0; i < lengths.size(); ++i) rows.push_back({static_cast<int64_t>(i)});
    return rows;
  }
  pack::PackOptions po;
  po.max_len = max_len;
  pack::PackPlan plan =
      pack::run_packer(pack::Algo::lpfhp, pack::histogram_of(lengths, max_len), po);
  pack::PackAssignment a = pack::assign_sequences(plan, lengths, seed);
  for (int64_t p = 0; p < a.packs(); ++p)
    rows.emplace_back(a.ids.begin() + a.offsets[p], a.ids.begin() + a.offsets[p + 1]);
  return rows;
}

template <typename Seq>
std::vector<int> lengths_of(const std::vector<Seq>& seqs) {
  std::vector<int> out;
  for (const Seq& e : seqs) out.push_back(static_cast<int>(e.tokens.size()));
  return out;
}

// Where segment B (token type 1) starts, and the labels each kind of sequence carries.
int32_t segment_b(const data::ClassifyExample& e) {
  return e.b_start;
}
int32_t segment_b(const data::SquadFeature& f) {
  return f.doc_offset;
}
void add_labels(model::PackedBatch& b, const data::ClassifyExample& e) {
  if (e.target)
    b.class_targets.push_back(*e.target);
  else
    b.class_labels.push_back(e.label);
}
void add_labels(model::PackedBatch& b, const data::SquadFeature& f) {
  b.span_starts.push_back(f.start);
  b.span_ends.push_back(f.end);
}

template <typename Seq>
model::PackedBatch make_batch(const std::vector<Seq>& seqs,
                              const std::vector<std::vector<int64_t>>& rows, int S) {
  int K = 1;
  for (const auto& r : rows) K = std::max(K, static_cast<int>(r.size()));
  model::BatchBuilder b(static_cast<int>(rows.size()), S, K);
  for (int p = 0; p < b.batch().B; ++p)
    for (const int64_t s : rows[p]) {
      const Seq& e = seqs[static_cast<size_t>(s)];
      b.add(p, e.tokens, segment_b(e));
      add_labels(b.batch(), e);
    }
  return b.take();
}

// What a fine-tuning run's resume file records beside the weights and moments: what must match
// for a bit-exact continuation (every flag that changes the result), and where the run was.
nlohmann::json resume_identity(const FinetuneOptions& o) {
  const LoopOptions& lo = o.loop;
  auto checksum = [](const std::string& path) {
    const std::string bytes = io::read_file(path);
    return io::fnv1a(bytes.data(), bytes.size());
  };
  return {{"task", o.task == FinetuneTask::squad ? "squad" : "classify"},
          {"init", o.init},
          {"train_checksum", checksum(o.train)},
          {"dev_checksum", checksum(o.dev)},
          {"epochs", o.epochs},
          {"seed", lo.seed},
          {"rows_per_batch", lo.rows_per_batch},
          {"accumulation", lo.accumulation},
          {"lr", lo.lr},
          {"optimizer", optimizer_name(lo.optimizer.kind)},
          {"max_seq_len", o.max_seq_len},
          {"packed", o.packed},
          {"new_head", o.new_head},
          // Everything else that changes the weights a step writes, or what is tokenised.
          {"warmup_steps", lo.warmup_steps},
          {"decay_power", lo.decay_power},
          {"clip_norm", lo.clip_norm},
          {"weight_decay", lo.optimizer.weight_decay},
          {"beta1", lo.optimizer.beta1},
          {"beta2", lo.optimizer.beta2},
          {"eps", lo.optimizer.eps},
          {"masters", model::masters_name(lo.optimizer.masters)},
          {"precision", model::precision_name(lo.precision)},
          {"loss_scaling", loss_scaling_name(lo.loss_scaling)},
          {"loss_scale_init", lo.loss_scaling.initial},
          {"loss_scale_window", lo.loss_scaling.window},
          {"outlier_z", lo.outlier_z},
          {"zero", lo.zero},
          {"vocab_checksum", checksum(o.vocab)},
          {"cased", o.lower_case ? nlohmann::json(!*o.lower_case) : nlohmann::json()},
          {"regression", o.regression ? nlohmann::json(*o.regression) : nlohmann::json()},
          {"text_columns", o.columns.text},
          {"label_column", o.columns.label},
          {"task_name", o.columns.task_name},
          {"doc_stride", o.squad.doc_stride},
          {"max_query_length", o.squad.max_query_length},
          {"max_answer_length", o.squad.max_answer_length},
          {"save_best", o.save_best}};
}

// The dev results so far (restored with the run's position on --resume).
nlohmann::json dev_results(const FinetuneResult& r) {
  nlohmann::json out = nlohmann::json::array();
  for (const RegressionScore& s : r.dev_regression)
    out.push_back({{"pearson", s.pearson}, {"spearman", s.spearman}, {"mse", s.mse}});
  for (size_t e = 0; e < r.dev_scores.size(); ++e)
    out.push_back({{"accuracy", r.dev_scores[e].accuracy},
                   {"mcc", r.dev_scores[e].mcc},
                   {"f1", r.dev_scores[e].f1 ? nlohmann::json(*r.dev_scores[e].f1) : nullptr}});
  for (const data::SquadScore& s : r.dev_squad)
    out.push_back({{"exact", s.exact_match},
                   {"f1", s.f1},
                   {"v2", s.v2},
                   {"has_exact", s.has_exact},
                   {"has_f1", s.has_f1},
                   {"no_exact", s.no_exact},
                   {"no_f1", s.no_f1},
                   {"total", s.total},
                   {"has_total", s.has_total},
                   {"no_total", s.no_total}});
  return out;
}

void restore_dev_results(const nlohmann::json& j, FinetuneTask task, FinetuneResult& r) {
  // (NaN, a constant side's correlation, is written as null)
  auto number = [](const nlohmann::json& v) {
    return v.is_null() ? std::nan("") : v.get<double>();
  };
  for (const nlohmann::json& e : j) {
    if (e.contains("pearson")) {
      r.dev_regression.push_back(
          {number(e.at("pearson")), number(e.at("spearman")), number(e.at("mse"))});
    } else if (task == FinetuneTask::classify) {
      ClassifyScore s{e.at("accuracy").get<double>(), e.at("mcc").get<double>(), std::nullopt};
      if (!e.at("f1").is_null()) s.f1 = e.at("f1").get<double>();
      r.dev_scores.push_back(s), r.dev_accuracy.push_back(s.accuracy);
    } else {
      data::SquadScore s;
      s.exact_match = e.at("exact"), s.f1 = e.at("f1"), s.v2 = e.at("v2");
      s.has_exact = e.at("has_exact"), s.has_f1 = e.at("has_f1"), s.no_exact = e.at("no_exact");
      s.no_f1 = e.at("no_f1"), s.total = e.at("total"), s.has_total = e.at("has_total");
      s.no_total = e.at("no_total");
      r.dev_squad.push_back(s);
    }
  }
}

// The state of the run a --resume file holds, checked against this run's `identity` (the data
// and flags it must share); the file itself in `file`.
nlohmann::json read_resume_state(const FinetuneOptions& o, const nlohmann::json& identity,
                                 std::optional<io::SafetensorsFile>& file) {
  file.emplace(io::SafetensorsFile::read(o.resume_path));
  nlohmann::json state;
  auto it = file->metadata().find("packbert");
  if (it != file->metadata().end()) state = nlohmann::json::parse(it->second, nullptr, false);
  if (!state.is_object() || state.value("format", std::string()) != "packbert.finetune")
    throw InputError(o.resume_path + ": not a fine-tuning run's resume file");
  for (const auto& [key, value] : identity.items())
    if (state.value(key, nlohmann::json()) != value)
      throw InputError(o.resume_path + ": the run it continues had `" + key + "` " +
                       state.value(key, nlohmann::json()).dump() + ", this one " + value.dump() +
                       "; `resume` needs the same data and flags");
  return state;
}

// Where a fine-tuning run is: optimizer steps done, the epoch and step within it to go on from,
// its training seconds.
struct FinetunePlace {
  int epoch = 0;
  int64_t step_in_epoch = 0;
  double elapsed = 0;
  double train_flops = 0;  // the run's training FLOPs so far (metrics' train_flops)
};

// Writes the resume file: weights, moments, the optimizer's state and the place to go on from;
// atomically, rank 0 alone (the moments gathered under ZeRO-1).
void save_resume(const FinetuneOptions& o, model::BertModel& m, Stepper& stepper,
                 const nlohmann::json& identity, const FinetuneResult& res, const FinetunePlace& at,
                 std::ostream& log) {
  std::vector<float> m_all, v_all, widened;
  const auto [mm, vv] = stepper.whole_moments(m_all, v_all);
  const float* w = m.weights_fp32(widened);
  if (!dist::Comm::world().root()) return;
  nlohmann::json st = identity;
  st["format"] = "packbert.finetune";
  st["steps"] = res.steps, st["epoch"] = at.epoch, st["step_in_epoch"] = at.step_in_epoch;
  st["elapsed"] = at.elapsed, st["train_flops"] = at.train_flops;
  save_stepper_state(stepper, st);
  st["dev"] = dev_results(res);
  // The metrics records so far, which a resumed run writes again before its own: its
  // metrics.jsonl then holds the whole run, as an unbroken one's does.
  log.flush();
  const std::string metrics = o.out_dir + "/metrics.jsonl";
  st["metrics"] = std::filesystem::exists(metrics) ? io::read_file(metrics) : std::string();
  io::write_safetensors(
      o.resume_path, weight_and_moment_tensors(m.layout(), w, mm, vv),
      {{"config", model::config_to_json(m.config()).dump()}, {"packbert", st.dump()}});
}

// The recompute policy a fine-tuning step of full rows fits memory with (`auto` resolved).
model::Recompute step_policy(const model::BertModel& m, const FinetuneOptions& o) {
  const LoopOptions& lo = o.loop;
  PlanRequest plan{m.config(),
                   m.layout().heads(),
                   lo.optimizer.kind,
                   {},
                   lo.precision,
                   lo.optimizer.masters,
                   m.layout().sparsity(),
                   {},
                   1};
  plan.shape = uniform_shape(static_cast<int64_t>(lo.rows_per_batch) * o.max_seq_len,
                             lo.rows_per_batch, omp_get_max_threads());
  return check_step_fits(plan, lo.recompute, lo.memory_limit);
}

// Whether any rank was asked to stop (SIGINT/SIGTERM): every rank stops after the same step.
bool stop_requested(const FinetuneOptions& o, dist::Comm& comm) {
  double stop_now = o.stop && o.stop->load() ? 1.0 : 0.0;
  comm.allreduce_max(&stop_now, 1);
  return stop_now > 0;
}

// The order an epoch visits n rows in: a shuffle seeded by (seed, epoch).
std::vector<size_t> epoch_order(size_t n, uint64_t seed, int epoch) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  SplitMix64 rng(seed * kGolden64 + static_cast<uint64_t>(epoch));
  shuffle(order, rng);
  return order;
}

// The value of the dev metric `name` (FinetuneOptions::save_best) after an epoch; NaN when the
// epoch's scores lack it.
double dev_metric(const FinetuneResult& r, const std::string& name, size_t epoch) {
  if (!r.dev_regression.empty())
    return name == "pearson" ? r.dev_regression[epoch].pearson : r.dev_regression[epoch].spearman;
  if (!r.dev_squad.empty()) {
    const data::SquadScore& s = r.dev_squad[epoch];
    return name == "exact_match" ? s.exact_match : s.f1;
  }
  const ClassifyScore& s = r.dev_scores[epoch];
  if (name == "accuracy") return s.accuracy;
  if (name == "mcc") return s.mcc;
  return s.f1 ? *s.f1 : std::nan("");
}

// Keeps the model's weights in best_path when the last epoch's dev metric beats every earlier
// one (a tie keeps the earlier; a NaN, a constant prediction's correlation, beats nothing and is
// beaten by any number), and records it.
void keep_if_best(const FinetuneOptions& o, const model::BertModel& m, const FinetuneResult& res,
                  std::ostream& log) {
  const size_t n = res.dev_squad.size() + res.dev_scores.size() + res.dev_regression.size();
  if (o.save_best.empty() || n == 0) return;
  const double value = dev_metric(res, o.save_best, n - 1);
  if (std::isnan(value) && n > 1) return;
  for (size_t e = 0; e + 1 < n; ++e) {
    const double earlier = dev_metric(res, o.save_best, e);
    if (!std::isnan(earlier) && !(earlier < value)) return;
  }
  if (!dist::Comm::world().root()) return;
  std::vector<float> widened;
  io::write_safetensors(o.best_path, model::weight_tensors(m.layout(), m.weights_fp32(widened)),
                        {{"config", model::config_to_json(m.config()).dump()}});
  log << nlohmann::json{{"type", "best"},
                        {"epoch", n},
                        {"step", res.steps},
                        {"metric", o.save_best},
                        {"value", value}}
             .dump()
      << std::endl;
}

// The model to write to out_dir under save_best: the best epoch's weights, in a model of m's
// shape and heads; m itself otherwise.
const model::BertModel& published_model(const FinetuneOptions& o, const model::BertModel& m,
                                        std::unique_ptr<model::BertModel>& best) {
  if (o.save_best.empty() || !std::filesystem::exists(o.best_path)) return m;
  best = std::make_unique<model::BertModel>(m.config(), m.layout().heads());
  model::load_model_weights(*best, io::SafetensorsFile::read(o.best_path));
  return *best;
}

// Rank 0 writes the model to publish (published_model) to out_dir, with the classifier's label
// names when it has them.
void write_published(const FinetuneOptions& o, const model::BertModel& m,
                     const data::Casing& casing, const std::vector<std::string>& names = {}) {
  if (!dist::Comm::world().root()) return;
  std::unique_ptr<model::BertModel> best;
  ModelFiles files;
  files.vocab = o.vocab, files.lower_case = casing.lower_case, files.label_names = names;
  write_model_files(published_model(o, m, best), o.out_dir, files);
}

void say(const Say& to, const std::string& line) {
  if (!dist::Comm::world().root()) return;
  if (to)
    to(line);
  else
    std::cerr << line << '\n';
}

// The dev scores of the latest evaluation, as the end-of-run table names them.
std::string latest_dev_scores(const FinetuneResult& r) {
  if (!r.dev_regression.empty()) {
    const RegressionScore& s = r.dev_regression.back();
    return "Pearson " + fixed(s.pearson, 4) + ", Spearman " + fixed(s.spearman, 4) + ", MSE " +
           fixed(s.mse, 4);
  }
  if (!r.dev_squad.empty()) {
    const data::SquadScore& s = r.dev_squad.back();
    std::string t = "exact match " + fixed(s.exact_match, 2) + "%, F1 " + fixed(s.f1, 2) + "%";
    if (s.v2)
      t += " (HasAns EM " + fixed(s.has_exact, 2) + "%, NoAns EM " + fixed(s.no_exact, 2) + "%)";
    return t;
  }
  if (r.dev_scores.empty()) return "";
  const ClassifyScore& s = r.dev_scores.back();
  std::string t = "accuracy " + fixed(s.accuracy, 4) + ", MCC " + fixed(s.mcc, 4);
  if (s.f1) t += ", F1 " + fixed(*s.f1, 4);
  return t;
}

// The training both tasks share: rows shuffled per epoch, the one training step (train/loop.h)
// over steps of processes x rows_per_batch rows x accumulation, a JSONL line per step (rank 0),
// and `evaluate(epoch, elapsed)` (which logs its own line, at that many training seconds) after
// every epoch.
template <typename Seq, typename Evaluate>
void train_epochs(model::BertModel& m, const FinetuneOptions& o, const std::vector<Seq>& seqs,
                  const std::vector<std::vector<int64_t>>& rows, std::ostream& log,
                  FinetuneResult& res, Evaluate evaluate) {
  dist::Comm& comm = dist::Comm::world();
  const LoopOptions& lo = o.loop;
  const int64_t step_rows = static_cast<int64_t>(comm.size()) * lo.rows_per_batch;
  const int64_t micros = (static_cast<int64_t>(rows.size()) + step_rows - 1) / step_rows;
  const int64_t per_epoch = (micros + lo.accumulation - 1) / lo.accumulation;
  const int64_t total = per_epoch * o.epochs;
  const model::Recompute recompute = step_policy(m, o);
  // --resume: the weights before the Stepper is made (it may turn them into 16-bit masters), then
  // the optimizer's state and the place.
  FinetunePlace at;
  std::optional<io::SafetensorsFile> resumed;
  nlohmann::json state;
  const nlohmann::json identity = resume_identity(o);
  if (o.resume) {
    state = read_resume_state(o, identity, resumed);
    model::load_model_weights(m, *resumed);
  }
  Stepper stepper(m, lo, lo.optimizer, lo.accumulation, recompute, comm);
  if (resumed) {
    load_stepper_state(stepper, m.layout(), *resumed, state);
    res.steps = state.at("steps").get<int64_t>();
    at = {state.at("epoch").get<int>(), state.at("step_in_epoch").get<int64_t>(),
          state.value("elapsed", 0.0), state.value("train_flops", 0.0)};
    restore_dev_results(state.at("dev"), o.task, res);
    if (comm.root() && state.contains("metrics") && state["metrics"].is_string())
      log << state["metrics"].get<std::string>() << std::flush;
  }
  const int first_epoch = at.epoch;
  const double flops_per_token = nonembedding_flops_per_token(m.layout());
  ProgressLine progress("finetune", "step", res.steps, total, "tok", o.logging_steps);
  for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
    const std::vector<size_t> order = epoch_order(rows.size(), lo.seed, epoch);
    // (a resumed epoch skips the rows of the steps it had done: every one of them full)
    const int64_t s0 = epoch == first_epoch ? at.step_in_epoch : 0;
    size_t next_row = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(order.size()), s0 * lo.accumulation * step_rows));
    auto next = [&] {
      std::vector<std::vector<int64_t>> batch_rows;
      for (; batch_rows.size() < static_cast<size_t>(step_rows) && next_row < order.size();
           ++next_row)
        batch_rows.push_back(rows[order[next_row]]);
      return make_batch(seqs, batch_rows, o.max_seq_len);
    };
    for (int64_t s = s0; s < per_epoch; ++s) {
      const int n =
          static_cast<int>(std::min<int64_t>(lo.accumulation, micros - s * lo.accumulation));
      const double t0 = now_seconds();
      const StepResult r = stepper.step(res.steps, total, next, "no model written", n);
      StepMetrics sm = StepMetrics::of(r, m.layout().heads(), stepper, lo, comm.size());
      sm.regression = m.config().regression();
      sm.step = ++res.steps, sm.epoch = epoch + 1;
      sm.seconds = now_seconds() - t0;
      sm.elapsed = at.elapsed += sm.seconds;
      sm.train_flops = at.train_flops += flops_per_token * static_cast<double>(r.real_tokens);
      if (comm.root()) {
        log << sm.to_json().dump() << std::endl;
        char fields[128];
        std::snprintf(fields, sizeof fields, "epoch %d/%d  loss %.4f  lr %.2e%s", epoch + 1,
                      o.epochs, r.loss(), r.lr, r.skipped ? "  (update skipped)" : "");
        progress.update(res.steps, static_cast<double>(r.real_tokens), sm.seconds, fields);
      }
      io::crash_point("step");
      at.epoch = epoch, at.step_in_epoch = s + 1;
      if (stop_requested(o, comm)) {
        if (comm.root()) progress.finish();
        save_resume(o, m, stepper, identity, res, at, log);
        res.stopped = true;
        return;
      }
      if (o.checkpoint_every > 0 && res.steps % o.checkpoint_every == 0)
        save_resume(o, m, stepper, identity, res, at, log);
    }
    if (comm.root()) progress.finish();
    evaluate(epoch + 1, at.elapsed);
    // Said when measured: a run stopped in a later epoch has shown this one's.
    say(o.say, "finetune: epoch " + std::to_string(epoch + 1) + "/" + std::to_string(o.epochs) +
                   " (step " + std::to_string(res.steps) + ") dev " + latest_dev_scores(res));
    keep_if_best(o, m, res, log);
    at.epoch = epoch + 1, at.step_in_epoch = 0;
    save_resume(o, m, stepper, identity, res, at, log);
  }
}

// Runs the model over rows of sequences without dropout, `rows_per_batch` rows at a time, and
// hands each forward's outputs with its rows to `visit`.
template <typename Seq, typename Visit>
void for_each_batch(model::BertModel& m, const std::vector<Seq>& seqs,
                    const std::vector<std::vector<int64_t>>& rows, int rows_per_batch, int S,
                    model::Precision precision, Visit visit) {
  // A progress line (rank 0, on stderr) over evaluations of more than a few batches: about 20
  // lines without a terminal, however large the set.
  const int64_t batches =
      static_cast<int64_t>((rows.size() + static_cast<size_t>(rows_per_batch) - 1) /
                           static_cast<size_t>(rows_per_batch));
  const bool show = batches > 4 && dist::Comm::world().root();
  ProgressLine progress("evaluate", "batch", 0, batches, "seq", std::max<int64_t>(1, batches / 20));
  int64_t done = 0;
  for (size_t b = 0; b < rows.size(); b += static_cast<size_t>(rows_per_batch)) {
    std::vector<std::vector<int64_t>> batch_rows(
        rows.begin() + static_cast<long>(b),
        rows.begin() + static_cast<long>(std::min(rows.size(), b + rows_per_batch)));
    model::StepOptions so;
    so.precision = precision;
    const double t0 = now_seconds();
    model::Outputs out = m.forward(make_batch(seqs, batch_rows, S), so);
    visit(out, batch_rows);
    if (show) {
      double sequences = 0;
      for (const auto& r : batch_rows) sequences += static_cast<double>(r.size());
      progress.update(++done, sequences, now_seconds() - t0, "");
    }
  }
  if (show) progress.finish();
}

// Classification accuracy over rows of examples.
// The classifier's prediction (argmax of its logits) for every example, by index.
std::vector<int32_t> predict(model::BertModel& m, const std::vector<data::ClassifyExample>& ex,
                             const std::vector<std::vector<int64_t>>& rows, int rows_per_batch,
                             int S, model::Precision precision) {
  std::vector<int32_t> pred(ex.size(), -1);
  const int NL = m.config().num_labels;
  for_each_batch(
      m, ex, rows, rows_per_batch, S, precision,
      [&](const model::Outputs& out, const std::vector<std::vector<int64_t>>& batch_rows) {
        const float* logits = m.class_logits();  // [sequences in row order, NL]
        int64_t k = 0, correct = 0;
        for (const auto& row : batch_rows)
          for (const int64_t id : row) {
            const float* l = logits + k++ * NL;
            const auto p = static_cast<int32_t>(std::max_element(l, l + NL) - l);
            pred[static_cast<size_t>(id)] = p;
            correct += p == ex[static_cast<size_t>(id)].label;
          }
        // (the head's own count, by the same argmax: the rows are read in order)
        if (k != out.cls_count || correct != out.cls_correct)
          throw std::logic_error("classifier predictions out of order with the batch");
      });
  return pred;
}

// A regression head's prediction (its one output) for every example, by index.
std::vector<double> predict_values(model::BertModel& m,
                                   const std::vector<data::ClassifyExample>& ex,
                                   const std::vector<std::vector<int64_t>>& rows,
                                   int rows_per_batch, int S, model::Precision precision) {
  std::vector<double> pred(ex.size(), std::nan(""));
  for_each_batch(m, ex, rows, rows_per_batch, S, precision,
                 [&](const model::Outputs&, const std::vector<std::vector<int64_t>>& batch_rows) {
                   const float* values = m.class_logits();  // [sequences in row order, 1]
                   int64_t k = 0;
                   for (const auto& row : batch_rows)
                     for (const int64_t id : row) pred[static_cast<size_t>(id)] = values[k++];
                 });
  return pred;
}

std::vector<double> targets_of(const std::vector<data::ClassifyExample>& ex) {
  std::vector<double> out;
  for (const auto& e : ex) out.push_back(e.target.value());
  return out;
}

ClassifyScore score_classifier(model::BertModel& m, const std::vector<data::ClassifyExample>& ex,
                               const std::vector<std::vector<int64_t>>& rows, int rows_per_batch,
                               int S, model::Precision precision) {
  std::vector<int32_t> truth;
  for (const auto& e : ex) truth.push_back(e.label);
  return classify_score(truth, predict(m, ex, rows, rows_per_batch, S, precision),
                        m.config().num_labels);
}

// Each SQuAD example's predicted answer: span logits of every window, then n-best decoding.
std::vector<std::string> squad_answers(model::BertModel& m,
                                       const std::vector<data::SquadExample>& examples,
                                       const std::vector<data::SquadFeature>& features,
                                       const std::vector<std::vector<int64_t>>& rows,
                                       int rows_per_batch, int S, model::Precision precision,
                                       const data::Tokenizer& tok, const data::SquadOptions& so) {
  std::vector<std::vector<float>> logits(features.size());
  for_each_batch(m, features, rows, rows_per_batch, S, precision,
                 [&](const model::Outputs&, const std::vector<std::vector<int64_t>>& batch_rows) {
                   const float* lg = m.span_logits();
                   const std::vector<int32_t>& cu = m.tokens().cu_seqlens;
                   size_t s = 0;
                   for (const auto& row : batch_rows)
                     for (int64_t f : row) {
                       logits[f].assign(lg + 2 * cu[s], lg + 2 * cu[s + 1]);
                       ++s;
                     }
                 });
  return data::squad_predictions(examples, features, logits, tok, so);
}

// Says how the text was tokenised (data::decide_casing's note) and any contradiction, on rank 0,
// once the inputs are known good (a bad input's error stays the only line).
void say_casing(const data::Casing& c, const char* command, const Say& to) {
  if (!c.note.empty()) say(to, std::string(command) + ": tokenising " + c.note);
  if (!c.warning.empty()) say(to, std::string(command) + ": warning: " + c.warning);
}

void warn_non_finite(const model::BertModel& m, const std::string& path, const Say& to) {
  if (const std::string bad = non_finite_weights(m); !bad.empty())
    say(to, "eval: warning: " + path + ": " + bad + "; its metrics will be NaN");
}

// {question id: answer} as the official evaluation script reads it, written atomically.
void write_predictions(const std::string& path, const std::vector<data::SquadExample>& examples,
                       const std::vector<std::string>& predictions) {
  nlohmann::json pj = nlohmann::json::object();
  for (size_t i = 0; i < examples.size(); ++i) pj[examples[i].id] = predictions[i];
  io::write_file_atomic(path, pj.dump(1) + "\n");
}

void check_model(const model::BertModel& m, const data::Vocab& vocab, const std::string& model_path,
                 const std::string& vocab_path, int max_seq_len) {
  if (m.config().vocab_size != vocab.size())
    throw InputError(model_path + ": vocab_size " + std::to_string(m.config().vocab_size) +
                     " differs from " + vocab_path);
  if (m.config().max_position_embeddings < max_seq_len)
    throw InputError("`max_seq_len` " + std::to_string(max_seq_len) +
                     " exceeds the model's max_position_embeddings");
}

// The ids the classifier is trained with (docs/FINETUNE.md): a starting model with a classifier
// and named labels (config.json id2label) keeps its mapping, the data's labels matched by name;
// otherwise (no head, transformers' LABEL_i names, or new_head) the data's labels sorted.
struct ClassLabels {
  std::map<std::string, int32_t> ids;
  bool new_head = true;
  std::string note;  // the choice, in a line for the user
};

ClassLabels class_labels(const ModelLabels& model, const std::map<std::string, int32_t>& seen,
                         bool new_head, const std::string& data) {
  ClassLabels out;
  auto listed = [](const std::map<std::string, int32_t>& ids) {
    std::vector<std::string> names(ids.size());
    for (const auto& [name, id] : ids) names[static_cast<size_t>(id)] = name;
    std::string s;
    for (size_t i = 0; i < names.size(); ++i)
      s += (i ? ", " : "") + std::to_string(i) + " " + names[i];
    return s;
  };
  if (model.heads.classifier && !new_head && !model.names.empty() && !model.generic()) {
    for (size_t i = 0; i < model.names.size(); ++i)
      out.ids.emplace(model.names[i], static_cast<int32_t>(i));
    for (const auto& [name, id] : seen)
      if (!out.ids.count(name))
        throw InputError(data + ": label '" + name + "' is not one of the model's labels (" +
                         listed(out.ids) + ", from " + model.source +
                         "); relabel the data, or give `new_head` to train a new classifier");
    out.new_head = false;
    out.note =
        "labels as the model's classifier has them (" + model.source + "): " + listed(out.ids);
    return out;
  }
  out.ids = data::sorted_label_ids(seen);
  if (model.heads.classifier &&
      !new_head) {  // a classifier whose outputs have no names: kept, in sorted order
    if (!model.names.empty() && model.names.size() != out.ids.size())
      throw InputError(data + ": " + std::to_string(out.ids.size()) + " labels, but the model's " +
                       "classifier has " + std::to_string(model.names.size()) +
                       " unnamed outputs (" + model.source +
                       "); give `new_head` to train a new "
                       "classifier");
    out.new_head = false;
    out.note = "the model's classifier names no labels; the data's, sorted, are its outputs: " +
               listed(out.ids);
    return out;
  }
  out.note = "a new classifier; the data's labels, sorted: " + listed(out.ids);
  return out;
}

// Whether a classify task trains a regression head (FinetuneOptions::regression): as asked, else
// as a named GLUE task is (stsb), else as the model's head is, else as the labels read.
bool regression_task(const FinetuneOptions& o, const ModelLabels& model,
                     const std::map<std::string, int32_t>& seen, const std::string& task) {
  if (o.regression) {
    if (!o.columns.task_name.empty() && *o.regression != (task == "stsb"))
      throw OptionError(
          "task_name",
          task + (task == "stsb" ? " is a regression task; `classification` contradicts it"
                                 : " is a classification task; `regression` contradicts it"));
    return *o.regression;
  }
  if (!o.columns.task_name.empty()) return task == "stsb";
  if (model.heads.classifier && !o.new_head) return model.regression();
  return data::decimal_labels(seen);
}

// The metric that leads a classifier's scores: its GLUE task's (F1 only where it is defined, for
// two labels), else accuracy.
std::string headline_metric(const std::string& task, int num_labels) {
  const std::string m = data::glue_metric(task);
  return m == "f1" && num_labels != 2 ? "accuracy" : m;
}

bool regression_metric(const std::string& name) {
  return name == "pearson" || name == "spearman";
}

// Regression (STS-B): one output trained towards each example's value by mean squared error,
// scored by Pearson's and Spearman's correlation; the model is written with problem_type
// "regression", as transformers' BertForSequenceClassification with one label.
FinetuneResult finetune_regressor(const FinetuneOptions& o, const data::Tokenizer& tok,
                                  const data::Casing& casing, std::ostream& log,
                                  const ModelLabels& model,
                                  std::vector<data::ClassifyExample> train,
                                  const std::map<std::string, int32_t>& seen) {
  data::set_targets(train, seen, o.train);
  std::map<std::string, int32_t> dev_seen;
  std::vector<data::ClassifyExample> dev =
      data::read_classification_tsv(o.dev, tok, o.max_seq_len, dev_seen, true, o.columns);
  data::set_targets(dev, dev_seen, o.dev);
  if (!o.save_best.empty() && !regression_metric(o.save_best))
    throw OptionError("save_best", "'" + o.save_best +
                                       "' is a classification metric; this task is a regression "
                                       "(pearson, spearman)");
  FinetuneResult res;
  res.num_labels = 1;
  const bool new_head = o.new_head || !model.heads.classifier;
  if (!new_head && !model.regression())
    throw InputError(o.init + ": its classifier has " + std::to_string(model.num_labels) +
                     " outputs, a regression head one; give `new_head` to train a new head");
  res.label_note = new_head ? "a new regression head (one output, mean squared error)"
                            : "the model's regression head (" + model.source + ")";
  model::Heads heads;
  heads.pretraining = false;
  heads.classifier = true;
  auto m = model_from(o.init, heads, 1, o.loop.seed, res.initialized, new_head);
  check_model(*m, tok.vocab(), o.init, o.vocab, o.max_seq_len);
  say_casing(casing, "finetune", o.say);
  say(o.say, "finetune: " + res.label_note);
  const auto tr = make_rows(lengths_of(train), o.max_seq_len, o.packed, o.loop.seed);
  const auto dv = make_rows(lengths_of(dev), o.max_seq_len, o.packed, o.loop.seed);
  res.train_sequences = static_cast<int64_t>(train.size());
  res.dev_sequences = static_cast<int64_t>(dev.size());
  res.train_rows = static_cast<int64_t>(tr.size());
  const std::vector<double> truth = targets_of(dev);
  train_epochs(*m, o, train, tr, log, res, [&](int epoch, double elapsed) {
    const RegressionScore sc = regression_score(
        truth, predict_values(*m, dev, dv, o.loop.rows_per_batch, o.max_seq_len, o.loop.precision));
    res.dev_regression.push_back(sc);
    auto number = [](double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); };
    log << nlohmann::json{{"type", "eval"},
                          {"epoch", epoch},
                          {"step", res.steps},
                          {"elapsed", elapsed},
                          {"dev_pearson", number(sc.pearson)},
                          {"dev_spearman", number(sc.spearman)},
                          {"dev_mse", sc.mse},
                          {"metric", "pearson"}}
               .dump()
        << std::endl;
  });
  write_published(o, *m, casing);
  return res;
}

FinetuneResult finetune_classifier(const FinetuneOptions& o, const data::Tokenizer& tok,
                                   const data::Casing& casing, std::ostream& log) {
  std::map<std::string, int32_t> seen;  // the training file's labels, by first appearance
  std::vector<data::ClassifyExample> train =
      data::read_classification_tsv(o.train, tok, o.max_seq_len, seen, true, o.columns);
  const std::string task = data::glue_task(o.train, o.columns);
  const ModelLabels model = model_labels(o.init);  // (the head --init has, if any)
  if (regression_task(o, model, seen, task)) {
    FinetuneResult r = finetune_regressor(o, tok, casing, log, model, std::move(train), seen);
    r.glue_task = task, r.metric = "pearson";
    return r;
  }
  if (regression_metric(o.save_best))
    throw OptionError("save_best", "'" + o.save_best +
                                       "' is a regression metric; this task has classes "
                                       "(accuracy, f1, mcc)");
  FinetuneResult res;
  const ClassLabels chosen = class_labels(model, seen, o.new_head, o.train);
  std::map<std::string, int32_t> labels = chosen.ids;
  data::relabel(train, seen, labels, o.train);
  std::vector<data::ClassifyExample> dev =
      data::read_classification_tsv(o.dev, tok, o.max_seq_len, labels, false, o.columns);
  res.num_labels = static_cast<int>(labels.size());
  res.label_note = chosen.note;
  res.glue_task = task;
  res.metric = headline_metric(task, res.num_labels);
  if (res.num_labels < 2) throw InputError(o.train + ": needs at least two labels");
  if (o.save_best == "f1" && res.num_labels != 2)
    throw OptionError("save_best", "f1 is the positive label's, for two labels; this task has " +
                                       std::to_string(res.num_labels) + ": use accuracy or mcc");
  model::Heads heads;
  heads.pretraining = false;
  heads.classifier = true;
  auto m = model_from(o.init, heads, res.num_labels, o.loop.seed, res.initialized, chosen.new_head);
  check_model(*m, tok.vocab(), o.init, o.vocab, o.max_seq_len);
  say_casing(casing, "finetune", o.say);
  say(o.say, "finetune: " + chosen.note);
  std::vector<int64_t> per_label(res.num_labels, 0);
  for (const auto& e : train) ++per_label[e.label];
  int32_t majority = static_cast<int32_t>(std::max_element(per_label.begin(), per_label.end()) -
                                          per_label.begin());
  int64_t maj_ok = 0;
  for (const auto& e : dev) maj_ok += e.label == majority;
  res.majority_baseline = static_cast<double>(maj_ok) / static_cast<double>(dev.size());

  const auto tr = make_rows(lengths_of(train), o.max_seq_len, o.packed, o.loop.seed);
  const auto dv = make_rows(lengths_of(dev), o.max_seq_len, o.packed, o.loop.seed);
  res.train_sequences = static_cast<int64_t>(train.size());
  res.dev_sequences = static_cast<int64_t>(dev.size());
  res.train_rows = static_cast<int64_t>(tr.size());
  train_epochs(*m, o, train, tr, log, res, [&](int epoch, double elapsed) {
    const ClassifyScore sc =
        score_classifier(*m, dev, dv, o.loop.rows_per_batch, o.max_seq_len, o.loop.precision);
    res.dev_scores.push_back(sc);
    res.dev_accuracy.push_back(sc.accuracy);
    nlohmann::json line{{"type", "eval"},
                        {"epoch", epoch},
                        {"step", res.steps},
                        {"elapsed", elapsed},
                        {"dev_acc", sc.accuracy},
                        {"dev_mcc", sc.mcc},
                        {"majority_baseline", res.majority_baseline}};
    if (sc.f1) line["dev_f1"] = *sc.f1;
    if (!task.empty()) line["glue_task"] = task;
    line["metric"] = res.metric;
    log << line.dump() << std::endl;
  });
  if (!dist::Comm::world().root()) return res;  // rank 0 alone writes the model
  std::vector<std::string> names(labels.size());
  for (auto& [name, id] : labels) names[static_cast<size_t>(id)] = name;
  write_published(o, *m, casing, names);
  nlohmann::json lj = nlohmann::json::object();
  for (auto& [name, id] : labels) lj[name] = id;
  io::write_file_atomic(o.out_dir + "/labels.json", lj.dump(1) + "\n");
  return res;
}

data::SquadOptions squad_options(data::SquadOptions so, int max_seq_len) {
  so.max_seq_len = max_seq_len;
  if (so.doc_stride < 1 || so.max_query_length < 1 || so.max_answer_length < 1)
    throw InputError("`doc_stride`, `max_query_length` and `max_answer_length` must be positive");
  return so;
}

FinetuneResult finetune_squad(const FinetuneOptions& o, const data::Tokenizer& tok,
                              const data::Casing& casing, std::ostream& log) {
  data::SquadOptions so = squad_options(o.squad, o.max_seq_len);
  std::vector<data::SquadExample> train = data::read_squad(o.train), dev = data::read_squad(o.dev);
  // SQuAD v2.0: unanswerable questions train towards [CLS] and are predicted by the null score.
  so.v2 = data::squad_has_unanswerable(train) || data::squad_has_unanswerable(dev);
  data::SquadFeatures tf = data::squad_features(train, tok, so, true);
  data::SquadFeatures df = data::squad_features(dev, tok, so, false);
  if (tf.features.empty()) throw InputError(o.train + ": no answerable question");
  FinetuneResult res;
  res.skipped = tf.unanswerable;
  model::Heads heads;
  heads.pretraining = false;
  heads.span = true;
  auto m = model_from(o.init, heads, 0, o.loop.seed, res.initialized);
  check_model(*m, tok.vocab(), o.init, o.vocab, o.max_seq_len);
  say_casing(casing, "finetune", o.say);
  const auto tr = make_rows(lengths_of(tf.features), o.max_seq_len, o.packed, o.loop.seed);
  const auto dv = make_rows(lengths_of(df.features), o.max_seq_len, o.packed, o.loop.seed);
  res.train_sequences = static_cast<int64_t>(tf.features.size());
  res.dev_sequences = static_cast<int64_t>(df.features.size());
  res.train_rows = static_cast<int64_t>(tr.size());
  train_epochs(*m, o, tf.features, tr, log, res, [&](int epoch, double elapsed) {
    std::vector<std::string> pred = squad_answers(*m, dev, df.features, dv, o.loop.rows_per_batch,
                                                  o.max_seq_len, o.loop.precision, tok, so);
    res.dev_squad.push_back(data::squad_score(dev, pred));
    if (dist::Comm::world().root()) write_predictions(o.out_dir + "/predictions.json", dev, pred);
    log << nlohmann::json{{"type", "eval"},
                          {"epoch", epoch},
                          {"step", res.steps},
                          {"elapsed", elapsed},
                          {"exact_match", res.dev_squad.back().exact_match},
                          {"f1", res.dev_squad.back().f1},
                          {"has_ans_exact", res.dev_squad.back().has_exact},
                          {"has_ans_f1", res.dev_squad.back().has_f1},
                          {"no_ans_exact", res.dev_squad.back().no_exact},
                          {"no_ans_f1", res.dev_squad.back().no_f1}}
               .dump()
        << std::endl;
  });
  write_published(o, *m, casing);
  return res;
}

}  // namespace

ClassifyScore classify_score(const std::vector<int32_t>& truth, const std::vector<int32_t>& pred,
                             int num_labels) {
  ClassifyScore s;
  const size_t K = static_cast<size_t>(std::max(num_labels, 2));
  std::vector<double> c(K * K, 0);  // confusion: c[truth * K + pred]
  for (size_t i = 0; i < truth.size(); ++i)
    c[static_cast<size_t>(truth[i]) * K + static_cast<size_t>(pred[i])] += 1;
  const double n = static_cast<double>(truth.size());
  if (n == 0) return s;
  double correct = 0;
  std::vector<double> t(K, 0), p(K, 0);  // per-label counts in truth and predictions
  for (size_t a = 0; a < K; ++a)
    for (size_t b = 0; b < K; ++b) t[a] += c[a * K + b], p[b] += c[a * K + b];
  for (size_t a = 0; a < K; ++a) correct += c[a * K + a];
  s.accuracy = correct / n;
  // Matthews correlation, the multi-class form (Gorodkin 2004); sklearn's matthews_corrcoef.
  double tp = 0, pp = 0, tt = 0;
  for (size_t a = 0; a < K; ++a) tp += t[a] * p[a], pp += p[a] * p[a], tt += t[a] * t[a];
  const double den = std::sqrt((n * n - pp) * (n * n - tt));
  s.mcc = den > 0 ? (correct * n - tp) / den : 0;
  // F1 of label 1 (the positive class of GLUE's binary tasks), sklearn's f1_score.
  if (num_labels == 2) {
    const double tp1 = c[1 * K + 1], fp = c[0 * K + 1], fn = c[1 * K + 0];
    s.f1 = tp1 + fp + fn > 0 ? 2 * tp1 / (2 * tp1 + fp + fn) : 0;
  }
  return s;
}

namespace {

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / n, my += y[i] / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0) : std::nan("");
}

// Ranks 1..n, tied values sharing the mean of the ranks they span.
std::vector<double> ranks(const std::vector<double>& x) {
  std::vector<size_t> order(x.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> r(x.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[order[k]] = (static_cast<double>(i + j) / 2) + 1;
    i = j + 1;
  }
  return r;
}

}  // namespace

RegressionScore regression_score(const std::vector<double>& truth,
                                 const std::vector<double>& pred) {
  RegressionScore s;
  if (truth.empty()) return s;
  for (size_t i = 0; i < truth.size(); ++i)
    s.mse += (pred[i] - truth[i]) * (pred[i] - truth[i]) / static_cast<double>(truth.size());
  s.pearson = pearson(truth, pred);
  s.spearman = pearson(ranks(truth), ranks(pred));
  return s;
}

FinetuneResult finetune(const FinetuneOptions& o) {
  check_loop_options(o.loop);
  if (o.epochs < 1) throw OptionError("epochs", "must be at least 1");
  if (o.max_seq_len < 8) throw OptionError("max_seq_len", "must be at least 8");
  if (o.checkpoint_every < 0) throw OptionError("checkpoint_every", "must be at least 0");
  const bool squad = o.task == FinetuneTask::squad;
  if (!o.save_best.empty() && !(squad ? o.save_best == "exact_match" || o.save_best == "f1"
                                      : o.save_best == "accuracy" || o.save_best == "f1" ||
                                            o.save_best == "mcc" || regression_metric(o.save_best)))
    throw OptionError("save_best", "'" + o.save_best + "' is not a dev metric of " +
                                       (squad ? "squad (exact_match, f1)"
                                              : "classify (accuracy, f1, mcc; regression: "
                                                "pearson, spearman)"));
  const std::string resume_path = o.out_dir + ".resume.safetensors";
  const std::string best_path = o.out_dir + ".best.safetensors";
  if (o.resume && !std::filesystem::exists(resume_path))
    throw InputError(resume_path +
                     ": no fine-tuning run to resume (it is written every "
                     "`checkpoint_every` steps, at each epoch's end and on "
                     "SIGINT/SIGTERM)");
  if (!o.resume && !o.overwrite && std::filesystem::exists(resume_path))
    throw InputError(resume_path +
                     ": an interrupted fine-tuning run is there; continue it with "
                     "`resume`, or start over with `overwrite`");
  data::Vocab vocab = data::Vocab::load(o.vocab);
  const data::Casing casing = data::decide_casing(o.lower_case, o.init, vocab, o.vocab);
  data::Tokenizer tok(vocab, casing.lower_case);
  // Everything is written into a staging directory that replaces out_dir only at the end: a
  // failed or interrupted run leaves out_dir as it was. Rank 0 alone writes.
  dist::Comm& comm = dist::Comm::world();
  std::optional<io::StagedDirectory> out;
  FinetuneOptions staged = o;
  staged.resume_path = resume_path;
  staged.best_path = best_path;
  std::ofstream log;
  dist::fail_together(comm, [&] {
    if (!comm.root()) return;
    {  // a killed run's staging directory and partly written resume and best files
      const std::filesystem::path out_path = std::filesystem::absolute(o.out_dir);
      if (std::filesystem::is_directory(out_path.parent_path()))
        io::remove_stale_temporaries(
            out_path.parent_path().string(),
            {out_path.filename().string(), out_path.filename().string() + ".resume.safetensors",
             out_path.filename().string() + ".best.safetensors"});
    }
    // A new run's best epoch is its own (a resumed run keeps the one its epochs chose).
    if (!o.resume) std::filesystem::remove(best_path);
    io::refuse_directory_over_inputs(
        {o.out_dir, "`out_dir`"},
        {{o.train, "`train`"}, {o.dev, "`dev`"}, {o.init, "`init`"}, {o.vocab, "`vocab`"}});
    out.emplace(o.out_dir, "`out_dir`", o.overwrite);
    staged.out_dir = out->path();
    log.open(staged.out_dir + "/metrics.jsonl");
    if (!log) throw InputError(staged.out_dir + "/metrics.jsonl: cannot open for writing");
  });
  FinetuneResult r = o.task == FinetuneTask::squad ? finetune_squad(staged, tok, casing, log)
                                                   : finetune_classifier(staged, tok, casing, log);
  r.resume_path = resume_path;
  if (r.stopped) return r;  // (the staging directory goes; the resume file stays)
  if (comm.root()) {
    log.close();
    out->publish();
    std::filesystem::remove(resume_path);  // the run is done: its model is out_dir
    std::filesystem::remove(best_path);
  }
  return r;
}

namespace {

// A classifier's label names by id: its config.json id2label (any Hugging Face classifier, and
// packbert's fine-tuned models), or labels.json beside it (older packbert); `path` says which.
std::map<std::string, int32_t> labels_of_model(const std::string& model, const ModelLabels& named,
                                               std::string& path) {
  std::map<std::string, int32_t> labels;
  path = named.source;
  for (size_t i = 0; i < named.names.size(); ++i)
    labels.emplace(named.names[i], static_cast<int32_t>(i));
  if (labels.size() != named.names.size())
    throw InputError(named.source + ": id2label names a label twice");
  if (!labels.empty()) return labels;
  path =
      (std::filesystem::is_directory(model) ? model
                                            : std::filesystem::path(model).parent_path().string()) +
      "/labels.json";
  if (!std::filesystem::exists(path))
    throw InputError(model +
                     ": its config has no id2label (and there is no labels.json): "
                     "which output is which label is unknown");
  io::require_text_input(path);
  std::ifstream lf(path);
  if (!lf) throw InputError(path + ": cannot open (needed to map label names to ids)");
  nlohmann::json lj = nlohmann::json::parse(lf, nullptr, false);
  if (!lj.is_object() || lj.empty())
    throw InputError(path + ": expected a JSON object {label: id}");
  for (auto& [name, id] : lj.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= std::ssize(lj))
      throw InputError(path + ": label '" + name + "' has no valid id");
    labels[name] = id.get<int32_t>();
  }
  return labels;
}

// run_glue's predict_results for a regression task: index and the predicted value (3 decimals,
// as run_glue writes them), written atomically.
void write_value_predictions(const std::string& path, const std::vector<double>& pred) {
  std::string out = "index\tprediction\n";
  for (size_t i = 0; i < pred.size(); ++i)
    out += std::to_string(i) + "\t" + fixed(pred[i], 3) + "\n";
  io::write_file_atomic(path, out);
}

// run_glue's predict_results: index and the predicted label's name, written atomically.
void write_label_predictions(const std::string& path, const std::map<std::string, int32_t>& labels,
                             const std::vector<int32_t>& pred, int num_labels) {
  std::vector<std::string> name(static_cast<size_t>(num_labels));
  for (const auto& [label, id] : labels)
    if (id >= 0 && static_cast<size_t>(id) < name.size()) name[static_cast<size_t>(id)] = label;
  std::string out = "index\tprediction\n";
  for (size_t i = 0; i < pred.size(); ++i)
    out += std::to_string(i) + "\t" + name[static_cast<size_t>(pred[i])] + "\n";
  io::write_file_atomic(path, out);
}

}  // namespace

TaskEvalResult evaluate_task(const TaskEvalOptions& o) {
  if (o.max_seq_len < 8) throw OptionError("max_seq_len", "must be at least 8");
  if (o.rows_per_batch < 1) throw OptionError("rows_per_batch", "must be at least 1");
  io::refuse_outputs_over_inputs(
      {{o.predictions, "`predictions`"}},
      {{o.model, "`model`"}, {o.data, "`sequences`"}, {o.vocab, "`vocab`"}});
  data::Vocab vocab = data::Vocab::load(o.vocab);
  const data::Casing casing = data::decide_casing(o.lower_case, o.model, vocab, o.vocab);
  data::Tokenizer tok(vocab, casing.lower_case);
  TaskEvalResult r;
  model::Heads heads;
  heads.pretraining = false;
  // A loaded model on the chosen backend, checked against the vocabulary, and the casing said
  // once the inputs are known good.
  auto prepare = [&](model::BertModel& m) {
    m.set_backend(o.backend);
    warn_non_finite(m, o.model, o.say);
    check_model(m, vocab, o.model, o.vocab, o.max_seq_len);
    say_casing(casing, "eval", o.say);
  };
  if (o.task == FinetuneTask::squad) {
    data::SquadOptions so = squad_options(o.squad, o.max_seq_len);
    std::vector<data::SquadExample> ex = data::read_squad(o.data);
    so.v2 = data::squad_has_unanswerable(ex);
    data::SquadFeatures f = data::squad_features(ex, tok, so, false);
    heads.span = true;
    auto m = load_model(o.model, heads);
    prepare(*m);
    const auto rows = make_rows(lengths_of(f.features), o.max_seq_len, true, 1);
    std::vector<std::string> pred = squad_answers(*m, ex, f.features, rows, o.rows_per_batch,
                                                  o.max_seq_len, o.precision, tok, so);
    r.squad = data::squad_score(ex, pred);
    r.examples = static_cast<int64_t>(ex.size());
    r.sequences = static_cast<int64_t>(f.features.size());
    if (!o.predictions.empty()) write_predictions(o.predictions, ex, pred);
    return r;
  }
  heads.classifier = true;
  r.glue_task = data::glue_task(o.data, o.columns);
  const ModelLabels named = model_labels(o.model);
  if (named.regression()) {  // a regression head: the labels are its targets
    r.metric = "pearson";
    std::map<std::string, int32_t> seen;
    std::vector<data::ClassifyExample> ex =
        data::read_classification_tsv(o.data, tok, o.max_seq_len, seen, true, o.columns);
    data::set_targets(ex, seen, o.data);
    auto m = load_model(o.model, heads);
    prepare(*m);
    const auto rows = make_rows(lengths_of(ex), o.max_seq_len, true, 1);
    const std::vector<double> pred =
        predict_values(*m, ex, rows, o.rows_per_batch, o.max_seq_len, o.precision);
    r.regression = regression_score(targets_of(ex), pred);
    r.examples = r.sequences = static_cast<int64_t>(ex.size());
    if (!o.predictions.empty()) write_value_predictions(o.predictions, pred);
    return r;
  }
  // Classification: the label names are the model's (config.json id2label, or labels.json).
  std::string labels_path;
  std::map<std::string, int32_t> labels = labels_of_model(o.model, named, labels_path);
  std::vector<data::ClassifyExample> ex =
      data::read_classification_tsv(o.data, tok, o.max_seq_len, labels, false, o.columns);
  auto m = load_model(o.model, heads);
  if (m->config().num_labels != static_cast<int>(labels.size()))
    throw InputError(labels_path + ": " + std::to_string(labels.size()) +
                     " labels, the model's classifier has " +
                     std::to_string(m->config().num_labels));
  prepare(*m);
  const auto rows = make_rows(lengths_of(ex), o.max_seq_len, true, 1);
  const std::vector<int32_t> pred =
      predict(*m, ex, rows, o.rows_per_batch, o.max_seq_len, o.precision);
  std::vector<int32_t> truth;
  for (const auto& e : ex) truth.push_back(e.label);
  r.scores = classify_score(truth, pred, m->config().num_labels);
  r.metric = headline_metric(r.glue_task, m->config().num_labels);
  r.accuracy = r.scores.accuracy;
  r.examples = r.sequences = static_cast<int64_t>(ex.size());
  if (!o.predictions.empty())
    write_label_predictions(o.predictions, labels, pred, m->config().num_labels);
  return r;
}

}  // namespace packbert::train
