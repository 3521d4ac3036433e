#include "train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "error.h"
#include "io/atomic_file.h"
#include "io/paths.h"
#include "model/weights.h"

namespace packbert::train {

using json = nlohmann::json;

bool DivergenceGuard::train_diverged(double loss, double factor) {
  if (!std::isfinite(loss)) return false;  // (non-finite losses are `nan_abort`'s)
  train_ema = train_steps ? 0.9 * train_ema + 0.1 * loss : loss;
  ++train_steps;
  if (train_steps == 1 || train_ema < lowest_train_ema) lowest_train_ema = train_ema;
  return factor > 0 && train_steps > kWarmup && train_ema > factor * lowest_train_ema;
}

namespace {

model::Sparsity sparsity_of(const json& record) {
  if (!record.is_object()) return {};
  return {record.value("block", 0), record.value("sparsity", 0.0)};
}

}  // namespace

model::Sparsity TrainingState::block_sparsity() const {
  return sparsity_of(sparsity);
}

json TrainingState::to_json() const {
  json j = stepper;
  j.update({{"format", "packbert.checkpoint"},
            {"version", 1},
            {"step", step},
            {"optimizer", optimizer},
            {"cursor_epoch", cursor.epoch},
            {"cursor_row", cursor.row},
            {"sequences_checksum", sequences_checksum},
            {"packed", packed},
            {"one_per_row", one_per_row},
            {"precision", precision},
            {"backend", backend},
            {"master_weights", master_weights},
            {"rows_per_batch", rows_per_batch},
            {"processes", processes},
            {"elapsed", elapsed},
            {"loss_scaling", loss_scaling},
            {"train_flops", train_flops}});
  if (seed) j["seed"] = *seed;
  if (divergence)
    j["divergence"] = {{"train_ema", divergence->train_ema},
                       {"lowest_train_ema", divergence->lowest_train_ema},
                       {"train_steps", divergence->train_steps},
                       {"best_eval", divergence->best_eval},
                       {"best_eval_step", divergence->best_eval_step}};
  if (!init.empty()) j["init"] = init;
  if (sparsity.is_object()) j["sparsity"] = sparsity;
  return j;
}

TrainingState TrainingState::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where + ": its 'packbert' metadata is not an object");
  TrainingState s;
  s.step = j.value("step", int64_t{0});
  s.optimizer = j.value("optimizer", std::string());
  s.cursor = {j.value("cursor_epoch", uint64_t{0}), j.value("cursor_row", uint64_t{0})};
  s.sequences_checksum = j.value("sequences_checksum", uint64_t{0});
  s.packed = j.value("packed", false);
  s.one_per_row = j.value("one_per_row", false);
  s.precision = j.value("precision", std::string("fp32"));
  s.master_weights = j.value("master_weights", std::string("fp32"));
  s.loss_scaling = j.value("loss_scaling", std::string("off"));
  s.backend = j.value("backend", std::string("cpu"));
  s.rows_per_batch = j.value("rows_per_batch", int64_t{0});
  s.processes = j.value("processes", 1);
  if (j.contains("seed") && j["seed"].is_number_unsigned()) s.seed = j["seed"].get<uint64_t>();
  s.elapsed = j.value("elapsed", 0.0);
  s.train_flops = j.value("train_flops", 0.0);
  if (j.contains("divergence")) {
    const json& d = j["divergence"];
    s.divergence = DivergenceGuard{};
    s.divergence->train_ema = d.at("train_ema").get<double>();
    s.divergence->lowest_train_ema = d.at("lowest_train_ema").get<double>();
    s.divergence->train_steps = d.at("train_steps").get<int64_t>();
    s.divergence->best_eval = d.at("best_eval").get<double>();
    s.divergence->best_eval_step = d.at("best_eval_step").get<int64_t>();
  }
  s.init = j.value("init", std::string());
  if (j.contains("sparsity")) s.sparsity = j["sparsity"];
  for (const char* key : {"optimizer_steps", "recent_grad_norms", "accepted_steps", "outlier_skips",
                          "loss_scale", "loss_scale_clean", "loss_scale_overflows"})
    if (j.contains(key)) s.stepper[key] = j[key];
  return s;
}

TrainingState TrainingState::read(const io::SafetensorsFile& f) {
  json j;
  try {
    j = json::parse(f.metadata().at("packbert"));
  } catch (const std::exception&) {
    throw InputError(f.source() + ": not a packbert training checkpoint (no 'packbert' metadata)");
  }
  return from_json(j, f.source());
}

void TrainingState::check_resumable(const ResumeRequest& now, const std::string& where) const {
  const LoopOptions& lo = now.loop;
  const std::string at = where + ": ";
  if (!optimizer.empty() && optimizer != optimizer_name(lo.optimizer.kind))
    throw InputError(at + "was trained with `optimizer` " + optimizer +
                     "; resume needs the same, " + "not " + optimizer_name(lo.optimizer.kind));
  if (seed && *seed != lo.seed)
    throw InputError(at + "was trained with `seed` " + std::to_string(*seed) +
                     "; resume needs the same (bit-exact resume), not " + std::to_string(lo.seed));
  if (!now.init.empty() && (init.empty() || !(init == now.init || io::same_file(init, now.init))))
    throw InputError(at + "its run started from " + (init.empty() ? "no `init`" : init) +
                     "; `resume` continues it, so `init` " + now.init +
                     " would be ignored: drop `init`");
  if (sequences_checksum != now.sequences_checksum)
    throw InputError(at + "was trained on another sequences file than " + now.sequences);
  if (packed != now.packed || one_per_row != now.one_per_row)
    throw InputError(at +
                     "resume needs the same layout (`packs`, `one_per_row`) as the run that "
                     "wrote it");
  if (rows_per_batch != now.rows_per_batch)
    throw InputError(at + "its run used " + std::to_string(rows_per_batch) +
                     " rows per micro-batch (processes, or pipeline replicas, x `rows_per_batch`); "
                     "resume needs the "
                     "same, not " +
                     std::to_string(now.processes) + " x " + std::to_string(lo.rows_per_batch));
  auto same = [&](const std::string& was, const std::string& is, const char* field) {
    if (was != is)
      throw InputError(at + "was trained with `" + field + "` " + was +
                       "; resume needs the same (bit-exact resume), not " + is);
  };
  same(precision, model::precision_name(lo.precision), "precision");
  same(master_weights, masters_name(lo.optimizer.masters), "masters");
  same(loss_scaling, loss_scaling_name(lo.loss_scaling), "loss_scale");
  if (!(block_sparsity() == now.sparsity))
    throw InputError(at + "was trained with " + sparsity_text(block_sparsity()) +
                     "; resume needs the same, not " + sparsity_text(now.sparsity));
  if (now.max_steps <= step)
    throw InputError(at + "is already at step " + std::to_string(step) + ", and `max_steps` " +
                     std::to_string(now.max_steps) +
                     " is not past it: nothing to train (give `max_steps` above " +
                     std::to_string(step) + " to train on)");
}

model::BertConfig checkpoint_config(const io::SafetensorsFile& f) {
  auto it = f.metadata().find("config");
  if (it == f.metadata().end()) throw InputError(f.source() + ": no 'config' in the metadata");
  try {
    return model::config_from_json(json::parse(it->second), f.source() + " (config)");
  } catch (const json::exception&) {
    throw InputError(f.source() + ": metadata 'config' is not valid JSON");
  }
}

model::Sparsity sparsity_of(const io::SafetensorsFile& f) {
  auto it = f.metadata().find("packbert");
  if (it == f.metadata().end()) return {};
  const json j = json::parse(it->second, nullptr, false);
  return j.is_object() && j.contains("sparsity") ? sparsity_of(j["sparsity"]) : model::Sparsity{};
}

std::string sparsity_text(const model::Sparsity& s) {
  if (!s.on()) return "dense weights";
  std::ostringstream out;
  out << "`block` " << s.block << " `sparsity` " << s.sparsity;
  return out.str();
}

std::vector<io::TensorToWrite> weight_and_moment_tensors(const model::ParamLayout& layout,
                                                         const float* weights, const float* m,
                                                         const float* v) {
  std::vector<io::TensorToWrite> tensors = model::weight_tensors(layout, weights);
  auto mt = model::weight_tensors(layout, m, "optimizer.m.");
  auto vt = model::weight_tensors(layout, v, "optimizer.v.");
  tensors.insert(tensors.end(), mt.begin(), mt.end());
  tensors.insert(tensors.end(), vt.begin(), vt.end());
  return tensors;
}

void save_stepper_state(Stepper& stepper, json& state) {
  state["optimizer_steps"] = stepper.optimizer().steps();
  state["recent_grad_norms"] = stepper.guard().recent;
  state["accepted_steps"] = stepper.guard().accepted;
  state["outlier_skips"] = stepper.outlier_skips();
  state["loss_scale"] = stepper.scaler().scale;
  state["loss_scale_clean"] = stepper.scaler().clean;
  state["loss_scale_overflows"] = stepper.scaler().overflows;
}

void load_stepper_state(Stepper& stepper, const model::ParamLayout& layout,
                        const io::SafetensorsFile& file, const json& state) {
  for (const model::TensorSpec& t : layout.tensors()) {  // (this rank's shard of each)
    const std::vector<int64_t> shape = t.stored_shape();
    stepper.optimizer().set_moments(t, file.floats("optimizer.m." + t.name, &shape).data(),
                                    file.floats("optimizer.v." + t.name, &shape).data());
  }
  stepper.optimizer().set_steps(state.at("optimizer_steps").get<int64_t>());
  if (!state.contains("recent_grad_norms")) return;
  GradNormGuard& guard = stepper.guard();
  guard.recent = state.at("recent_grad_norms").get<std::vector<double>>();
  guard.accepted = state.at("accepted_steps").get<int64_t>();
  stepper.set_outlier_skips(state.at("outlier_skips").get<int64_t>());
  LossScaler& scaler = stepper.scaler();
  scaler.scale = state.value("loss_scale", scaler.scale);
  scaler.clean = state.value("loss_scale_clean", int64_t{0});
  scaler.overflows = state.value("loss_scale_overflows", int64_t{0});
  if (guard.recent.size() != static_cast<size_t>(GradNormGuard::kWindow))
    throw InputError(file.source() + ": recent_grad_norms has " +
                     std::to_string(guard.recent.size()) + " entries, expected " +
                     std::to_string(GradNormGuard::kWindow));
}

// Keeps the metrics records of steps up to `step` (a resumed run writes the later ones again).
void truncate_metrics(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return;
  std::string kept, line;
  std::ifstream in(path);
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    json r = json::parse(line, nullptr, false);
    if (r.is_discarded() || !r.contains("step") || !r["step"].is_number_integer()) {
      if (in.eof()) break;  // a last line cut short by a kill: drop it
      throw InputError(path + ":" + std::to_string(line_no) + ": not a metrics record");
    }
    if (r["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  io::write_file_atomic(path, kept);
}

std::vector<std::pair<int64_t, std::string>> checkpoints_in(const std::string& dir,
                                                            const std::string& suffix,
                                                            bool directories) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() != directories || !name.starts_with("checkpoint-") ||
        !name.ends_with(suffix))
      continue;
    const std::string digits = name.substr(11, name.size() - 11 - suffix.size());
    if (digits.empty() || digits.size() > 18 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      continue;
    out.push_back({std::stoll(digits), e.path().string()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_run_output(const std::string& name) {
  if (name == "checkpoint.safetensors" || name == "best.safetensors" || name == "metrics.jsonl" ||
      name == "trainer_state.json")
    return true;
  return name.starts_with("checkpoint-") && name.ends_with(".safetensors");
}

}  // namespace packbert::train
