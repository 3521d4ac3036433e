#include "train/metrics.h"

#include <nlohmann/json.hpp>

namespace packbert::train {

namespace {

double ratio(int64_t hits, int64_t count) {
  return count ? static_cast<double>(hits) / static_cast<double>(count) : 0.0;
}

}  // namespace

void StepMetrics::take(const StepResult& r) {
  loss = r.loss(), lr = r.lr, grad_norm = r.grad_norm;
  mlm_loss = r.mlm_loss, nsp_loss = r.nsp_loss;
  mlm_acc = ratio(r.mlm_correct, r.mlm_count), nsp_acc = ratio(r.nsp_correct, r.nsp_count);
  cls_loss = r.cls_loss, cls_acc = ratio(r.cls_correct, r.cls_count), span_loss = r.span_loss;
  real_tokens = r.real_tokens, sequences = r.sequences;
  skipped = r.skipped, skip_reason = r.skip_reason, loss_scale = r.loss_scale;
  imbalance = r.imbalance, comm_seconds = r.comm_seconds;
  stage_wait_seconds = r.stage_wait_seconds;
}

StepMetrics StepMetrics::of(const StepResult& r, const model::Heads& heads, Stepper& stepper,
                            const LoopOptions& o, int processes) {
  StepMetrics s;
  s.heads = heads;
  s.take(r);
  s.outlier_skips = stepper.outlier_skips();
  s.loss_scaling = o.loss_scaling.on();
  s.loss_scale_overflows = stepper.scaler().overflows;
  s.processes = processes;
  return s;
}

nlohmann::json StepMetrics::to_json() const {
  nlohmann::json line{{"type", "step"},
                      {"step", step},
                      {"loss", loss},
                      {"lr", lr},
                      {"grad_norm", grad_norm},
                      {"real_tokens", real_tokens},
                      {"sequences", sequences},
                      {"seconds", seconds},
                      {"elapsed", elapsed},
                      {"skipped", skipped},
                      {"skip_reason", skip_reason},
                      {"outlier_skips", outlier_skips},
                      {"train_flops", train_flops}};
  if (epoch > 0) line["epoch"] = epoch;
  if (heads.pretraining) {
    line["mlm_loss"] = mlm_loss, line["nsp_loss"] = nsp_loss;
    line["mlm_acc"] = mlm_acc, line["nsp_acc"] = nsp_acc;
  }
  if (heads.classifier) line["cls_loss"] = cls_loss;
  if (heads.classifier && !regression) line["acc"] = cls_acc;
  if (heads.span) line["span_loss"] = span_loss;
  if (loss_scaling) {
    line["loss_scale"] = loss_scale;
    line["loss_scale_overflows"] = loss_scale_overflows;
  }
  if (pattern_update) {
    line["blocks_moved"] = blocks_moved;
    line["churn"] = churn;
  }
  if (processes > 1) {
    line["processes"] = processes;
    line["imbalance"] = imbalance;
    line["comm_seconds"] = comm_seconds;
  }
  if (!stage_wait_seconds.empty()) {
    line["stage_wait_seconds"] = stage_wait_seconds;
    double mean = 0;
    for (double w : stage_wait_seconds) mean += w / static_cast<double>(stage_wait_seconds.size());
    line["bubble"] = seconds > 0 ? mean / seconds : 0.0;
  }
  return line;
}

nlohmann::json EvalMetrics::to_json() const {
  return {{"type", "eval"},         {"step", step},         {"mlm_loss", mlm_loss},
          {"mlm_acc", mlm_acc},     {"nsp_loss", nsp_loss}, {"nsp_acc", nsp_acc},
          {"mlm_count", mlm_count}, {"elapsed", elapsed},   {"eval_seconds", eval_seconds}};
}

}  // namespace packbert::train
