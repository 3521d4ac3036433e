#include "train/trainer_state.h"

#include <sstream>

namespace packbert::train {

namespace {

// packbert's evaluation fields under the names HF's metrics give them (after "eval_").
std::string eval_name(const std::string& key) {
  static const std::pair<const char*, const char*> kNames[] = {{"dev_acc", "accuracy"},
                                                               {"dev_f1", "f1"},
                                                               {"dev_mcc", "matthews_correlation"},
                                                               {"dev_pearson", "pearson"},
                                                               {"dev_spearman", "spearmanr"},
                                                               {"dev_mse", "mse"},
                                                               {"mlm_loss", "loss"},
                                                               {"mlm_acc", "mlm_accuracy"},
                                                               {"eval_seconds", "runtime"},
                                                               {"has_ans_exact", "HasAns_exact"},
                                                               {"has_ans_f1", "HasAns_f1"},
                                                               {"no_ans_exact", "NoAns_exact"},
                                                               {"no_ans_f1", "NoAns_f1"}};
  for (auto [ours, theirs] : kNames)
    if (key == ours) return theirs;
  return key;
}

}  // namespace

nlohmann::json log_history_entry(const nlohmann::json& r, int64_t logging_steps,
                                 int64_t last_step) {
  if (!r.is_object() || !r.contains("step") || !r["step"].is_number_integer()) return nullptr;
  const int64_t step = r["step"].get<int64_t>();
  const std::string type = r.value("type", std::string());
  nlohmann::json e = nlohmann::json::object();
  if (r.contains("epoch") && r["epoch"].is_number()) e["epoch"] = r["epoch"];
  if (type == "step") {
    if (!(logging_steps > 0 && step % logging_steps == 0) && step != last_step) return nullptr;
    for (const char* k : {"loss", "grad_norm"})
      if (r.contains(k) && r[k].is_number()) e[k] = r[k];
    if (r.contains("lr")) e["learning_rate"] = r["lr"];
  } else if (type == "eval") {
    for (const auto& [key, value] : r.items())
      if (value.is_number() && key != "step" && key != "epoch" && key != "elapsed")
        e["eval_" + eval_name(key)] = value;
  } else {
    return nullptr;
  }
  e["step"] = step;
  return e;
}

nlohmann::json trainer_state(const TrainerStateInfo& info, const std::string& metrics_jsonl) {
  nlohmann::json history = nlohmann::json::array();
  std::istringstream in(metrics_jsonl);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    if (r.is_discarded() || !r.is_object()) continue;
    if (r.value("step", int64_t{0}) > info.global_step) continue;
    nlohmann::json e = log_history_entry(r, info.logging_steps, info.global_step);
    if (!e.is_null()) history.push_back(std::move(e));
  }
  auto optional = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  return {{"best_global_step", optional(info.best_global_step)},
          {"best_metric", optional(info.best_metric)},
          {"best_model_checkpoint", info.best_model_checkpoint.empty()
                                        ? nlohmann::json()
                                        : nlohmann::json(info.best_model_checkpoint)},
          {"epoch", info.epoch},
          {"eval_steps", info.eval_steps},
          {"global_step", info.global_step},
          {"is_hyper_param_search", false},
          {"is_local_process_zero", true},
          {"is_world_process_zero", true},
          {"log_history", history},
          {"logging_steps", info.logging_steps},
          {"max_steps", info.max_steps},
          {"num_input_tokens_seen", 0},
          {"num_train_epochs", info.num_train_epochs},
          {"save_steps", info.save_steps},
          {"stateful_callbacks", nlohmann::json::object()},
          {"total_flos", info.total_flos},
          {"train_batch_size", info.train_batch_size},
          {"trial_name", nullptr},
          {"trial_params", nullptr}};
}

}  // namespace packbert::train
