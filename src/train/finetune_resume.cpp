#include "train/finetune_resume.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "dist/comm.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "io/paths.h"
#include "model/weights.h"
#include "train/checkpoint.h"
#include "train/model_files.h"
#include "train/trainer_state.h"

namespace packbert::train {

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
          {"max_steps", o.max_steps},
          {"warmup_ratio", o.warmup_ratio ? nlohmann::json(*o.warmup_ratio) : nlohmann::json()},
          {"eval_steps", o.eval_steps},
          {"early_stopping_patience", o.early_stopping_patience},
          {"early_stopping_threshold", o.early_stopping_threshold},
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

namespace {

// Each evaluation's scores, by task.
nlohmann::json dev_scores_json(const FinetuneResult& r) {
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

}  // namespace

nlohmann::json dev_results(const FinetuneResult& r) {
  nlohmann::json out = dev_scores_json(r);
  for (size_t e = 0; e < out.size() && e < r.dev_steps.size(); ++e)
    out[e]["at_step"] = r.dev_steps[e], out[e]["at_epoch"] = r.dev_epochs[e];
  return out;
}

void restore_dev_results(const nlohmann::json& j, FinetuneTask task, FinetuneResult& r) {
  // (NaN, a constant side's correlation, is written as null)
  auto number = [](const nlohmann::json& v) {
    return v.is_null() ? std::nan("") : v.get<double>();
  };
  for (const nlohmann::json& e : j) {
    r.dev_steps.push_back(e.value("at_step", int64_t{0}));
    r.dev_epochs.push_back(e.value("at_epoch", 0.0));
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

std::string run_records(const FinetuneOptions& o, std::ostream& log) {
  log.flush();
  const std::string metrics = o.out_dir + "/metrics.jsonl";
  return std::filesystem::exists(metrics) ? io::read_file(metrics) : std::string();
}

void save_resume(const FinetuneOptions& o, model::BertModel& m, Stepper& stepper,
                 const nlohmann::json& identity, const FinetuneResult& res, const FinetunePlace& at,
                 const std::string& records) {
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
  st["metrics"] = records;
  io::write_safetensors(
      o.resume_path, weight_and_moment_tensors(m.layout(), w, mm, vv),
      {{"config", model::config_to_json(m.config()).dump()}, {"packbert", st.dump()}});
}

size_t evaluations(const FinetuneResult& res) {
  return res.dev_squad.size() + res.dev_scores.size() + res.dev_regression.size();
}

int best_evaluation(const FinetuneOptions& o, const FinetuneResult& res) {
  const size_t n = evaluations(res);
  if (o.save_best.empty()) return -1;
  int best = -1;
  double best_value = 0;
  for (size_t e = 0; e < n; ++e) {
    const double v = dev_metric(res, o.save_best, e);
    if (best < 0 || (std::isnan(best_value) && !std::isnan(v)) || v > best_value)
      best = static_cast<int>(e), best_value = v;
  }
  return best;
}

int evaluations_without_improvement(const FinetuneOptions& o, const FinetuneResult& res) {
  const size_t n = evaluations(res);
  if (o.save_best.empty()) return 0;
  std::optional<double> best;
  int count = 0;
  for (size_t e = 0; e < n; ++e) {
    const double v = dev_metric(res, o.save_best, e);
    if (std::isnan(v)) {
      ++count;
      continue;
    }
    if (!best || (v > *best && v - *best > o.early_stopping_threshold))
      count = 0;
    else
      ++count;
    if (!best || v > *best) best = v;
  }
  return count;
}

bool early_stopping_reached(const FinetuneOptions& o, const FinetuneResult& res) {
  return o.early_stopping_patience > 0 &&
         evaluations_without_improvement(o, res) >= o.early_stopping_patience;
}

void keep_if_best(const FinetuneOptions& o, const model::BertModel& m, const FinetuneResult& res,
                  std::ostream& log) {
  const size_t n = evaluations(res);
  if (o.save_best.empty() || n == 0 || best_evaluation(o, res) != static_cast<int>(n) - 1) return;
  if (!dist::Comm::world().root()) return;
  std::vector<float> widened;
  io::write_safetensors(o.best_path, model::weight_tensors(m.layout(), m.weights_fp32(widened)),
                        {{"config", model::config_to_json(m.config()).dump()}});
  log << nlohmann::json{{"type", "best"},        {"epoch", json_epoch(res.dev_epochs.back())},
                        {"evaluation", n},       {"step", res.steps},
                        {"metric", o.save_best}, {"value", dev_metric(res, o.save_best, n - 1)}}
             .dump()
      << std::endl;
}

nlohmann::json json_epoch(double epoch) {
  return epoch == std::floor(epoch) ? nlohmann::json(static_cast<int64_t>(epoch))
                                    : nlohmann::json(epoch);
}

const model::BertModel& published_model(const FinetuneOptions& o, const model::BertModel& m,
                                        std::unique_ptr<model::BertModel>& best) {
  if (o.save_best.empty() || !std::filesystem::exists(o.best_path)) return m;
  best = std::make_unique<model::BertModel>(m.config(), m.layout().heads());
  model::load_model_weights(*best, io::SafetensorsFile::read(o.best_path));
  return *best;
}

namespace {

// A model directory: the HF files and, for a classifier, labels.json ({name: id}).
void write_task_model(const model::BertModel& m, const std::string& dir, const ModelFiles& files) {
  write_model_files(m, dir, files);
  if (files.label_names.empty()) return;
  nlohmann::json lj = nlohmann::json::object();
  for (size_t id = 0; id < files.label_names.size(); ++id) lj[files.label_names[id]] = id;
  io::write_file_atomic(dir + "/labels.json", lj.dump(1) + "\n");
}

}  // namespace

ModelFiles task_model_files(const FinetuneOptions& o, const data::Casing& casing,
                            const std::vector<std::string>& names) {
  ModelFiles files;
  files.vocab = o.vocab, files.lower_case = casing.lower_case, files.label_names = names;
  return files;
}

void save_checkpoint_dir(const FinetuneOptions& o, const model::BertModel& m,
                         const ModelFiles& files, const FinetuneResult& res,
                         const FinetunePlace& at, const RunLength& length,
                         const std::string& records) {
  if (o.keep_checkpoints <= 0 || !dist::Comm::world().root()) return;
  io::make_output_dir(o.checkpoints_dir, "`keep_checkpoints`'s directory");
  const std::string name = "checkpoint-" + std::to_string(res.steps);
  io::StagedDirectory dir(o.checkpoints_dir + "/" + name, "`keep_checkpoints`", true);
  write_task_model(m, dir.path(), files);
  TrainerStateInfo info;
  info.global_step = res.steps, info.max_steps = length.max_steps;
  info.epoch = at.epoch + static_cast<double>(at.step_in_epoch) /
                              static_cast<double>(std::max<int64_t>(1, length.steps_per_epoch));
  info.num_train_epochs = length.epochs;
  info.logging_steps = o.logging_steps, info.eval_steps = o.eval_steps;
  info.save_steps = o.checkpoint_every, info.train_batch_size = o.loop.rows_per_batch;
  info.total_flos = at.train_flops;
  const int best = best_evaluation(o, res);
  if (best >= 0) {
    info.best_metric = dev_metric(res, o.save_best, static_cast<size_t>(best));
    if (std::isnan(*info.best_metric)) info.best_metric.reset();
    info.best_global_step = res.dev_steps[static_cast<size_t>(best)];
    info.best_model_checkpoint =
        o.final_dir + "/checkpoint-" + std::to_string(*info.best_global_step);
  }
  io::write_file_atomic(dir.path() + "/trainer_state.json",
                        trainer_state(info, records).dump(2) + "\n");
  dir.publish();
  // The latest keep_checkpoints and the best evaluation's stay (HF's save_total_limit).
  const auto kept = checkpoints_in(o.checkpoints_dir, "", true);
  const int64_t best_step = info.best_global_step.value_or(-1);
  int64_t newer = 0;
  for (auto it = kept.rbegin(); it != kept.rend(); ++it, ++newer)
    if (newer >= o.keep_checkpoints && it->first != best_step)
      std::filesystem::remove_all(it->second);
}

void move_checkpoints(const FinetuneOptions& o) {
  if (o.keep_checkpoints <= 0 || !std::filesystem::is_directory(o.checkpoints_dir)) return;
  for (const auto& [step, path] : checkpoints_in(o.checkpoints_dir, "", true))
    std::filesystem::rename(
        path, std::filesystem::path(o.final_dir) / std::filesystem::path(path).filename());
  std::filesystem::remove_all(o.checkpoints_dir);
}

void write_published(const FinetuneOptions& o, const model::BertModel& m,
                     const data::Casing& casing, const std::vector<std::string>& names) {
  if (!dist::Comm::world().root()) return;
  std::unique_ptr<model::BertModel> best;
  write_task_model(published_model(o, m, best), o.out_dir, task_model_files(o, casing, names));
}

}  // namespace packbert::train
