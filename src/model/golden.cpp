#include "model/golden.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "error.h"
#include "io/safetensors.h"
#include "model/bert.h"
#include "model/weights.h"

namespace packbert::model {

bool GoldenReport::ok() const {
  return std::all_of(rows.begin(), rows.end(), [](const GoldenRow& r) { return r.ok(); });
}

const GoldenRow& GoldenReport::worst_grad() const {
  const GoldenRow* worst = nullptr;
  for (const GoldenRow& r : rows)
    if (r.quantity.rfind("grad.", 0) == 0 && (!worst || r.error > worst->error)) worst = &r;
  return worst ? *worst : rows.front();
}

// The golden file's model config (dropout off: the golden is deterministic).
BertConfig golden_config(const io::SafetensorsFile& f, const std::string& path) {
  auto meta = f.metadata().find("config");
  if (meta == f.metadata().end()) throw InputError(path + ": no 'config' in the metadata");
  nlohmann::json cj;
  try {
    cj = nlohmann::json::parse(meta->second);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": metadata 'config' is not valid JSON");
  }
  BertConfig config = config_from_json(cj, path + " (config)");
  config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0;
  return config;
}

// The golden file's batch: [B, S] ids, types, positions, sequence ids and MLM labels, [B, K] NSP
// labels.
PackedBatch golden_batch(const io::SafetensorsFile& f, const std::string& path) {
  PackedBatch b;
  const io::TensorEntry& ids = f.entry("input_ids");
  const io::TensorEntry& nsp = f.entry("nsp_labels");
  if (ids.shape.size() != 2 || nsp.shape.size() != 2 || nsp.shape[0] != ids.shape[0])
    throw InputError(path + ": input_ids must be [B, S] and nsp_labels [B, K]");
  b.B = static_cast<int>(ids.shape[0]);
  b.S = static_cast<int>(ids.shape[1]);
  b.K = static_cast<int>(nsp.shape[1]);
  for (const char* name :
       {"input_ids", "token_type_ids", "position_ids", "sequence_ids", "mlm_labels"})
    if (f.entry(name).shape != ids.shape)
      throw InputError(path + ": tensor '" + name + "' must have the shape of input_ids");
  b.input_ids = f.ints("input_ids");
  b.token_type_ids = f.ints("token_type_ids");
  b.position_ids = f.ints("position_ids");
  b.sequence_ids = f.ints("sequence_ids");
  b.mlm_labels = f.ints("mlm_labels");
  b.nsp_labels = f.ints("nsp_labels");
  // A task head's golden: its targets per sequence.
  if (f.has("class_labels")) b.class_labels = f.ints("class_labels");
  if (f.has("span_starts")) {
    b.span_starts = f.ints("span_starts");
    b.span_ends = f.ints("span_ends");
  }
  return b;
}

Heads golden_heads(const io::SafetensorsFile& f) {
  Heads h;
  h.classifier = f.has("class_labels");
  h.span = f.has("span_starts");
  h.pretraining = !h.classifier && !h.span;
  return h;
}

GoldenReport check_golden(const std::string& path, double rtol_loss, double rtol_grad,
                          const Recompute& recompute, Precision precision, double loss_scale,
                          kernels::BackendKind backend) {
  io::SafetensorsFile f = io::SafetensorsFile::read(path);
  const Heads heads = golden_heads(f);
  BertModel model(golden_config(f, path), heads);
  model.set_backend(backend);
  load_weights(model.layout(), model.params().data(), f);
  const PackedBatch b = golden_batch(f, path);
  if (recompute.automatic)
    throw InputError("check-golden: `recompute` auto has no memory to fit; name a policy");
  Outputs out = model.forward(b, StepOptions{false, 0, 0, recompute, precision, loss_scale});
  model.zero_grads();
  model.backward();

  GoldenReport report;
  auto loss_row = [&](const char* name, double ours) {
    std::vector<float> want = f.floats(std::string("expected.") + name);
    if (want.size() != 1) throw InputError(path + ": expected." + name + " must be a scalar");
    double err = std::abs(ours - want[0]) / std::max(std::abs(static_cast<double>(want[0])), 1e-30);
    report.rows.push_back({name, err, rtol_loss});
  };
  if (heads.pretraining) {
    loss_row("mlm_loss", out.mlm_loss);
    loss_row("nsp_loss", out.nsp_loss);
  }
  if (heads.classifier) loss_row("cls_loss", out.cls_loss);
  if (heads.span) loss_row("span_loss", out.span_loss);
  std::vector<std::vector<float>> want;
  double global_ref = 0;
  for (const TensorSpec& t : model.layout().tensors()) {
    want.push_back(f.floats("grad." + t.name, &t.shape));
    for (float v : want.back()) global_ref = std::max(global_ref, std::abs(static_cast<double>(v)));
  }
  for (size_t k = 0; k < want.size(); ++k) {
    const TensorSpec& t = model.layout().tensors()[k];
    const float* ours = model.grads().data() + t.offset;
    double max_diff = 0, max_ref = 0, diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < t.numel; ++i) {
      const double d = static_cast<double>(ours[i]) / loss_scale - want[k][i], r = want[k][i];
      max_diff = std::max(max_diff, std::abs(d));
      max_ref = std::max(max_ref, std::abs(r));
      diff2 += d * d;
      ref2 += r * r;
    }
    if (is_16bit(precision)) {  // normwise: ||ours - theirs|| / ||theirs||
      const double scale = std::max(std::sqrt(ref2), 1e-3 * global_ref);
      report.rows.push_back({"grad." + t.name, std::sqrt(diff2) / scale, rtol_grad});
      continue;
    }
    // A tensor whose true gradient is zero (e.g. the key bias: softmax ignores a shift shared by
    // all keys) is judged against 1e-3 of the model's largest gradient instead of its own.
    double scale = std::max(max_ref, 1e-3 * global_ref);
    report.rows.push_back({"grad." + t.name, scale > 0 ? max_diff / scale : max_diff, rtol_grad});
  }
  return report;
}

}  // namespace packbert::model
