// The Trainer's files in its run directory: checkpoint names and rotation, the disk-space check,
// gathering pipeline stages' arrays onto rank 0, and writing the whole state
// (checkpoint.safetensors, best.safetensors).
#include <omp.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/comm.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/fault.h"
#include "io/memory.h"
#include "io/paths.h"
#include "io/safetensors.h"
#include "model/hf_import.h"
#include "model/weights.h"
#include "stopwatch.h"
#include "text.h"
#include "train/memory_plan.h"
#include "train/model_files.h"
#include "train/trainer.h"
#include "train/trainer_state.h"

namespace packbert::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string Trainer::checkpoint_path() const {
  return opt_.out_dir + "/checkpoint.safetensors";
}

std::string Trainer::earlier_checkpoint_path(int64_t step) const {
  return opt_.out_dir + "/checkpoint-" + std::to_string(step) + ".safetensors";
}

std::string Trainer::best_path() const {
  return opt_.out_dir + "/best.safetensors";
}

std::vector<std::pair<int64_t, std::string>> Trainer::earlier_checkpoints() const {
  return checkpoints_in(opt_.out_dir, ".safetensors", false);
}

void Trainer::clear_earlier_run() {
  if (earlier_run_cleared_) return;
  earlier_run_cleared_ = true;
  for (const auto& [step, path] : earlier_checkpoints()) fs::remove(path);
  fs::remove(best_path());
}

// Refuses to start a run whose checkpoints cannot be written: the file system must hold one
// more checkpoint (the temporary file of a write); warns when the kept ones may not fit.
void Trainer::check_disk_space() const {
  fs::path where = fs::absolute(opt_.out_dir);  // (out_dir, or the directory it will be made in)
  while (!fs::exists(where) && where.has_parent_path() && where != where.parent_path())
    where = where.parent_path();
  struct statvfs vfs {};
  if (::statvfs(where.c_str(), &vfs) != 0) return;
  const double free_bytes = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize);
  // Weights and two moments in fp32, plus the header and patterns (a few per cent).
  const double one = 3.0 * 4.0 * static_cast<double>(model_->layout().total()) * 1.05;
  auto gib = [](double b) { return fixed(b / (1 << 30), 2) + " GiB"; };
  if (free_bytes < one)
    throw InputError(opt_.out_dir + ": " + gib(free_bytes) + " free, but one checkpoint of this " +
                     "model needs " + gib(one) + "; free space or choose another `out_dir`");
  const double kept = one * (opt_.keep_checkpoints + 2);  // (+ best.safetensors, as whole)
  if (free_bytes < kept)
    std::cerr << "pretrain: warning: " << opt_.out_dir << " has " << gib(free_bytes)
              << " free; the " << opt_.keep_checkpoints << " kept checkpoints and best.safetensors "
              << "need up to " << gib(kept) << "\n";
}

std::vector<std::vector<float>> Trainer::gather_stages(const std::vector<const float*>& mine,
                                                       bool* tied_equal) const {
  dist::Comm& world = grid_->world();
  const size_t n = model_->layout().total();
  std::vector<std::vector<float>> whole;
  if (grid_->replica() != 0) return whole;
  if (!grid_->first_stage()) {
    for (size_t i = 0; i < mine.size(); ++i)
      world.start_send(mine[i], n * sizeof(float), 0, static_cast<int>(i));
    world.wait_sends();
    return whole;
  }
  const model::ParamLayout all = whole_layout();
  whole.assign(mine.size(), std::vector<float>(all.total()));
  std::vector<float> got;
  for (int s = 0; s < grid_->stages(); ++s) {
    const model::ParamLayout stage(model_->config(), all.heads(), all.sparsity(),
                                   stages_[static_cast<size_t>(s)]);
    got.resize(s > 0 ? stage.total() : 0);
    for (size_t i = 0; i < mine.size(); ++i) {
      if (s > 0)
        world.recv(got.data(), got.size() * sizeof(float), grid_->world_rank(s, 0),
                   static_cast<int>(i));
      const float* from = s > 0 ? got.data() : mine[i];
      for (const model::TensorSpec& t : stage.tensors()) {
        float* to = whole[i].data() + all.find(t.name)->offset;
        if (s > 0 && stage.word_table() == &t) {  // the last stage's copy: the first's, bit for bit
          if (tied_equal && std::memcmp(from + t.offset, to, t.numel * sizeof(float)) != 0)
            *tied_equal = false;
          continue;
        }
        std::copy(from + t.offset, from + t.offset + t.numel, to);
      }
    }
  }
  return whole;
}

void Trainer::write_state(const std::string& path, const json& best) {
  std::vector<float> m_all, v_all;  // the moments gathered on rank 0 under ZeRO-1
  auto [m, v] = stepper_->whole_moments(m_all, v_all);
  std::vector<float> widened;  // the weights in fp32 under 16-bit master weights
  const float* w = model_->weights_fp32(widened);
  // Pipeline stages: the whole model's, gathered on rank 0 by tensor name.
  bool tied_equal = true;
  const std::vector<std::vector<float>> whole = grid_->pipelined()
                                                    ? gather_stages({w, m, v}, &tied_equal)
                                                    : std::vector<std::vector<float>>();
  if (!whole.empty()) w = whole[0].data(), m = whole[1].data(), v = whole[2].data();
  const model::ParamLayout L = grid_->pipelined() ? whole_layout() : model_->layout();
  // (never a silent wrong result: the two stages' copies of the tied word table must agree)
  double split = tied_equal ? 0 : 1;
  comm_.allreduce_max(&split, 1);
  if (split)
    throw SharedError("step " + std::to_string(step_) +
                      ": the first and last pipeline stage's copies of the tied word table "
                      "differ; no checkpoint written (a bug: please report it)");
  double bad = comm_.root() && (!all_finite(w, L.total()) || !all_finite(m, L.total()) ||
                                !all_finite(v, L.total()));
  comm_.allreduce_max(&bad, 1);        // every rank learns rank 0's verdict
  if (bad && !best.is_null()) return;  // (a best state is only ever a finite one)
  if (bad)
    throw InputError("step " + std::to_string(step_) +
                     ": parameters or optimizer moments are not finite; no checkpoint written" +
                     (saved_step_ >= 0 ? " (the one of step " + std::to_string(saved_step_) +
                                             " in " + checkpoint_path() + " is unchanged)"
                                       : ""));
  if (!comm_.root()) return;
  std::vector<io::TensorToWrite> tensors = weight_and_moment_tensors(L, w, m, v);
  const model::OwnedTensors patterns = model::pattern_tensors(*model_);
  tensors.insert(tensors.end(), patterns.tensors.begin(), patterns.tensors.end());
  json state = training_state().to_json();
  if (!best.is_null()) state["best"] = best;
  clear_earlier_run();
  if (best.is_null() && opt_.keep_checkpoints > 1 && saved_step_ >= 0 && saved_step_ != step_ &&
      fs::exists(checkpoint_path())) {
    // The checkpoint on disk becomes checkpoint-<its step>.safetensors (a second name for the
    // same file, so it is never absent), then the new one replaces checkpoint.safetensors
    // atomically.
    const std::string earlier = earlier_checkpoint_path(saved_step_);
    std::error_code ec;
    fs::remove(earlier, ec);
    fs::create_hard_link(checkpoint_path(), earlier, ec);
    if (ec) fs::copy_file(checkpoint_path(), earlier, ec);  // (a file system without links)
    if (ec) throw InputError(earlier + ": cannot keep the earlier checkpoint: " + ec.message());
  }
  io::write_safetensors(
      path, tensors,
      {{"config", model::config_to_json(model_->config()).dump()}, {"packbert", state.dump()}});
}

void Trainer::save_checkpoint() {
  write_state(checkpoint_path(), json());
  saved_step_ = step_;
  if (!comm_.root()) return;
  std::vector<std::pair<int64_t, std::string>> earlier = earlier_checkpoints();
  while (earlier.size() > static_cast<size_t>(opt_.keep_checkpoints - 1) ||
         (!earlier.empty() && earlier.back().first >= step_)) {  // (steps past this one: stale)
    const size_t drop = earlier.back().first >= step_ ? earlier.size() - 1 : 0;
    fs::remove(earlier[drop].second);
    earlier.erase(earlier.begin() + static_cast<long>(drop));
  }
  kept_.clear();
  for (const auto& [s, path] : earlier) kept_.push_back(fs::path(path).filename().string());
}

// best.safetensors is the whole state at the best evaluation (weights, moments, counters), kept
// out of the rotation: a run that drifts off slowly, below the divergence factor, can still go
// on from its best point (`--init best.safetensors --init-optimizer carry`).
void Trainer::save_best(const EvalMetrics& e) {
  write_state(best_path(),
              json{{"step", e.step}, {"mlm_loss", e.mlm_loss}, {"mlm_acc", e.mlm_acc}});
}

void Trainer::write_trainer_state() {
  TrainerStateInfo info;
  info.global_step = step_, info.max_steps = opt_.max_steps;
  const uint64_t rows = loader_ ? loader_->rows_per_epoch() : 0;
  info.epoch = static_cast<double>(cursor_.epoch) +
               (rows ? static_cast<double>(cursor_.row) / static_cast<double>(rows) : 0.0);
  info.num_train_epochs = static_cast<int>(std::ceil(info.epoch));
  info.logging_steps = opt_.logging_steps, info.eval_steps = opt_.eval_every;
  info.save_steps = opt_.checkpoint_every, info.train_batch_size = step_rows_;
  info.total_flos = train_flops_;
  if (divergence_.best_eval_step >= 0) {
    info.best_metric = divergence_.best_eval;  // (the lowest held-out MLM loss: eval_loss)
    info.best_global_step = divergence_.best_eval_step;
    info.best_model_checkpoint = best_path();
  }
  log_.flush();
  const std::string metrics = opt_.out_dir + "/metrics.jsonl";
  io::write_file_atomic(
      opt_.out_dir + "/trainer_state.json",
      trainer_state(info, fs::exists(metrics) ? io::read_file(metrics) : "").dump(2) + "\n");
}

}  // namespace packbert::train
