#include "train/finetune_resume.h"

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

const model::BertModel& published_model(const FinetuneOptions& o, const model::BertModel& m,
                                        std::unique_ptr<model::BertModel>& best) {
  if (o.save_best.empty() || !std::filesystem::exists(o.best_path)) return m;
  best = std::make_unique<model::BertModel>(m.config(), m.layout().heads());
  model::load_model_weights(*best, io::SafetensorsFile::read(o.best_path));
  return *best;
}

void write_published(const FinetuneOptions& o, const model::BertModel& m,
                     const data::Casing& casing, const std::vector<std::string>& names) {
  if (!dist::Comm::world().root()) return;
  std::unique_ptr<model::BertModel> best;
  ModelFiles files;
  files.vocab = o.vocab, files.lower_case = casing.lower_case, files.label_names = names;
  write_model_files(published_model(o, m, best), o.out_dir, files);
}

}  // namespace packbert::train
